"""Incidents as Alertmanager alerts, decided without Alertmanager: labels, the posting
schedule, what a delivery completes, the config's rules for such targets, and a restart that
keeps an alert's identity. (tests/test_alertmanager.py runs the real one.)"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpuwarden import config as config_mod
from gpuwarden.config import Config, Notify, NotifyTarget
from gpuwarden.errors import InputError
from gpuwarden.model import (
    GpuProcess,
    GpuState,
    Intent,
    ProcessInfo,
    Reason,
    RuleChange,
    Snapshot,
    Transition,
)
from gpuwarden.notify import alerts
from gpuwarden.notify.alerts import AlertBook, posted, scope_labels
from gpuwarden.notify.notifier import Notifier
from gpuwarden.notify.service import Notifications
from gpuwarden.playbook.schema import NotifyParams

T0 = 1_796_000_000.0
UUID = "GPU-0000"
GPUS = (GpuState(index=0, uuid=UUID), GpuState(index=1, uuid="GPU-1111"))


@dataclasses.dataclass
class Open:
    """An open incident as the run loop hands it to notifications (the engine's Incident)."""

    id: str
    scope: str = "gpu:0"
    gpu: int | None = 0


def proc(pid: int, gpu: int, **info: Any) -> GpuProcess:
    return GpuProcess(pid, gpu, 1000, ProcessInfo(pid=pid, create_time=5.0, **info))


def cfg(**fleet: Any) -> Config:
    targets = {
        "fleet": NotifyTarget(type="alertmanager", urls=("http://am:9093",), **fleet),
        "oncall": NotifyTarget(urls=("json://127.0.0.1:9/hook",)),
    }
    return Config(notify=Notify(targets=targets))


def firing(rule: str = "mem", scope: str = "gpu:0", at: float = T0) -> RuleChange:
    return RuleChange(
        Transition.FIRING, rule, scope, at, Reason.FOR_ELAPSED, f"inc-{rule}", where="GPU 0"
    )


def notify(
    rule: str = "mem",
    targets: tuple[str, ...] = ("fleet", "oncall"),
    *,
    severity: str = "critical",
    shadow: bool = False,
    at: float = T0,
) -> Intent:
    return Intent(
        id=f"inc-{rule}/0",
        incident=f"inc-{rule}",
        rule=rule,
        scope="gpu:0",
        step=0,
        kind="notify",
        label="notify",
        time=at,
        reason=Reason.STEP_DUE,
        severity=severity,
        shadow=shadow,
        gpu=0,
        params=NotifyParams(targets=targets),
        where="GPU 0",
    )


def resolved(rule: str = "mem", at: float = T0) -> RuleChange:
    return RuleChange(Transition.RESOLVED, rule, "gpu:0", at, Reason.RESOLVED, f"inc-{rule}")


def body(message: Any) -> dict[str, Any]:
    return json.loads(message.body)  # type: ignore[no-any-return]


# -- labels -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scope", "processes", "expected"),
    [
        ("gpu:0", [proc(1, 0, slurm_job="81234")], {"gpu": "0", "uuid": UUID, "job": "81234"}),
        (
            "gpu:0",
            [proc(1, 0, slurm_job="1"), proc(2, 0, slurm_job="2")],
            {"gpu": "0", "uuid": UUID},
        ),
        (
            "gpu:1/pid:2@5.00",
            [proc(1, 1, slurm_job="1"), proc(2, 1, pod="ml/train-0")],
            {"gpu": "1", "uuid": "GPU-1111", "job": "ml/train-0"},
        ),
        (
            "gpu:0/pid:3@5.00",
            [proc(3, 0, container="c0ffee")],
            {"gpu": "0", "uuid": UUID, "job": "c0ffee"},
        ),
        ("event:gpu:1", [], {"gpu": "1", "uuid": "GPU-1111"}),
        ("host", [proc(1, 0, slurm_job="1")], {}),
        ("gpu:7", [], {"gpu": "7"}),
    ],
    ids=[
        "gpu-one-job",
        "gpu-two-jobs",
        "process-pod",
        "process-container",
        "event",
        "host",
        "gpu-unknown",
    ],
)
def test_an_incidents_scope_gives_its_gpu_uuid_and_job(
    scope: str, processes: list[GpuProcess], expected: dict[str, str]
) -> None:
    assert scope_labels(scope, GPUS, processes) == expected


# -- the schedule -------------------------------------------------------------------------------


def book(**fleet: Any) -> AlertBook:
    return AlertBook(cfg(**fleet), host="node-1", descriptions={"mem": "GPU memory is full."})


