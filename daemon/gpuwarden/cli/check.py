"""``gpuwarden check`` (validate the config and playbooks, print an inventory), ``gpuwarden
drill`` (rehearse them against a scenario on a simulated clock) and ``gpuwarden schema``."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuwarden import config
from gpuwarden.cli.cloud import credential_warnings
from gpuwarden.cli.common import (
    add_replay_options,
    config_path,
    duration,
    load_config,
    playbook_paths,
    replay_options,
)
from gpuwarden.errors import ExitCode, InputError, Problem, UsageError
from gpuwarden.sources.select import SourceSpec, parse_spec, with_sample


def add_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    check = sub.add_parser(
        "check",
        parents=[common],
        help="validate the config and playbooks and print an inventory",
        description="Validate the config and the playbooks against it. Exit 0 when valid, "
        "1 when not (every problem as file:line:col), 2 on a usage error or when, in mode: "
        "enforce, a rule can act destructively but cannot tell anyone (see --allow-silent).",
    )
    check.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="playbook files or directories (default: the config's playbooks)",
    )
    check.add_argument(
        "--strict",
        action="store_true",
        help="fail (exit 1) on warnings too, such as a kill without select in a host rule "
        "or missing cloud credentials",
    )
    check.add_argument(
        "--allow-silent",
        action="store_true",
        help="in mode: enforce, accept rules that can kill, suspend, cap power, run commands "
        "or launch instances while their notification targets cannot be resolved (else exit 2)",
    )

    drill = sub.add_parser(
        "drill",
        parents=[common],
        help="rehearse the playbooks against a scenario or a log on a simulated clock",
        description="Run a scenario or an nvidia-smi log through the real engine, as fast as "
        "the CPU allows, and print what would happen second by second. Nothing outside this "
        "process is touched.",
    )
    drill.add_argument(
        "scenario",
        metavar="SOURCE",
        help="a scenario file, an nvidia-smi log (FILE.csv), or scenario:FILE / smi-csv:FILE; "
        "@TIME or @#N starts the drill there",
    )
    add_replay_options(drill)
    drill.add_argument(
        "--playbooks",
        action="append",
        metavar="PATH",
        help="playbook file or directory (repeatable; default: the config's)",
    )
    drill.add_argument("--json", action="store_true", help="one JSON object per line")
    drill.add_argument(
        "--notify",
        action="store_true",
        help="really deliver the messages, marked [DRILL], to the config's targets",
    )
    drill.add_argument(
        "--cloud",
        action="store_true",
        help="ask EC2 (DryRun: nothing is launched) whether each provision step would be "
        "allowed: credentials, permissions, parameters",
    )
    drill.add_argument(
        "--html",
        metavar="FILE.html",
        help="also write the drill as one self-contained HTML page (charts, steps, the "
        "messages it would send): docs/reports.md",
    )
    drill.add_argument(
        "--tick",
        type=duration,
        metavar="D",
        help="simulated time between snapshots (default: the config's tick)",
    )


def add_schema(sub: Any, common: argparse.ArgumentParser) -> None:
    sub.add_parser(
        "schema",
        parents=[common],
        help="print the JSON Schema of playbook files (for editors)",
        description="Print the JSON Schema of playbook files, for editor completion.",
    )


def cmd_check(args: argparse.Namespace) -> int:
    from gpuwarden.cli import hardening, inventory, selfcheck
    from gpuwarden.playbook import loader

    found = config_path(args.config)
    try:
        cfg = config.Config() if found is None else config.load(found)
        paths = playbook_paths(args.paths, cfg)
        if not args.paths and not Path(paths[0]).exists():
            raise InputError.at(
                paths[0],
                None,
                None,
                "no such playbook directory",
                hint="name playbook files or directories (gpuwarden check PATH...), "
                "or set playbooks: in the config",
            )
        playbooks = loader.load(paths, cfg)
    except InputError as exc:
        print(exc.render(), file=sys.stderr)
        if found is None:
            print(
                f"note: no config file was read (no --config, no GPUWARDEN_CONFIG, no "
                f"{config.DEFAULT_PATH}): there are no notification targets or cloud "
                "profiles, and the priority classes are the built-in ones",
                file=sys.stderr,
            )
        count = len(exc.problems)
        print(f"check failed: {count} problem{'s' if count != 1 else ''}", file=sys.stderr)
        return ExitCode.FAILURE
    source = str(found) if found else "(none: built-in defaults)"
    print(inventory.render(cfg, source, playbooks))
    silent = silent_rules(cfg, playbooks, str(found) if found else "(built-in config)")
    if silent and cfg.shadow:
        print(
            "shadow mode: nothing is acted on; once armed (mode: enforce), check fails until "
            "these rules can tell someone:"
        )
        for problem in silent:
            print("- " + problem.render().replace("\n", "\n  "))
    elif silent and not args.allow_silent:
        for problem in silent:
            print(problem.render(), file=sys.stderr)
        rules = sum(1 for p in silent if p.line is not None)
        print(
            f"check failed: {rules} rule(s) can act but cannot tell anyone "
            "(exit 2; --allow-silent accepts that)",
            file=sys.stderr,
        )
        return ExitCode.BAD_INPUT
    warnings = [f"{f.detail} — {f.fix}" for f in hardening.review(cfg, found)]
    warnings += [p.render() for p in playbooks.warnings] + credential_warnings(cfg)
    operators = selfcheck.check_operators(cfg)  # run would refuse to start (exit 2)
    if operators is not None and not operators.ok:
        warnings.append(f"{operators.detail} — {operators.fix}")
    if silent and not cfg.shadow:  # --allow-silent: said, and accepted
        warnings += [p.render() for p in silent]
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if warnings and args.strict:
        count = len(warnings)
        print(
            f"check failed: {count} warning{'s' if count != 1 else ''} (--strict)", file=sys.stderr
        )
        return ExitCode.FAILURE
    print(f"ok: {len(playbooks.rules)} rule(s) in {len(playbooks.files)} file(s)")
    return ExitCode.OK


def silent_rules(
    cfg: config.Config,
    playbooks: Any,
    config_file: str,
    urls_of: Callable[[str], list[str]] | None = None,
) -> list[Problem]:
    """The rules that can act destructively (kill, suspend, power_cap, exec, provision), are
    not shadow rules, and would tell nobody: they have no notify step, or a target they notify
    cannot be resolved now (a missing secret). One problem per rule, then one per target that
    cannot be resolved saying why (never the secret itself). The config's mode is the
    caller's business."""
    from gpuwarden.notify.service import resolver
    from gpuwarden.playbook.schema import DESTRUCTIVE_KINDS, NotifyParams

    resolve = urls_of or resolver(cfg)
    why_not: dict[str, str | None] = {}

    def unresolved(target: str) -> str | None:
        if target not in why_not:
            try:
                why_not[target] = None if resolve(target) else "it has no URL"
            except (ValueError, OSError, KeyError) as exc:
                why_not[target] = str(exc).strip("'\"")
        return why_not[target]

    problems: list[Problem] = []
    for rule in playbooks.rules:
        acting = [s.kind for s in rule.steps if s.kind in DESTRUCTIVE_KINDS]
        if rule.spec.mode == "shadow" or not acting:
            continue
        kinds = ", ".join(dict.fromkeys(acting))
        targets = [
            t
            for s in rule.steps
            if isinstance(s.spec.params, NotifyParams)
            for t in s.spec.params.targets
        ]
        if not targets:
            problems.append(
                Problem(
                    rule.file,
                    rule.line,
                    rule.col,
                    f"rule {rule.name!r} can {kinds} and has no notify step: nobody is told",
                    hint="add `- notify: TARGET` as its first step",
                )
            )
        dark = [t for t in dict.fromkeys(targets) if unresolved(t) is not None]
        if dark:
            problems.append(
                Problem(
                    rule.file,
                    rule.line,
                    rule.col,
                    f"rule {rule.name!r} can {kinds}, and its notification target"
                    f"{'s' if len(dark) > 1 else ''} {', '.join(map(repr, dark))} cannot be "
                    "resolved: " + "; ".join(str(unresolved(t)) for t in dark),
                    hint="put the secret in place (gpuwarden doctor names it too); until then "
                    "keep mode: shadow, or accept silent rules with --allow-silent",
                )
            )
    return problems


