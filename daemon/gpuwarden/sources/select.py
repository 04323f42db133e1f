"""Choosing a source, and the kernel-log events beside it, from the command line.

Sources: ``nvml``, ``scenario:FILE[@TIME]`` or ``smi-csv:FILE[@TIME]``; ``@#N`` instead of
``@TIME`` picks the Nth sample of a log (the Nth keyframe of a scenario). Events
(``--events``): ``kmsg`` (``/dev/kmsg``), ``kmsg:journal`` (``journalctl -k``), ``kmsg:PATH``
(a FIFO carrying ``/dev/kmsg`` records) or ``dmesg:FILE`` (a saved kernel log, replayed).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpuwarden.config import Config, host_name
from gpuwarden.errors import UsageError
from gpuwarden.sources import Source
from gpuwarden.units import parse_duration

if TYPE_CHECKING:
    from gpuwarden.sources.kernel_events import EventFeed

# The kernel-log modules (kernel_events, kmsg) are imported where events are asked for: a
# daemon without ``events`` does not load their parsers.
DEV_KMSG = "/dev/kmsg"  # kmsg.DEV_KMSG, without importing kmsg

SCHEMES = ("nvml", "scenario", "smi-csv")
EXAMPLES = "nvml, scenario:scenarios/xid79-one-of-eight.yaml@5m, smi-csv:nvidia-smi.log"
EVENT_FORMS = "kmsg, kmsg:journal, kmsg:PATH (a FIFO) or dmesg:FILE"


@dataclass(frozen=True)
class SourceSpec:
    scheme: str
    path: str | None = None
    at: float | None = None  # seconds into a recording
    sample: int | None = None  # the Nth sample (1 is the first)

    @property
    def replay(self) -> bool:
        return self.scheme != "nvml"


@dataclass(frozen=True)
class EventsSpec:
    scheme: str  # kmsg | journal | dmesg
    path: str | None = None

    @property
    def text(self) -> str:
        if self.scheme == "kmsg":
            from gpuwarden.sources.kmsg import DEV_KMSG

            return "kmsg" if self.path == DEV_KMSG else f"kmsg:{self.path}"
        return "kmsg:journal" if self.scheme == "journal" else f"{self.scheme}:{self.path}"


@dataclass(frozen=True)
class Options:
    """How to read a replayed file, and which kernel-log events go with the source."""

    columns: tuple[str, ...] | None = None  # an nvidia-smi log's columns (noheader logs)
    tz: str | None = None  # the zone of local times in logs (default UTC)
    events: tuple[EventsSpec, ...] = ()
    boot_time: float | None = None  # when the machine of a plain dmesg log booted


def _sample(text: str, spec: str) -> int:
    try:
        number = int(text)
    except ValueError:
        number = 0
    if number < 1:
        raise UsageError(
            f"--source {spec}: after @# comes a sample number (got {text!r})",
            "write e.g. @#1 for the first sample, @#30 for the thirtieth",
        )
    return number


def parse_spec(text: str) -> SourceSpec:
    """Parse a ``--source`` value; a bad one is a ``UsageError`` with the accepted forms."""
    scheme, sep, rest = text.partition(":")
    if scheme == "nvml":
        if sep:
            raise UsageError(
                f"--source nvml takes no argument (got {text!r})", "write --source nvml"
            )
        return SourceSpec("nvml")
    if scheme not in SCHEMES:
        raise UsageError(
            f"unknown source {text!r}: the scheme must be one of {', '.join(SCHEMES)}",
            f"for example: {EXAMPLES}",
        )
    if not rest:
        raise UsageError(
            f"--source {scheme}: needs a file (got {text!r})",
            f"write --source {scheme}:FILE[@TIME]",
        )
    path, at_sep, at_text = rest.rpartition("@") if "@" in rest else (rest, "", "")
    at: float | None = None
    sample: int | None = None
    if at_sep and at_text.startswith("#"):
        sample = _sample(at_text[1:], text)
    elif at_sep:
        try:
            at = parse_duration(at_text)
        except ValueError as exc:
            raise UsageError(
                f"--source {text}: the time after @ is not a duration: {exc}",
                "write e.g. @90s, @2m30s or @1h, or @#N for the Nth sample",
            ) from None
    if not Path(path).is_file():
        what = "is a directory" if Path(path).is_dir() else "no such file"
        raise UsageError(
            f"--source {scheme}:{path}: {what}",
            f"shipped examples are in scenarios/ (for example {EXAMPLES})",
        )
    return SourceSpec(scheme, path, at, sample)


def with_sample(spec: SourceSpec, sample: int | None) -> SourceSpec:
    """``spec`` at the sample ``--at-sample`` names (at most one of the two ways)."""
    if sample is None:
        return spec
    if spec.at is not None or spec.sample is not None:
        raise UsageError(
            "--at-sample and @TIME (or @#N) both say where to look", "give one of them"
        )
    if not spec.replay:
        raise UsageError("--at-sample needs a replayed source", "for example smi-csv:FILE")
    if sample < 1:
        raise UsageError(f"--at-sample {sample}: samples count from 1", "write --at-sample 1")
    return SourceSpec(spec.scheme, spec.path, None, sample)


def parse_events(text: str) -> EventsSpec:
    """Parse an ``--events`` value; a bad one is a ``UsageError`` with the accepted forms."""
    from gpuwarden.sources.kmsg import DEV_KMSG

    scheme, sep, rest = text.partition(":")
    if scheme == "kmsg":
        if not sep:
            return EventsSpec("kmsg", DEV_KMSG)
        if rest == "journal":
            return EventsSpec("journal")
        if rest and Path(rest).exists() and not Path(rest).is_file():
            return EventsSpec("kmsg", rest)
        raise UsageError(
            f"--events {text}: not a FIFO or device carrying kernel records",
            f"write one of {EVENT_FORMS}; a saved log is dmesg:FILE",
        )
    if scheme == "dmesg":
        if not rest or not Path(rest).is_file():
            what = "needs a file" if not rest else f"{rest}: no such file"
            raise UsageError(f"--events dmesg: {what}", "write --events dmesg:FILE")
        return EventsSpec("dmesg", rest)
    raise UsageError(f"unknown --events {text!r}", f"write one of {EVENT_FORMS}")


def open_feeds(options: Options) -> list[EventFeed]:
    """The event feeds ``options`` names, opened (closed again if one fails)."""
    from gpuwarden.sources.kernel_events import ReplayFeed
    from gpuwarden.sources.kmsg import DEV_KMSG, JournalFeed, KmsgFeed

    feeds: list[EventFeed] = []
    try:
        for spec in options.events:
            if spec.scheme == "dmesg":
                assert spec.path is not None
                feeds.append(ReplayFeed(spec.path, tz=options.tz, boot_time=options.boot_time))
            elif spec.scheme == "journal":
                feeds.append(JournalFeed())
            else:
                feeds.append(KmsgFeed(spec.path or DEV_KMSG))
    except BaseException:
        for feed in feeds:
            feed.close()
        raise
    return feeds


def open_source(
    spec: SourceSpec, config: Config, options: Options | None = None, *, drill: bool = False
) -> Source:
    """Open the source ``spec`` names, with the events ``options`` names. A replay source
    keeps its recording's own start time; the caller positions it (see ``ReplaySource``).
    ``drill``: a scenario's jobs are not spawned (see ``ScenarioSource``)."""
    from gpuwarden.sources.procs import Attributor
    from gpuwarden.sources.slurm import SlurmJobs

    options = options or Options()
    host = host_name(config)
    attributor = Attributor(config.priorities, slurm=SlurmJobs.detect())
    source: Source
    if spec.scheme == "nvml":
        from gpuwarden.sources.nvml import NvmlSource

        source = NvmlSource(attributor, host=host)
    elif spec.scheme == "scenario":
        from gpuwarden.sources.scenario import ScenarioSource

        assert spec.path is not None
        source = ScenarioSource.open(
            spec.path,
            priorities=config.priorities,
            attributor=attributor,
            ack_spool=config.ack_spool,
            spawn=not drill,
        )
    else:
        from gpuwarden.sources.smi_csv import SmiCsvSource

        assert spec.path is not None
        source = SmiCsvSource(spec.path, host=config.host, columns=options.columns, tz=options.tz)
    if not options.events:
        return source
    try:
        feeds = open_feeds(options)
    except BaseException:
        source.close()
        raise
    from gpuwarden.sources.kernel_events import WithEvents

    return WithEvents(source, feeds)