def test_an_open_incident_is_posted_then_again_every_resend_and_resolved_twice() -> None:
    alerts_ = book(resend=30.0, labels={"cluster": "a"}, link="https://g/${host}/${incident}")
    alerts_.observe([firing(), notify()], T0, gpus=GPUS, processes=[proc(1, 0, slurm_job="9")])

    [first] = alerts_.due(T0)
    assert (first.target, first.kind, first.severity, first.incidents) == (
        "fleet",
        "alert",
        "critical",
        ("inc-mem",),
    )
    assert first.title == "[FIRING] mem on node-1: GPU 0"
    doc = body(first)
    assert doc["valid_for"] == 120.0  # four resend intervals
    assert doc["alert"] == {
        "labels": {
            "alertname": "mem",
            "severity": "critical",
            "host": "node-1",
            "gpu": "0",
            "uuid": UUID,
            "job": "9",
            "cluster": "a",
        },
        "annotations": {
            "incident": "inc-mem",
            "journal": "https://g/node-1/inc-mem",
            "summary": "mem on node-1: GPU 0",
            "description": "GPU memory is full.",
        },
        "startsAt": alerts.iso(T0),
        "generatorURL": "https://g/node-1/inc-mem",
    }
    assert alerts_.due(T0 + 29.9) == []
    [again] = alerts_.due(T0 + 30)
    assert again.id != first.id
    assert body(again)["alert"] == doc["alert"]  # the same alert: same labels, same start

    alerts_.observe([resolved(at=T0 + 40)], T0 + 41)
    [resolve] = alerts_.due(T0 + 41)
    assert resolve.kind == "alert-resolve"
    assert resolve.title.startswith("[RESOLVED] ")
    assert body(resolve)["alert"]["endsAt"] == alerts.iso(T0 + 40)
    assert "valid_for" not in body(resolve)
    assert alerts_.due(T0 + 70) == []
    [second] = alerts_.due(T0 + 71)  # once more, for an Alertmanager whose clock is behind
    assert second.kind == "alert-resolve"
    assert second.id != resolve.id
    assert alerts_.due(T0 + 1000) == []


def test_only_alertmanager_targets_that_take_the_severity_get_alerts() -> None:
    alerts_ = book(min_severity="critical")
    alerts_.observe(
        [firing("warm"), notify("warm", severity="warning"), firing("shadowed")], T0, gpus=GPUS
    )
    alerts_.observe(
        [notify("shadowed", shadow=True), firing("chat"), notify("chat", ("oncall",))],
        T0,
        gpus=GPUS,
    )
    assert alerts_.due(T0) == []


def test_the_notifier_leaves_alertmanager_targets_to_the_alerts() -> None:
    notifier = Notifier(cfg(), host="node-1")
    notifier.observe([firing(), notify()], T0)
    messages = notifier.due(T0 + 3600)
    assert messages
    assert {m.target for m in messages} == {"oncall"}
    assert notifier.tell(["fleet", "oncall"], "k", "t", "b", "info", T0) == 1


def test_a_drill_marks_its_alerts() -> None:
    alerts_ = AlertBook(cfg(), host="node-1", marker="[DRILL]")
    alerts_.observe([firing(), notify()], T0, gpus=GPUS)
    [message] = alerts_.due(T0)
    assert body(message)["alert"]["labels"]["mode"] == "drill"
    assert message.title.startswith("[DRILL] [FIRING] ")


def test_an_incident_resolved_before_its_first_post_is_never_posted() -> None:
    alerts_ = book()
    alerts_.observe([firing(), notify(), resolved()], T0, gpus=GPUS)
    assert alerts_.due(T0) == []
    assert alerts_.due(T0 + 3600) == []


def test_a_delivery_completes_the_alert_at_its_own_time() -> None:
    alerts_ = book(resend=60.0)
    alerts_.observe([firing(), notify()], T0, gpus=GPUS)
    [message] = alerts_.due(T0)
    alert = posted(message.body, T0 + 600)  # delivered late: valid from the delivery on
    assert alert["endsAt"] == alerts.iso(T0 + 600 + 240)
    assert alert["startsAt"] == alerts.iso(T0)
    with pytest.raises(ValueError, match="holds no alert"):
        posted("a message for people", T0)
    with pytest.raises(ValueError, match="no alertname"):
        posted('{"alert": {"labels": {}}}', T0)