def cmd_drill(args: argparse.Namespace) -> int:
    from gpuwarden import drill, drill_text
    from gpuwarden.playbook import loader

    spec = with_sample(_drill_spec(args.scenario), args.at_sample)
    options = replay_options(args)
    cfg = load_config(args.config)
    playbooks = loader.load(playbook_paths(args.playbooks, cfg), cfg)
    if args.tick is not None and args.tick <= 0:
        raise UsageError("--tick must be positive")
    if args.cloud and not cfg.cloud.profiles:
        raise UsageError(
            "--cloud: the config has no cloud profiles to ask EC2 about",
            "define them under cloud.profiles, or give the daemon's --config",
        )
    if args.html == "-":
        raise UsageError(
            "--html needs a file name: standard output carries the drill's timeline",
            "for example --html drill.html",
        )
    summary = drill.Summary()
    # The drill's own journal for --notify's outbox and --cloud's instances; never the daemon's.
    # --html composes the messages there too (without sending them) to show them.
    scratch = (
        tempfile.TemporaryDirectory(prefix="gpuwarden-drill-")
        if args.notify or args.cloud or args.html
        else None
    )
    journal = Path(scratch.name) / "journal.db" if scratch else None
    readings = None
    records: list[dict[str, Any]] = []
    if args.html:
        from gpuwarden.report.from_drill import Readings

        readings = Readings()
    try:
        for record in drill.run(
            spec,
            cfg,
            playbooks,
            options=options,
            tick=args.tick,
            summary=summary,
            notify=journal if args.notify or args.html else None,
            cloud=journal if args.cloud else None,
            deliver=bool(args.notify),
            observe=readings,
        ):
            if readings is not None:
                records.append(record)
            if args.json:
                print(json.dumps(record), flush=False)
            else:
                print(drill_text.render_record(record))
        if not args.json:
            print(drill_text.render_summary(summary, str(args.scenario), len(playbooks.rules)))
        if readings is not None and journal is not None:
            _drill_report(args, playbooks, summary, records, readings, journal)
    finally:
        if scratch is not None:
            scratch.cleanup()
    return ExitCode.OK


