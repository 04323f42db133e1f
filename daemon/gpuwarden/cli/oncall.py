"""``gpuwarden ack``, ``hold``, ``release``, ``abort`` and ``silence``: what the on-call person
tells the running daemon. Each is written to the journal and applied at the daemon's next tick.

Root writes the journal directly (``common.journal(..., write=True)``). Anyone else, in the
config's ``operators.group``, asks the daemon over its control socket, which checks who is
asking and writes the same thing (``gpuwarden.control``). Who asks is recorded: ``--by``
(default: the user behind sudo, else the login name) and, through the socket, the real user.
"""

from __future__ import annotations

import argparse
import difflib
import os
import time
from pathlib import Path
from typing import Any

from gpuwarden import config
from gpuwarden.cli.common import duration, journal, journal_path
from gpuwarden.control import Request, ask, invoking_user, perform, render_silences
from gpuwarden.errors import ExitCode, GpuwardenError, UsageError


def add_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    def who(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--by",
            metavar="NAME",
            help="who says so, for the record (default: $SUDO_USER, else your login name)",
        )
        parser.add_argument("--state-dir", type=Path, metavar="DIR")

    ack = sub.add_parser(
        "ack",
        parents=[common],
        help="record that a person has taken over",
        description="Acknowledge an incident: reminders about it stop. Says whether its "
        "ladder goes on (it does, unless the rule has pause_on_ack: use hold to stop it).",
    )
    ack.add_argument("id", metavar="ID", help="an incident id, a unique prefix of one, or last")
    ack.add_argument("--comment", metavar="TEXT", default="", help="why, for the record")
    who(ack)

    hold = sub.add_parser(
        "hold",
        parents=[common],
        help="stop an incident's ladder until released",
        description="Put an open incident on hold: no further step of it runs (a step "
        "already running finishes) until `gpuwarden release ID` or until --for has passed.",
    )
    hold.add_argument("id", metavar="ID", help="an incident id, a unique prefix of one, or last")
    hold.add_argument(
        "--for", dest="for_s", type=duration, metavar="D", help="release by itself after D (30m)"
    )
    hold.add_argument("--reason", default="", metavar="TEXT")
    who(hold)

    release = sub.add_parser(
        "release",
        parents=[common],
        help="let a held incident's ladder go on",
        description="End an incident's hold: a step that came due meanwhile runs at the "
        "daemon's next tick.",
    )
    release.add_argument("id", metavar="ID")
    who(release)

    abort = sub.add_parser(
        "abort",
        parents=[common],
        help="end an incident and put back what it did",
        description="End an open incident now: its running steps stop, suspended jobs are "
        "resumed, nice values and power limits restored (a kill cannot be undone). The rule "
        "fires again for the same GPU or process only after its condition has cleared.",
    )
    abort.add_argument("id", metavar="ID")
    abort.add_argument("--reason", default="", metavar="TEXT")
    who(abort)

    silence = sub.add_parser(
        "silence",
        parents=[common],
        help="a maintenance window: record, do not act or page",
        description="Silence a rule, a GPU, or the whole host for a while: rules still "
        "evaluate and the journal records each step as silenced, but nothing acts and no "
        "message is sent. A step that comes due while silenced is not run again afterwards.",
    )
    what = silence.add_argument_group("what to silence (--rule and --gpu may be combined)")
    what.add_argument("--rule", metavar="NAME")
    what.add_argument("--gpu", type=int, metavar="N")
    what.add_argument("--host", action="store_true", help="every rule on this host")
    silence.add_argument("--for", dest="for_s", type=duration, metavar="D", help="e.g. 2h")
    silence.add_argument("--reason", default="", metavar="TEXT")
    silence.add_argument("--list", action="store_true", help="list the silences in force")
    silence.add_argument("--all", action="store_true", help="with --list: ended ones too")
    silence.add_argument("--end", type=int, metavar="ID", help="end silence ID now")
    who(silence)


def _request(args: argparse.Namespace, op: str, **extra: Any) -> Request:
    by = (getattr(args, "by", None) or "").strip() or invoking_user()
    return Request(op=op, by=by, **extra)


def _writable(path: Path) -> bool:
    """Whether this process may write the journal itself (else: the control socket)."""
    if os.geteuid() == 0:
        return True
    return os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)


def _carry_out(args: argparse.Namespace, cfg: config.Config, request: Request) -> int:
    if _writable(journal_path(args, cfg)):
        with journal(args, cfg, write=True) as writing:
            message = perform(writing, request, time.time())
    else:
        message = ask(cfg.operators.socket, request)
    print(message)
    return ExitCode.OK


def cmd_ack(args: argparse.Namespace, cfg: config.Config) -> int:
    return _carry_out(args, cfg, _request(args, "ack", incident=args.id, comment=args.comment))


def cmd_hold(args: argparse.Namespace, cfg: config.Config) -> int:
    request = _request(args, "hold", incident=args.id, for_s=args.for_s, reason=args.reason)
    return _carry_out(args, cfg, request)


def cmd_release(args: argparse.Namespace, cfg: config.Config) -> int:
    return _carry_out(args, cfg, _request(args, "release", incident=args.id))


def cmd_abort(args: argparse.Namespace, cfg: config.Config) -> int:
    return _carry_out(args, cfg, _request(args, "abort", incident=args.id, reason=args.reason))


def cmd_silence(args: argparse.Namespace, cfg: config.Config) -> int:
    chosen = args.rule is not None or args.gpu is not None or args.host
    if args.list:
        if chosen or args.end is not None:
            raise UsageError("--list shows the silences; give it alone")
        with journal(args, cfg) as reading:
            now = time.time()
            rows = reading.silences(since=None if args.all else now)
        print(render_silences(rows, now))
        return ExitCode.OK
    if args.end is not None:
        if chosen:
            raise UsageError("--end ID ends a silence; give it without --rule, --gpu or --host")
        return _carry_out(args, cfg, _request(args, "end-silence", silence=args.end))
    if args.rule is not None:
        _known_rule(args.rule, cfg)
    request = _request(
        args,
        "silence",
        rule=args.rule,
        gpu=args.gpu,
        host=args.host,
        for_s=args.for_s,
        reason=args.reason,
    )
    return _carry_out(args, cfg, request)


def _known_rule(name: str, cfg: config.Config) -> None:
    """A silence of a rule that does not exist would silence nothing: refuse it when the
    playbooks can be read (when they cannot, the silence is taken as given)."""
    from gpuwarden.playbook import loader

    if not cfg.playbooks.exists():
        return
    try:
        rules = [r.name for r in loader.load([cfg.playbooks], cfg).rules]
    except (GpuwardenError, OSError):
        return
    if name in rules:
        return
    close = difflib.get_close_matches(name, rules, n=1)
    raise UsageError(
        f"no rule {name!r} in the playbooks ({cfg.playbooks})",
        hint=(f"did you mean {close[0]!r}? " if close else "")
        + f"rules: {', '.join(sorted(rules)) or 'none'}",
    )
