"""Incidents as Alertmanager alerts: what to post, and when. Pure: no I/O, no clock.

A rule's notify step that names a target of ``type: alertmanager`` makes each of its incidents
one alert there, identified by its labels::

    alertname=<rule> severity=<severity> host=<host> gpu=<index> uuid=<GPU uuid> job=<job>

plus the target's own ``labels`` (and ``mode=drill`` or ``mode=dry-run`` when a drill or a
dry run is told). Annotations carry the incident id, a link to its journal (the target's
``link``, else the command that shows it), a summary and the rule's description. Grouping,
silences, inhibition and repeats are Alertmanager's; gpuwarden only keeps the alert's state
current there:

- a **firing post** when the incident is first notified, then one every ``resend`` seconds
  while it is open (Alertmanager forgets an alert whose ``endsAt`` passed: each firing post is
  valid for ``VALID_FOR`` resend intervals, counted from when it is delivered, so an alert
  whose host died resolves by itself);
- a **resolve post** (``endsAt`` = when it resolved) when the incident resolves, and once more
  ``resend`` seconds later (Alertmanager keeps a firing alert whose new ``endsAt`` is still
  ahead of its own clock: the second post settles it when the clocks differ by less than
  ``resend``).

Each post is one outbox row (one ``Message``): queued before it is sent, retried while
Alertmanager is down. The body is the alert as JSON (``payload``), completed at delivery by
``posted``; an older post of an incident is never delivered after a newer one (the delivery
skips a row the outbox holds a newer one for).
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuwarden.config import Config, NotifyTarget
from gpuwarden.model import GpuProcess, GpuState, Intent, RuleChange, Transition
from gpuwarden.notify.messages import Message, clean, message_id
from gpuwarden.notify.routing import SEVERITY_RANK
from gpuwarden.playbook.schema import NotifyParams
from gpuwarden.playbook.templates import render

DEFAULT_RESEND = 60.0
VALID_FOR = 4  # resend intervals a firing post keeps the alert firing (as Prometheus does)
RESOLVE_POSTS = 2  # a resolve is posted at once and again one resend interval later
KINDS = ("alert", "alert-resolve")  # the outbox rows' kinds
_GPU = re.compile(r"(?:^|:)gpu:(\d+)")
_PID = re.compile(r"/pid:(\d+)@")


def iso(ts: float) -> str:
    """RFC 3339 in UTC to the millisecond, as Alertmanager reads times."""
    moment = dt.datetime.fromtimestamp(ts, dt.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def is_alertmanager(config: Config, target: str) -> bool:
    spec = config.notify.targets.get(target)
    return spec is not None and spec.type == "alertmanager"


def resend_of(spec: NotifyTarget) -> float:
    return spec.resend if spec.resend is not None else DEFAULT_RESEND


def job_of(process: GpuProcess) -> str:
    """The job a process belongs to, as a label: its Slurm job, else its pod, else its
    container."""
    info = process.info
    return info.slurm_job or info.pod or info.container or ""


def scope_labels(
    scope: str, gpus: Iterable[GpuState], processes: Iterable[GpuProcess]
) -> dict[str, str]:
    """The ``gpu``, ``uuid`` and ``job`` labels of an incident's scope, from one snapshot:
    a process's own job; for a GPU, the job of its processes when they all belong to one."""
    out: dict[str, str] = {}
    gpu = _GPU.search(scope)
    if gpu is None:
        return out
    index = int(gpu.group(1))
    out["gpu"] = str(index)
    for state in gpus:
        if state.index == index and state.uuid:
            out["uuid"] = state.uuid
    on_gpu = [p for p in processes if p.gpu == index]
    pid = _PID.search(scope)
    if pid is not None:
        mine = [p for p in on_gpu if p.pid == int(pid.group(1))]
        job = job_of(mine[0]) if mine else ""
    else:
        jobs = {job_of(p) for p in on_gpu}
        job = next(iter(jobs)) if len(jobs) == 1 else ""
    if job:
        out["job"] = job
    return out


