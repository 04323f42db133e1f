"""What a report shows, as plain data: the incidents, their rules, the steps, the messages,
and the readings of each GPU. ``journal.py`` and ``drill.py`` of this package fill it in from
their sources; ``page.py`` draws it. Times are seconds since the epoch (UTC)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuwarden.playbook.thresholds import Threshold, fields_read, thresholds
from gpuwarden.report.series import GpuSeries


@dataclass(frozen=True)
class RuleView:
    """A rule as the report draws it: its conditions, and the numbers they compare with."""

    name: str
    when: str
    until: str | None = None
    for_s: float = 0.0
    description: str = ""
    note: str = ""  # where the rule's text came from, when not from the incident's record

    @property
    def when_lines(self) -> list[Threshold]:
        return thresholds(self.when)

    @property
    def until_lines(self) -> list[Threshold]:
        return thresholds(self.until)

    @property
    def fields(self) -> list[str]:
        found = fields_read(self.when)
        return found + [f for f in fields_read(self.until) if f not in found]


@dataclass(frozen=True)
class IncidentView:
    id: str | None  # None: a rule that went pending and never fired
    rule: str
    scope: str
    where: str
    gpu: int | None
    severity: str | None = None
    pending_at: float | None = None
    opened_at: float | None = None
    resolved_at: float | None = None
    resolve_reason: str | None = None
    cancelled_at: float | None = None  # a pending stretch that ended without firing
    cancel_reason: str | None = None
    shadow: bool = False
    acked_at: float | None = None

    @property
    def pid(self) -> int | None:
        """The process of a process-scoped rule (``gpu:0/pid:4242@…``)."""
        _, _, rest = self.scope.partition("/pid:")
        number = rest.partition("@")[0]
        return int(number) if number.isdigit() else None


@dataclass(frozen=True)
class TargetView:
    pid: int
    user: str | None
    priority: str
    gpu_memory_mib: int | None = None
    command: str = ""
    gpu: int | None = None
    job: str | None = None


@dataclass(frozen=True)
class ResultView:
    pid: int | None
    state: str
    ok: bool
    detail: str = ""


@dataclass(frozen=True)
class StepView:
    """One step of an incident's ladder, and what became of it."""

    number: int  # 1, 2, ... in time order over the whole report (marker labels use it)
    incident: str
    rule: str
    gpu: int | None
    index: int
    kind: str
    label: str
    time: float
    reason: str
    targets: tuple[TargetView, ...] = ()
    skipped: tuple[tuple[TargetView, str], ...] = ()
    status: str = "planned"  # planned | done | failed | interrupted | simulated
    finished_at: float | None = None
    detail: str = ""
    results: tuple[ResultView, ...] = ()
    what: str = ""  # for a step without targets: "→ oncall", "→ GPU 0 limited to 250 W"
    shadow: bool = False
    dry_run: bool = False


@dataclass(frozen=True)
class NoteView:
    """A record that is not a step but says why something did not happen (or happened
    differently): a step waiting for its condition, one refused because it already ran, one
    interrupted by a stop."""

    time: float
    incident: str | None
    rule: str
    kind: str
    reason: str
    text: str
    step: int | None = None


@dataclass(frozen=True)
class NoticeView:
    """One message for one target."""

    time: float
    target: str
    title: str
    status: str  # sent | pending | failed | dropped | not delivered (drill)
    kind: str = ""
    severity: str = ""
    body: str = ""
    attempts: int = 0
    error: str | None = None
    sent_at: float | None = None


@dataclass
class Report:
    """Everything one page shows."""

    kind: str  # "incident" | "drill"
    title: str
    subtitle: str
    host: str
    start: float
    end: float
    origin: float  # time zero of the axis labels for drills (the scenario's start)
    facts: list[tuple[str, str]] = field(default_factory=list)  # (label, value) under the title
    incidents: list[IncidentView] = field(default_factory=list)
    rules: dict[str, RuleView] = field(default_factory=dict)
    gpus: dict[int, GpuSeries] = field(default_factory=dict)
    steps: list[StepView] = field(default_factory=list)
    notes: list[NoteView] = field(default_factory=list)
    notices: list[NoticeView] = field(default_factory=list)
    notices_note: str = ""  # e.g. "drill: composed, not delivered"
    remarks: list[str] = field(default_factory=list)  # what the report could not show, and why
    generated_at: float | None = None
    version: str = ""

    @property
    def relative(self) -> bool:
        """Axis labels as offsets from ``origin`` (drills) rather than UTC clock times."""
        return self.kind == "drill"
