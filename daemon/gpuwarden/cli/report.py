"""``gpuwarden report ID|last``: one incident from the journal as a self-contained HTML page
(``drill --html`` writes the same kind of page for a drill: ``cli/check.py``)."""

from __future__ import annotations

import argparse
import os
import re
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpuwarden import __version__, config
from gpuwarden.cli.common import journal, outbox, playbook_paths
from gpuwarden.cli.incidents import journal_target
from gpuwarden.errors import ExitCode, GpuwardenError, UsageError

PREROLL_S = 3600.0  # readings looked for before an incident (the recorder keeps at most this)
TAIL_S = 900.0  # and after it


def add_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    report = sub.add_parser(
        "report",
        parents=[common],
        help="one incident as an HTML page: curves, thresholds, steps",
        description="Write one incident from the journal as one self-contained HTML file: "
        "per GPU the rule's metrics with their thresholds, the pending and firing bands, a "
        "marker per step and the memory of each process; then the steps (with why not) and "
        "the notifications. No script, nothing fetched: it opens from a mail attachment. "
        "ID may be `last`.",
    )
    report.add_argument("id", metavar="ID", help="an incident id, a unique prefix of one, or last")
    report.add_argument("--state-dir", type=Path, metavar="DIR")
    report.add_argument(
        "--out",
        metavar="FILE.html",
        help="where to write it (default: report-<incident>.html here; - for standard output)",
    )
    report.add_argument(
        "--playbooks",
        action="append",
        metavar="PATH",
        help="where to find the rule of an incident the journal did not keep it for "
        "(default: the config's playbooks)",
    )


def default_name(incident_id: str) -> str:
    return "report-" + re.sub(r"[^A-Za-z0-9._-]", "_", incident_id) + ".html"


def write_html(text: str, out: str | Path) -> Path | None:
    """Write the page to ``out`` whole (a temporary file renamed into place); ``-``: standard
    output (returns None)."""
    if str(out) == "-":
        sys.stdout.write(text)
        return None
    path = Path(out)
    data = text.encode("utf-8")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".report-", suffix=".tmp", dir=path.parent or ".")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise UsageError(
            f"cannot write the report to {path}: {exc.strerror}",
            "give --out a file in a folder you can write to",
        ) from None
    return path


def said(path: Path | None, text: str) -> str:
    size = len(text.encode("utf-8"))
    return f"report: {path} ({size / 1024:,.0f} KiB)" if path is not None else ""


def cmd_report(args: argparse.Namespace, cfg: config.Config) -> int:
    from gpuwarden.report import from_journal, page

    with journal(args, cfg) as reading:
        incident = journal_target(reading, args.id)
        rows = reading.timeline(incident.id)
        rule = reading.rule_facts(incident.id)
        now = time.time()
        first = incident.pending_at if incident.pending_at is not None else incident.opened_at
        last = incident.resolved_at if incident.resolved_at is not None else now
        samples, procs = reading.samples(first - PREROLL_S, last + TAIL_S, incident.gpu)
    with outbox(args, cfg) as reading_outbox:
        messages = reading_outbox.about(incident.id)
    fallback, missing = (None, "") if rule is not None else _current_rule(args, cfg, incident.rule)
    report = from_journal.build(
        incident,
        rows,
        rule=rule,
        fallback=fallback,
        missing=missing,
        samples=samples,
        procs=procs,
        messages=messages,
        host=cfg.host or socket.gethostname(),
        now=now,
        version=__version__,
    )
    text = page.render(report)
    written = write_html(text, args.out or default_name(incident.id))
    if written is not None:
        print(said(written, text))
    return ExitCode.OK


def _current_rule(args: argparse.Namespace, cfg: config.Config, name: str) -> tuple[Any, str]:
    """The rule as the playbooks define it now (for an incident the journal has no rule of),
    or None and why not."""
    from gpuwarden.playbook import loader
    from gpuwarden.report.model import RuleView

    paths = playbook_paths(args.playbooks, cfg)
    try:
        playbooks = loader.load(paths, cfg)
    except (GpuwardenError, OSError) as exc:
        first = str(exc.render() if isinstance(exc, GpuwardenError) else exc).splitlines()[0]
        return None, f"the playbooks ({', '.join(paths)}) could not be loaded: {first}"
    compiled = playbooks.rule(name)
    if compiled is None:
        return None, f"the playbooks ({', '.join(paths)}) no longer have it"
    until = None if compiled.until is None else compiled.until.text
    return RuleView(
        name,
        compiled.when.text,
        until,
        compiled.spec.for_,
        compiled.spec.description,
        note="from the playbooks as they are now",
    ), ""
