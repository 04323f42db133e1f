"""The daemon's commands: ``run``, ``incidents``, ``incident`` and ``reset-breaker``."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from gpuwarden import config
from gpuwarden.errors import ExitCode, UsageError

if TYPE_CHECKING:
    from gpuwarden.cloud.instance import Managed

JOURNAL_NAME = "journal.db"


def add_commands(sub: Any, common: argparse.ArgumentParser, duration: Any) -> None:
    run = sub.add_parser(
        "run",
        parents=[common],
        help="run the daemon: watch, decide, act, record",
        description="Take a snapshot every tick, evaluate the playbooks, run the ladder's steps "
        "and record everything in the journal. Stops cleanly on SIGINT/SIGTERM, and by itself "
        "when a replayed scenario ends.",
    )
    run.add_argument(
        "--source",
        metavar="SOURCE",
        help="nvml, scenario:FILE[@TIME] or smi-csv:FILE (default: the config's)",
    )
    run.add_argument(
        "--playbooks",
        action="append",
        metavar="PATH",
        help="playbook file or directory (repeatable; default: the config's)",
    )
    run.add_argument(
        "--state-dir",
        type=Path,
        metavar="DIR",
        help="where the journal lives (default: the config's state_dir)",
    )
    run.add_argument(
        "--dry-run", action="store_true", help="decide and record everything, act on nothing"
    )
    run.add_argument("--once", action="store_true", help="take one tick and stop")
    run.add_argument(
        "--insecure-permissions",
        action="store_true",
        help="start even if the config or playbooks are writable by others",
    )
    run.add_argument(
        "--speed",
        type=float,
        metavar="N",
        help="replay a scenario N times faster than real time (processes still get "
        "real time to react)",
    )

    incidents = sub.add_parser(
        "incidents",
        parents=[common],
        help="list incidents",
        description="List incidents from the journal, newest first.",
    )
    incidents.add_argument("--state-dir", type=Path, metavar="DIR")
    incidents.add_argument("--json", action="store_true")
    incidents.add_argument(
        "--since", type=duration, metavar="D", help="only incidents opened in the last D (e.g. 24h)"
    )
    incidents.add_argument("--open", action="store_true", help="only open incidents")

    incident = sub.add_parser(
        "incident",
        parents=[common],
        help="one incident's timeline",
        description="Everything recorded for one incident: what ran, on "
        "whom, why, what was skipped and why. ID may be `last`.",
    )
    incident.add_argument("id", metavar="ID")
    incident.add_argument("--state-dir", type=Path, metavar="DIR")
    incident.add_argument("--json", action="store_true")

    ack = sub.add_parser(
        "ack",
        parents=[common],
        help="record that a person has taken over",
        description="Acknowledge an incident: reminders about it stop.",
    )
    ack.add_argument("id", metavar="ID", help="an incident id, a unique prefix of one, or last")
    ack.add_argument("--state-dir", type=Path, metavar="DIR")

    test = sub.add_parser(
        "notify-test",
        parents=[common],
        help="send a test message to a notification target",
        description="Send one test message to each URL of TARGET and report "
        "the result per URL (exit 1 if any failed).",
    )
    test.add_argument("target", metavar="TARGET")

    outbox = sub.add_parser(
        "outbox",
        parents=[common],
        help="messages waiting or failed",
        description="Show the notification outbox: pending and failed messages.",
    )
    outbox.add_argument("--state-dir", type=Path, metavar="DIR")
    outbox.add_argument("--json", action="store_true")

    reset = sub.add_parser(
        "reset-breaker",
        parents=[common],
        help="let destructive steps run again after the breaker tripped",
        description="Reset the circuit breaker recorded in the journal.",
    )
    reset.add_argument("--state-dir", type=Path, metavar="DIR")


def _state_dir(args: argparse.Namespace, cfg: config.Config) -> Path:
    return Path(args.state_dir) if getattr(args, "state_dir", None) else cfg.state_dir


def cmd_run(
    args: argparse.Namespace,
    cfg: config.Config,
    playbook_paths: list[str],
    config_path: Path | None = None,
) -> int:
    from gpuwarden.clock import Clock, ScaledClock, SystemClock
    from gpuwarden.journal import Journal
    from gpuwarden.playbook import loader
    from gpuwarden.runtime import Runtime
    from gpuwarden.sources.select import open_source, parse_spec

    logging.getLogger("gpuwarden").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    _self_check(args, cfg, playbook_paths, config_path)
    playbooks = loader.load(playbook_paths, cfg)
    spec = parse_spec(args.source or cfg.source)
    if args.speed is not None and (args.speed <= 0 or not spec.replay):
        raise UsageError(
            "--speed needs a positive number and a replayed source",
            "for example --source scenario:FILE --speed 20",
        )
    journal = Journal(_state_dir(args, cfg) / JOURNAL_NAME)
    source = open_source(spec, cfg)
    clock: Clock = SystemClock()
    if spec.replay:
        clock = ScaledClock(args.speed or 1.0)
        source.start_time = clock.now() - (spec.at or 0.0)  # type: ignore[attr-defined]
    power = None
    if spec.scheme == "nvml":
        from gpuwarden.actions.nvml_power import NvmlPower

        power = NvmlPower()
    from gpuwarden.notify.service import Notifications
    from gpuwarden.reload import Reloader, Watcher
    from gpuwarden.sdnotify import SystemdNotifier

    host = cfg.host or socket.gethostname()
    notifications = Notifications(
        cfg,
        journal.path,
        host=host,
        clock=clock,
        marker="[DRY-RUN]" if args.dry_run or cfg.dry_run else "",
        descriptions={r.name: r.spec.description for r in playbooks.rules},
        rules=[r.spec for r in playbooks.rules],
    )
    metrics = None
    if cfg.metrics.listen:
        from gpuwarden.metrics import Metrics

        metrics = Metrics(gpu_gauges=cfg.metrics.gpu_gauges)
        try:
            metrics.serve(cfg.metrics.listen)
        except (OSError, ValueError) as exc:
            raise UsageError(
                f"metrics.listen {cfg.metrics.listen!r}: {exc}",
                "choose a free address, e.g. 127.0.0.1:9400",
            ) from None
    cloud = None
    if cfg.cloud.profiles:  # boto3 itself is imported at the first call to EC2
        from gpuwarden.cloud.service import CloudService
        from gpuwarden.cloud.store import InstanceStore

        cloud = CloudService(cfg.cloud, InstanceStore.open(journal.path), host=host)
    runtime = Runtime(
        cfg,
        source,
        playbooks,
        journal,
        clock=clock,
        dry_run=args.dry_run,
        power=power,
        self_pid=os.getpid(),
        host=host,
        notifications=notifications,
        metrics=metrics,
        systemd=SystemdNotifier(),
        reloader=Reloader(config_path, playbook_paths, (cfg, playbooks)),
        cloud=cloud,
    )
    watcher = None
    if cfg.reload.watch:
        watcher = Watcher(
            config_path,
            playbook_paths,
            runtime.request_reload,
            debounce=cfg.reload.debounce,
            poll=cfg.reload.poll,
        )
        watcher.start()

    def stop(signum: int, _frame: FrameType | None) -> None:
        logging.getLogger("gpuwarden.run").info(
            "received %s: stopping", signal.Signals(signum).name
        )
        runtime.stop()

    def hangup(_signum: int, _frame: FrameType | None) -> None:
        logging.getLogger("gpuwarden.run").info("received SIGHUP: reloading")
        runtime.request_reload()

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, hangup)
    mode = "DRY-RUN" if runtime.dry_run else "enforcing"
    print(
        f"gpuwarden: running {len(playbooks.rules)} rule(s) on {source.name} ({mode}, "
        f"journal {journal.path})",
        file=sys.stderr,
    )
    try:
        stats = runtime.run(once=args.once)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if watcher is not None:
            watcher.stop()
        journal.close()
        if cloud is not None:
            cloud.store.close()
        if power is not None:
            power.close()
    print(
        f"gpuwarden: stopped after {stats.ticks} tick(s): {len(stats.incidents)} "
        f"incident(s), {stats.intents} step(s) ({stats.failed} not ok, {stats.refused} "
        f"refused), {stats.undone} undo(s)",
        file=sys.stderr,
    )
    return ExitCode.OK


def _readonly(args: argparse.Namespace, cfg: config.Config) -> Any:
    from gpuwarden.journal import Journal

    return Journal.open_readonly(_state_dir(args, cfg) / JOURNAL_NAME)


def cmd_incidents(args: argparse.Namespace, cfg: config.Config) -> int:
    from gpuwarden import journal_view

    journal = _readonly(args, cfg)
    try:
        since = None if args.since is None else time.time() - args.since
        rows = journal.incidents(since=since, open_only=args.open)
    finally:
        journal.close()
    if args.json:
        print(json.dumps({"version": 1, "incidents": journal_view.incidents_json(rows)}, indent=2))
    else:
        print(journal_view.render_incidents(rows, time.time()))
    return ExitCode.OK


def cmd_incident(args: argparse.Namespace, cfg: config.Config) -> int:
    from gpuwarden import cli_cloud, journal_view

    journal = _readonly(args, cfg)
    try:
        incident = _journal_target(journal, args.id)
        timeline = journal.timeline(incident.id)
        instances = _cloud_instances(journal.path, incident.id)
    finally:
        journal.close()
    now = time.time()
    if args.json:
        doc = journal_view.timeline_json(incident, timeline)
        doc["instances"] = [cli_cloud.instance_json(m, now) for m in instances]
        print(json.dumps(doc, indent=2))
    else:
        print(journal_view.render_timeline(incident, timeline, now))
        if instances:
            print("\ncloud instances\n" + cli_cloud.render_instances(instances, now))
    return ExitCode.OK


def _cloud_instances(path: Path, incident: str) -> list[Managed]:
    """The cloud instances an incident launched, from the same journal file."""
    from gpuwarden.cloud.store import InstanceStore

    with InstanceStore.open_readonly(path) as store:
        return store.for_incident(incident)


def cmd_reset_breaker(args: argparse.Namespace, cfg: config.Config) -> int:
    from gpuwarden.journal import Journal

    journal = Journal(_state_dir(args, cfg) / JOURNAL_NAME)
    try:
        state = journal.breaker()
        if state is None:
            print("the circuit breaker is not tripped")
            return ExitCode.OK
        journal.reset_breaker(time.time())
    finally:
        journal.close()
    print("circuit breaker reset: destructive steps may run again")
    return ExitCode.OK


def _journal_target(journal: Any, text: str) -> Any:
    if text == "last":
        rows = journal.incidents()
        if not rows:
            raise UsageError("the journal has no incidents yet")
        return max(rows, key=lambda r: r.opened_at)
    return journal.find_incident(text)  # an id or a unique prefix of one


def cmd_ack(args: argparse.Namespace, cfg: config.Config) -> int:
    from gpuwarden.journal import Journal

    journal = Journal(_state_dir(args, cfg) / JOURNAL_NAME)
    try:
        incident = _journal_target(journal, args.id)
        journal.ack(incident.id, time.time())
    finally:
        journal.close()
    print(f"acknowledged {incident.id}: no more reminders about it")
    return ExitCode.OK


def cmd_notify_test(args: argparse.Namespace, cfg: config.Config) -> int:
    from gpuwarden.notify.service import test_target

    results = test_target(cfg, args.target)
    for result in results:
        status = "ok  " if result.ok else "FAIL"
        detail = f": {result.detail}" if result.detail and not result.ok else ""
        print(f"{status} {result.url}{detail}")
    return ExitCode.OK if results and all(r.ok for r in results) else ExitCode.FAILURE


def cmd_outbox(args: argparse.Namespace, cfg: config.Config) -> int:
    from gpuwarden.notify.outbox import Outbox

    path = _state_dir(args, cfg) / JOURNAL_NAME
    if not path.exists():
        raise UsageError(f"no journal at {path}", "pass --state-dir, or start the daemon once")
    outbox = Outbox(path)
    try:
        rows = outbox.pending() + outbox.failed()
        counts = outbox.counts()
    finally:
        outbox.close()
    if args.json:
        print(
            json.dumps(
                {
                    "version": 1,
                    "counts": counts,
                    "messages": [
                        {
                            "message_id": r.message_id,
                            "target": r.target,
                            "status": r.status,
                            "title": r.title,
                            "attempts": r.attempts,
                            "last_error": r.last_error,
                            "next_attempt_at": r.next_attempt_at,
                        }
                        for r in rows
                    ],
                },
                indent=2,
            )
        )
        return ExitCode.OK
    summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "empty"
    print(f"outbox: {summary}")
    for r in rows:
        error = f" — {r.last_error}" if r.last_error else ""
        print(f"  {r.status:<8} {r.target:<12} attempts {r.attempts}  {r.title}{error}")
    return ExitCode.OK


# What keeps `run` from starting; every other finding is logged and the daemon starts (a
# missing notification secret must not leave a node unguarded).
BLOCKING_CHECKS = ("state_dir", "config", "playbooks", "mode ")


def _self_check(
    args: argparse.Namespace,
    cfg: config.Config,
    playbook_paths: list[str],
    config_path: Path | None,
) -> None:
    from gpuwarden import doctor

    if args.source:  # check the source this run uses, not the config's
        cfg = cfg.model_copy(update={"source": args.source})
    findings = _findings(args, cfg, playbook_paths, config_path, parse_urls=False)
    log = logging.getLogger("gpuwarden.doctor")
    for finding in findings:
        if not finding.ok:
            log.warning(
                "check=%s severity=%s detail=%s fix=%s",
                finding.check,
                finding.severity,
                finding.detail,
                finding.fix,
            )
    blocking = [f for f in doctor.blocking(findings) if f.check.startswith(BLOCKING_CHECKS)]
    if blocking:
        print(doctor.render(blocking), file=sys.stderr)
        raise SystemExit(ExitCode.UNSAFE_SETUP)


def add_doctor(sub: Any, common: argparse.ArgumentParser) -> None:
    doctor = sub.add_parser(
        "doctor",
        parents=[common],
        help="check this machine's setup",
        description="Check NVML, permissions, the state directory, file modes, the config and "
        "playbooks, notification targets and cloud credentials; each finding says what to fix. "
        "Exit 1 if any is an error.",
    )
    doctor.add_argument(
        "--insecure-permissions",
        action="store_true",
        help="report writable config or playbooks as warnings, not errors",
    )
    doctor.add_argument("--state-dir", type=Path, metavar="DIR")
    doctor.add_argument("--json", action="store_true")


def cmd_doctor(
    args: argparse.Namespace,
    cfg: config.Config,
    playbook_paths: list[str],
    config_path: Path | None,
) -> int:
    from gpuwarden import doctor

    findings = _findings(args, cfg, playbook_paths, config_path, parse_urls=True)
    if args.json:
        print(json.dumps(doctor.as_json(findings), indent=2))
    else:
        print(doctor.render(findings))
    return doctor.exit_code(findings)


def _findings(
    args: argparse.Namespace,
    cfg: config.Config,
    playbook_paths: list[str],
    config_path: Path | None,
    *,
    parse_urls: bool,
) -> list[Any]:
    from gpuwarden import doctor

    return doctor.run_checks(
        cfg,
        config_path,
        playbook_paths,
        state_dir=_state_dir(args, cfg),
        insecure_permissions=args.insecure_permissions,
        parse_urls=parse_urls,
    )