def payload(
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    started: float,
    *,
    ended: float | None = None,
    valid_for: float | None = None,
    link: str | None = None,
) -> str:
    """An outbox body: the alert, with ``endsAt`` when it resolved, or how long a firing post
    keeps it firing once delivered (``valid_for`` seconds)."""
    alert: dict[str, Any] = {
        "labels": dict(labels),
        "annotations": dict(annotations),
        "startsAt": iso(started),
    }
    if link:
        alert["generatorURL"] = link
    if ended is not None:
        alert["endsAt"] = iso(max(ended, started))
    body: dict[str, Any] = {"alert": alert}
    if valid_for is not None:
        body["valid_for"] = valid_for
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def posted(body: str, now: float) -> dict[str, Any]:
    """The alert to post now from an outbox body (``ValueError`` when it is not one)."""
    try:
        doc = json.loads(body)
        alert = dict(doc["alert"])
        labels = alert["labels"]
    except (ValueError, KeyError, TypeError):
        raise ValueError("the outbox row holds no alert") from None
    if not isinstance(labels, dict) or not labels.get("alertname"):
        raise ValueError("the outbox row's alert has no alertname")
    valid_for = doc.get("valid_for")
    if "endsAt" not in alert and isinstance(valid_for, int | float):
        alert["endsAt"] = iso(now + float(valid_for))
    return alert


def labels_of(body: str) -> dict[str, str] | None:
    """The labels of the alert in an outbox body; None when it holds none."""
    try:
        labels = json.loads(body)["alert"]["labels"]
    except (ValueError, KeyError, TypeError):
        return None
    return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else None


@dataclass
class _Alert:
    incident: str
    rule: str
    severity: str
    where: str
    scope: str
    started: float
    targets: list[str] = field(default_factory=list)
    labels: dict[str, str] | None = None  # fixed at the first post: they identify the alert
    next_post: float = 0.0
    resolved: float | None = None
    resolve_posts: int = 0
    announced: bool = False  # Alertmanager has (or had, before a restart) the alert


