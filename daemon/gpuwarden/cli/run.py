"""``gpuwarden run``: the daemon. It loads the playbooks first (one that does not load is bad
input, exit 2, which systemd does not restart on), checks its setup (the findings ``doctor``
shows), takes the state directory's lock (one daemon per ``state_dir``: a second one is
refused with exit code LOCKED before it touches anything), then wires the source, the
journal, notifications, metrics, the cloud service, reload and signals around
``runtime.Runtime`` and runs it until stopped. The lock is held until the journal is closed."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from gpuwarden import config
from gpuwarden.cli.common import (
    add_replay_options,
    config_path,
    playbook_paths,
    replay_options,
    state_dir,
)
from gpuwarden.config import host_name
from gpuwarden.errors import ExitCode, UsageError
from gpuwarden.journal.schema import JOURNAL_NAME

if TYPE_CHECKING:
    from gpuwarden.playbook.compiled import PlaybookSet


def add_commands(sub: Any, common: argparse.ArgumentParser) -> None:
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
        help="nvml, scenario:FILE[@TIME] or smi-csv:FILE[@TIME] (default: the config's)",
    )
    add_replay_options(run)
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


def cmd_run(args: argparse.Namespace) -> int:
    from gpuwarden.journal.lock import StateLock
    from gpuwarden.playbook import loader

    found = config_path(args.config)
    cfg = config.Config() if found is None else config.load(found)
    paths = playbook_paths(args.playbooks, cfg)
    logging.getLogger("gpuwarden").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    # A playbook that does not load is bad input (exit 2, file:line:col), like a bad config:
    # systemd does not restart on it (RestartPreventExitStatus). Then the self-check, then
    # the lock.
    playbooks = loader.load(paths, cfg)
    _self_check(args, cfg, paths, found)
    with StateLock(state_dir(args, cfg)):  # refused at once if another daemon holds it
        return _run(args, cfg, paths, found, playbooks)


def _run(
    args: argparse.Namespace,
    cfg: config.Config,
    paths: list[str],
    found: Path | None,
    playbooks: PlaybookSet,
) -> int:
    from gpuwarden.clock import Clock, ScaledClock, SystemClock
    from gpuwarden.journal.journal import Journal
    from gpuwarden.journal.schema import Access
    from gpuwarden.runtime import Runtime
    from gpuwarden.sources.select import open_source, parse_spec, with_sample

    spec = with_sample(parse_spec(args.source or cfg.source), args.at_sample)
    options = replay_options(args, default_events=cfg.events)
    if args.speed is not None and (args.speed <= 0 or not spec.replay):
        raise UsageError(
            "--speed needs a positive number and a replayed source",
            "for example --source scenario:FILE --speed 20",
        )
    journal = Journal(state_dir(args, cfg) / JOURNAL_NAME)
    control = None
    if cfg.operators.group is not None:
        # Non-root operators: the journal readable by their group, and the control socket
        # for ack, hold, release, abort and silence (docs/operations.md, "On call").
        from gpuwarden.control import ControlServer, share_journal

        server = ControlServer(cfg.operators.socket, cfg.operators.group, journal.path)
        share_journal(journal.path.parent, server.gid)
        control = server.start()
    source = open_source(spec, cfg, options)
    clock: Clock = SystemClock()
    if spec.replay:
        clock = ScaledClock(args.speed or 1.0)
        at = spec.at or 0.0
        if spec.sample is not None:
            at = source.sample_offset(spec.sample)  # type: ignore[attr-defined]
        source.start_time = clock.now() - at  # type: ignore[attr-defined]
    power = None
    if spec.scheme == "nvml":
        from gpuwarden.actions.nvml_power import NvmlPower

        power = NvmlPower()
    from gpuwarden.notify.service import Notifications
    from gpuwarden.reload import Reloader, Watcher
    from gpuwarden.sdnotify import SystemdNotifier

    host = host_name(cfg)
    notifications = Notifications(
        cfg,
        journal.path,
        host=host,
        clock=clock,
        marker="[DRY-RUN]" if args.dry_run or cfg.shadow else "",
        descriptions={r.name: r.spec.description for r in playbooks.rules},
        rules=[r.spec for r in playbooks.rules],
        access=Access.WRITE,  # the journal above created and migrated the file
    )
    metrics = None
    if cfg.metrics.listen:
        from gpuwarden.metrics import Metrics

        metrics = Metrics(gpu_gauges=cfg.metrics.gpu_gauges, host=host)
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

        cloud = CloudService(cfg.cloud, InstanceStore.open_writer(journal.path), host=host)
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
        reloader=Reloader(
            found, paths, (cfg, playbooks), insecure_permissions=args.insecure_permissions
        ),
        cloud=cloud,
    )
    watcher = None
    if cfg.reload.watch:
        watcher = Watcher(
            found,
            paths,
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
    if runtime.dry_run:
        why = "--dry-run" if args.dry_run else str(found)
        mode = f"shadow mode ({why}): recording and notifying, acting on nothing"
    else:
        mode = "enforcing"
    print(
        f"gpuwarden: running {len(playbooks.rules)} rule(s) on {source.name} ({mode}; "
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
        if control is not None:
            control.stop()
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


# What keeps `run` from starting; every other finding is logged and the daemon starts (a
# missing notification secret must not leave a node unguarded).
BLOCKING_CHECKS = ("state_dir", "config", "playbooks", "mode ")


def _self_check(
    args: argparse.Namespace,
    cfg: config.Config,
    playbook_paths: list[str],
    config_path: Path | None,
) -> None:
    from gpuwarden.cli import doctor, selfcheck

    if args.source:  # check the source this run uses, not the config's
        cfg = cfg.model_copy(update={"source": args.source})
    findings = doctor.setup_findings(args, cfg, playbook_paths, config_path, parse_urls=False)
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
    blocking = [f for f in selfcheck.blocking(findings) if f.check.startswith(BLOCKING_CHECKS)]
    if blocking:
        print(doctor.render(blocking), file=sys.stderr)
        raise SystemExit(ExitCode.UNSAFE_SETUP)