def _drill_spec(text: str) -> SourceSpec:
    """What ``drill SOURCE`` replays: ``scenario:``/``smi-csv:`` as ``--source`` reads them,
    a plain file as a scenario, or as an nvidia-smi log when it ends in ``.csv``."""
    scheme = text.partition(":")[0]
    if scheme in ("scenario", "smi-csv"):
        return parse_spec(text)
    if scheme == "nvml":
        raise UsageError(
            "a drill replays a recording, not the live GPUs",
            "record them first: gpuwarden record --source nvml --out FILE.yaml",
        )
    whole = Path(text).is_file()
    path = text.rpartition("@")[0] if "@" in text and not whole else text
    if not Path(path).is_file():
        raise UsageError(f"no such scenario file: {path}", "shipped scenarios are in scenarios/")
    scheme = "smi-csv" if path.lower().endswith(".csv") else "scenario"
    return SourceSpec(scheme, text) if whole else parse_spec(f"{scheme}:{text}")


def _drill_report(
    args: argparse.Namespace,
    playbooks: Any,
    summary: Any,
    records: list[dict[str, Any]],
    readings: Any,
    journal: Path,
) -> None:
    import time

    from gpuwarden import __version__
    from gpuwarden.cli.common import scratch_messages
    from gpuwarden.cli.report import said, write_html
    from gpuwarden.report import from_drill, page

    messages = scratch_messages(journal)
    report = from_drill.build(
        records,
        readings,
        playbooks,
        scenario=f"{summary.scenario} ({args.scenario})",
        description=summary.description,
        start=summary.start,
        duration=summary.simulated_s,
        messages=messages,
        delivered=bool(args.notify),
        now=time.time(),
        version=__version__,
        ticks=summary.ticks,
    )
    text = page.render(report)
    written = write_html(text, args.html)
    if written is not None:
        print(said(written, text), file=sys.stderr if args.json else sys.stdout)


def cmd_schema(args: argparse.Namespace) -> int:
    from gpuwarden.playbook.jsonschema import playbook_schema

    del args
    print(json.dumps(playbook_schema(), indent=2))
    return ExitCode.OK