class AlertBook:
    """The incidents that have alerts on Alertmanager targets, and the posts they are due.

    Feed it the tick's journaled records (``observe``); take the posts with ``due(now)``.
    """

    def __init__(
        self,
        config: Config,
        *,
        host: str,
        marker: str = "",
        descriptions: Mapping[str, str] | None = None,
    ) -> None:
        self.config = config
        self.host = host
        self.mode = {"[DRILL]": "drill", "[DRY-RUN]": "dry-run"}.get(marker, "")
        self.descriptions = dict(descriptions or {})
        self._fired: dict[str, tuple[str, str, str, float]] = {}  # incident: rule, where, ...
        self._alerts: dict[str, _Alert] = {}

    def targets(self) -> list[str]:
        return [n for n, t in self.config.notify.targets.items() if t.type == "alertmanager"]

    # -- in ---------------------------------------------------------------------------------

    def observe(
        self,
        records: Sequence[RuleChange | Intent],
        now: float,
        *,
        gpus: Iterable[GpuState] = (),
        processes: Iterable[GpuProcess] = (),
    ) -> None:
        """One tick's records, and the snapshot the labels of a new alert come from."""
        gpus, processes = tuple(gpus), tuple(processes)
        for record in records:
            if isinstance(record, RuleChange):
                if record.incident is None:
                    continue
                if record.kind == Transition.FIRING:
                    self._fired[record.incident] = (
                        record.rule,
                        record.where,
                        record.scope,
                        record.time,
                    )
                elif record.kind == Transition.RESOLVED:
                    self._fired.pop(record.incident, None)
                    alert = self._alerts.get(record.incident)
                    if alert is not None and alert.resolved is None:
                        alert.resolved = record.time
                        alert.next_post = now
            elif (
                not record.shadow
                and record.kind == "notify"
                and isinstance(record.params, NotifyParams)
            ):
                self._notify(record, record.params.targets, now)
        for alert in self._alerts.values():
            if alert.labels is None and alert.resolved is None:
                alert.labels = self._labels(alert, scope_labels(alert.scope, gpus, processes))

    def _notify(self, intent: Intent, targets: Sequence[str], now: float) -> None:
        wanted = []
        for name in dict.fromkeys(targets):
            spec = self.config.notify.targets.get(name)
            if spec is None or spec.type != "alertmanager":
                continue
            if SEVERITY_RANK.get(intent.severity, 0) >= SEVERITY_RANK[spec.min_severity]:
                wanted.append(name)
        if not wanted:
            return
        alert = self._alerts.get(intent.incident)
        if alert is None:
            rule, where, scope, started = self._fired.get(
                intent.incident, (intent.rule, intent.where, intent.scope, intent.time)
            )
            alert = _Alert(intent.incident, rule, intent.severity, where, scope, started)
            alert.next_post = now
            self._alerts[intent.incident] = alert
        alert.targets += [t for t in wanted if t not in alert.targets]

    def restore(self, incident: str, labels: Mapping[str, str]) -> None:
        """An incident taken back after a restart keeps the labels it was posted with (they
        identify its alert); call after its records were replayed through ``observe``."""
        alert = self._alerts.get(incident)
        if alert is not None:
            alert.labels = dict(labels)
            alert.announced = True

    def _labels(self, alert: _Alert, facts: Mapping[str, str]) -> dict[str, str]:
        labels = {"alertname": alert.rule, "severity": alert.severity, "host": self.host}
        labels.update(facts)
        if self.mode:
            labels["mode"] = self.mode
        return labels

    # -- out --------------------------------------------------------------------------------

    def due(self, now: float) -> list[Message]:
        """The posts due now, one per (incident, target); resolved alerts are forgotten once
        their resolve posts are out (at once, when Alertmanager never had them)."""
        out: list[Message] = []
        for incident, alert in list(self._alerts.items()):
            if alert.labels is None:
                if alert.resolved is None:
                    continue  # its labels come with the next snapshot
                alert.labels = self._labels(alert, {})
            if now < alert.next_post:
                continue
            if alert.resolved is not None:
                if not alert.announced:
                    del self._alerts[incident]
                    continue
                out += [self._message(alert, t, now, resolve=True) for t in alert.targets]
                alert.resolve_posts += 1
                alert.next_post = now + min(self._resend(t) for t in alert.targets)
                if alert.resolve_posts >= RESOLVE_POSTS:
                    del self._alerts[incident]
            else:
                out += [self._message(alert, t, now, resolve=False) for t in alert.targets]
                alert.announced = True
                alert.next_post = now + min(self._resend(t) for t in alert.targets)
        return out

    def _resend(self, target: str) -> float:
        spec = self.config.notify.targets.get(target)
        return DEFAULT_RESEND if spec is None else resend_of(spec)

    def _message(self, alert: _Alert, target: str, now: float, *, resolve: bool) -> Message:
        assert alert.labels is not None
        spec = self.config.notify.targets.get(target)
        labels = dict(spec.labels if spec is not None else {}) | alert.labels
        facts = {"host": self.host, "incident": alert.incident, "rule": alert.rule}
        link = render(spec.link, facts) if spec is not None and spec.link else None
        summary = clean(f"{alert.rule} on {self.host}: {alert.where}", 250)
        annotations = {
            "incident": alert.incident,
            "journal": link or f"gpuwarden incident {alert.incident} (on {self.host})",
            "summary": summary,
        }
        description = self.descriptions.get(alert.rule)
        if description:
            annotations["description"] = clean(description, 1000)
        if resolve:
            body = payload(labels, annotations, alert.started, ended=alert.resolved, link=link)
            kind, key = KINDS[1], alert.resolve_posts
        else:
            valid = VALID_FOR * self._resend(target)
            body = payload(labels, annotations, alert.started, valid_for=valid, link=link)
            kind, key = KINDS[0], round(now * 1000)  # a post at another time is another row
        state = "RESOLVED" if resolve else "FIRING"
        prefix = f"[{self.mode.upper()}] " if self.mode else ""
        return Message(
            id=message_id(f"{self.host}/alert/{alert.incident}", kind, key, target),
            target=target,
            title=clean(f"{prefix}[{state}] {summary}", 250),
            body=body,
            severity=alert.severity,
            kind=kind,
            incidents=(alert.incident,),
            group=f"{self.host}/alert/{alert.incident}",
            created=now,
        )