def test_a_restart_posts_an_open_incident_with_the_labels_it_had(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    config = cfg()
    first = Notifications(config, path, host="node-1", background=False)
    first.observe(
        [firing(), notify()],
        Snapshot("node-1", T0, GPUS, (proc(1, 0, slurm_job="7"),)),
        [Open("inc-mem")],
        T0,
    )
    first.flush(T0)
    first.close(T0)

    # The journal's incident and its notify step, as the run loop reads them back.
    row = SimpleNamespace(
        id="inc-mem",
        rule="mem",
        scope="gpu:0",
        label="GPU 0",
        opened_at=T0,
        gpu=0,
        severity="critical",
        acked_at=None,
    )
    step = SimpleNamespace(
        kind="step",
        step=0,
        intent="inc-mem/0",
        time=T0,
        data={"step_kind": "notify", "params": {"targets": ["fleet"]}, "label": "notify"},
    )
    again = Notifications(config, path, host="node-1", background=False)
    again.restore(row, [step], T0 + 300)
    # This snapshot knows no uuid, no job.
    again.observe([], Snapshot("node-1", T0 + 300, ()), [Open("inc-mem")], T0 + 300)
    again.flush(T0 + 300)
    rows = [r for r in again.outbox.rows() if r.kind == "alert"]
    assert len(rows) == 2
    before, after = (json.loads(r.body)["alert"]["labels"] for r in rows)
    assert after == before
    assert after["job"] == "7"
    again.close(T0 + 300)


# -- the config ---------------------------------------------------------------------------------


def refused(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "gpuwarden.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as caught:
        config_mod.load(path)
    return [p.render().removeprefix(f"{path}:") for p in caught.value.problems]


HEAD = "notify:\n  targets:\n    fleet:\n      type: alertmanager\n"


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (
            "      urls: [alertmanager:9093]\n",
            "4:7: notify.targets.fleet: 'alertmanager:9093' is not an Alertmanager URL: write "
            "its base URL, e.g. http://alertmanager:9093",
        ),
        (
            "      min_severity: warning\n",
            "4:7: notify.targets.fleet: an alertmanager target needs urls: Alertmanager's "
            "base URL, one per instance of a cluster, e.g. http://alertmanager:9093",
        ),
        (
            "      urls: [http://am:9093]\n      quiet_hours: 'Mon-Fri 22:00-07:00'\n",
            "4:7: notify.targets.fleet: quiet_hours: not for a target of type alertmanager "
            "(Alertmanager's own routes, time intervals and receivers do that); remove them",
        ),
        (
            "      urls: [http://am:9093]\n      labels: {severity: low}\n",
            "6:15: notify.targets.fleet.labels: label 'severity' is gpuwarden's own "
            "(alertname, severity, host, gpu, uuid, job, mode); choose another name",
        ),
        (
            "      urls: [http://am:9093]\n      labels: {'9x': a}\n",
            "6:15: notify.targets.fleet.labels: '9x' is not a label name: letters, digits and "
            "'_', not starting with a digit",
        ),
        (
            "      urls: [http://am:9093]\n      link: 'https://g/${pid}'\n",
            "6:13: notify.targets.fleet.link: unknown placeholder ${pid}: a link may use "
            "${host}, ${incident}, ${rule}",
        ),
    ],
    ids=["not-a-url", "no-urls", "quiet-hours", "own-label", "bad-label", "bad-link"],
)
def test_a_bad_alertmanager_target_is_refused_at_its_position(
    tmp_path: Path, lines: str, expected: str
) -> None:
    assert refused(tmp_path, HEAD + lines) == [expected]


def test_alertmanager_settings_on_an_apprise_target_are_refused(tmp_path: Path) -> None:
    text = "notify:\n  targets:\n    chat:\n      urls: [json://h/x]\n      resend: 1m\n"
    assert refused(tmp_path, text) == [
        "4:7: notify.targets.chat: resend: only for a target of type alertmanager; add "
        "type: alertmanager or remove them"
    ]


def test_an_alertmanager_target_is_neither_admin_nor_fallback(tmp_path: Path) -> None:
    fleet = HEAD + "      urls: [http://am:9093]\n"
    chat = "    chat:\n      urls: [json://h/x]\n      fallback: fleet\n"
    [problem] = refused(tmp_path, fleet + chat)
    assert problem.endswith(
        "notify target 'chat' falls back to 'fleet', an alertmanager target: a fallback "
        "receives messages, not alerts"
    )
    [problem] = refused(tmp_path, fleet + "  admin: fleet\n")
    assert "notify.admin 'fleet' is an alertmanager target" in problem


def test_a_full_alertmanager_target_loads(tmp_path: Path) -> None:
    path = tmp_path / "gpuwarden.yaml"
    path.write_text(
        HEAD
        + "      urls: [http://am-0:9093, 'https://u:p@am-1.example:9093/am']\n"
        + "      min_severity: warning\n      resend: 30s\n      labels: {cluster: train-a}\n"
        + "      link: 'https://grafana.example/d/gw?var-host=${host}&var-incident=${incident}'\n"
        + "      ack_on_silence: true\n"
    )
    spec = config_mod.load(path).notify.targets["fleet"]
    assert (spec.type, spec.resend, spec.ack_on_silence) == ("alertmanager", 30.0, True)
    assert spec.labels == {"cluster": "train-a"}
    assert alerts.resend_of(spec) == 30.0
    assert alerts.resend_of(NotifyTarget(type="alertmanager", urls=("http://a",))) == 60.0
