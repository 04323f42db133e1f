"""Choosing a source from the command line.

``nvml``, ``scenario:FILE[@TIME]`` or ``smi-csv:FILE[@TIME]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpuwarden.config import Config, host_name
from gpuwarden.errors import UsageError
from gpuwarden.sources import Source
from gpuwarden.units import parse_duration

SCHEMES = ("nvml", "scenario", "smi-csv")
EXAMPLES = "nvml, scenario:scenarios/xid79-one-of-eight.yaml@5m, smi-csv:nvidia-smi.log"


@dataclass(frozen=True)
class SourceSpec:
    scheme: str
    path: str | None = None
    at: float | None = None  # seconds into a recording

    @property
    def replay(self) -> bool:
        return self.scheme != "nvml"


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
    if at_sep:
        try:
            at = parse_duration(at_text)
        except ValueError as exc:
            raise UsageError(
                f"--source {text}: the time after @ is not a duration: {exc}",
                "write e.g. @90s, @2m30s or @1h",
            ) from None
    if not Path(path).is_file():
        what = "is a directory" if Path(path).is_dir() else "no such file"
        raise UsageError(
            f"--source {scheme}:{path}: {what}",
            f"shipped examples are in scenarios/ (for example {EXAMPLES})",
        )
    return SourceSpec(scheme, path, at)


def open_source(spec: SourceSpec, config: Config) -> Source:
    """Open the source ``spec`` names. A replay source keeps its recording's own start time;
    the caller positions it (see ``ReplaySource``)."""
    from gpuwarden.sources.procs import Attributor

    host = host_name(config)
    attributor = Attributor(config.priorities)
    if spec.scheme == "nvml":
        from gpuwarden.sources.nvml import NvmlSource

        return NvmlSource(attributor, host=host)
    assert spec.path is not None
    if spec.scheme == "scenario":
        from gpuwarden.sources.scenario import ScenarioSource

        return ScenarioSource.open(spec.path, priorities=config.priorities, attributor=attributor)
    from gpuwarden.sources.smi_csv import SmiCsvSource

    return SmiCsvSource(spec.path, host=config.host)
