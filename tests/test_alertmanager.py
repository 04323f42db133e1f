"""Incidents handed to a real Alertmanager (tests/alertmanager_server.py): grouping across
hosts, silences that suppress and acknowledge, resolves, and an outage the outbox rides out.

Each host is its own ``Notifications`` (its own journal file and outbox) posting through the
real sender; Alertmanager's notifications reach a real webhook receiver.
"""

from __future__ import annotations

import dataclasses
import socket
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpuwarden.clock import SimClock
from gpuwarden.config import Config, Notify, NotifyTarget
from gpuwarden.journal.journal import Journal
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
from gpuwarden.notify import service
from gpuwarden.notify.service import Notifications
from gpuwarden.playbook import loader
from gpuwarden.playbook.schema import NotifyParams
from gpuwarden.runtime import Runtime
from gpuwarden.sources.scenario import ScenarioSource
from tests import alertmanager_server
from tests.alertmanager_server import (  # noqa: F401
    Alertmanager,
    Webhook,
    fixture_alertmanager,
    wait_for,
)

GPU = GpuState(index=0, name="NVIDIA A100", uuid="GPU-5e1f0c2a-0000-4000-8000-000000000001")


@dataclasses.dataclass
class Open:
    """An open incident as the run loop hands it to notifications (the engine's Incident)."""

    id: str
    scope: str = "gpu:0"
    gpu: int | None = 0


SWEEP = GpuProcess(
    pid=4242,
    gpu=0,
    gpu_memory_mib=70000,
    info=ProcessInfo(pid=4242, user="bob", slurm_job="81234", create_time=1.0),
)


def rule_name(what: str) -> str:
    """A rule of the test's own: Alertmanager outlives each test, its groups must not mix."""
    return f"{what}-{uuid.uuid4().hex[:8]}"


def config(url: str, **target: Any) -> Config:
    spec = NotifyTarget(type="alertmanager", urls=(url,), **target)
    return Config(notify=Notify(targets={"fleet": spec}))


class Host:
    """One server's notifications: its own journal file, outbox and sender."""

    def __init__(self, tmp: Path, name: str, cfg: Config, *, behind: float = 1.0) -> None:
        self.name = name
        # ``behind`` the real clock: what a test advances it by must stay in Alertmanager's
        # past (a resolve whose endsAt is ahead of its clock does not end the alert yet), and
        # an alert that started more than group_wait ago is sent at once, ungrouped.
        self.clock = SimClock(start=time.time() - behind)
        self.told = Notifications(
            cfg,
            tmp / name / "journal.db",
            host=name,
            background=False,
            clock=self.clock,
            descriptions={},
        )

    def incident(self, rule: str) -> str:
        return f"20261201T000000Z-{rule}-gpu:0"

    def fires(self, rule: str) -> str:
        now = self.clock.now()
        incident = self.incident(rule)
        records: Sequence[RuleChange | Intent] = [
            RuleChange(
                Transition.FIRING, rule, "gpu:0", now, Reason.FOR_ELAPSED, incident, where="GPU 0"
            ),
            Intent(
                id=f"{incident}/0",
                incident=incident,
                rule=rule,
                scope="gpu:0",
                step=0,
                kind="notify",
                label="notify fleet",
                time=now,
                reason=Reason.STEP_DUE,
                severity="critical",
                gpu=0,
                params=NotifyParams(targets=("fleet",)),
                where="GPU 0",
            ),
        ]
        self.told.observe(records, Snapshot("node-1", now, (GPU,), (SWEEP,)), [Open(incident)], now)
        return incident

    def resolves(self, rule: str) -> None:
        now = self.clock.now()
        change = RuleChange(
            Transition.RESOLVED, rule, "gpu:0", now, Reason.RESOLVED, self.incident(rule)
        )
        self.told.observe([change], Snapshot("node-1", now, (GPU,)), (), now)

    def send(self) -> int:
        """Queue what is due and deliver it now (the daemon's sender thread, in this one)."""
        self.told.flush(self.clock.now())
        return self.told.deliver_now()

    def rows(self) -> list[Any]:
        return self.told.outbox.rows()

    def close(self) -> None:
        self.told.close(self.clock.now())


def hosts_in(notification: dict[str, Any]) -> list[str]:
    return sorted(a["labels"]["host"] for a in notification["alerts"])


def test_one_rule_on_three_hosts_pages_once_and_the_resolve_arrives(
    tmp_path: Path, alertmanager: Alertmanager
) -> None:
    rule = rule_name("gpu-memory-pressure")
    cfg = config(alertmanager.url, labels={"cluster": "train-a"})
    hosts = [Host(tmp_path, f"node-{n}", cfg) for n in (1, 2, 3)]
    for host in hosts:
        host.fires(rule)
        assert host.send() == 1
        [row] = host.rows()
        assert row.status == "sent"

    [first] = wait_for(lambda: alertmanager.webhook.about(rule), "no notification for the rule")

    assert first["status"] == "firing"
    assert hosts_in(first) == ["node-1", "node-2", "node-3"]  # one page for the fleet
    alert = next(a for a in first["alerts"] if a["labels"]["host"] == "node-2")
    assert alert["labels"] == {
        "alertname": rule,
        "severity": "critical",
        "host": "node-2",
        "gpu": "0",
        "uuid": GPU.uuid,
        "job": "81234",
        "cluster": "train-a",
    }
    incident = hosts[1].incident(rule)
    assert alert["annotations"]["incident"] == incident
    assert alert["annotations"]["journal"] == f"gpuwarden incident {incident} (on node-2)"
    assert alert["annotations"]["summary"] == f"{rule} on node-2: GPU 0"

    for host in hosts:
        host.resolves(rule)
        assert host.send() == 1

    def resolved() -> list[dict[str, Any]]:
        return [n for n in alertmanager.webhook.about(rule) if n["status"] == "resolved"]

    [done] = wait_for(resolved, "no resolved notification")
    assert hosts_in(done) == ["node-1", "node-2", "node-3"]
    assert {a["status"] for a in done["alerts"]} == {"resolved"}
    firing = [n for n in alertmanager.webhook.about(rule) if n["status"] == "firing"]
    assert len(firing) == 1  # nobody was paged again before the resolve
    assert alertmanager.alerts(alertname=rule) == []
    for host in hosts:
        host.close()


def test_a_silence_suppresses_the_alert_and_acknowledges_the_incident(
    tmp_path: Path, alertmanager: Alertmanager
) -> None:
    rule, canary = rule_name("silenced"), rule_name("canary")
    node = Host(tmp_path, "node-7", config(alertmanager.url, ack_on_silence=True))
    other = Host(tmp_path, "node-8", config(alertmanager.url))
    silence = alertmanager.silence(
        by="alice", comment="draining node-7", alertname=rule, host="node-7"
    )

    incident = node.fires(rule)
    assert node.send() == 1
    other.fires(canary)  # posted after, grouped alike: once it is told, so would the rule be
    assert other.send() == 1

    wait_for(lambda: alertmanager.webhook.about(canary), "no notification for the canary")
    assert alertmanager.webhook.about(rule) == []  # suppressed: nobody was paged
    [held] = alertmanager.alerts(alertname=rule)
    assert held["status"]["state"] == "suppressed"
    assert held["status"]["silencedBy"] == [silence]

    assert node.told.silences.poll_once() == 1
    assert node.told.silenced() == {
        incident: f"Alertmanager silence {silence} by alice: draining node-7"
    }
    assert node.told.silenced() == {}  # each incident once
    assert other.told.silences.targets == {}  # without ack_on_silence nothing is asked
    node.close()
    other.close()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_while_alertmanager_is_down_the_outbox_keeps_the_alerts_and_sends_the_newest_state(
    tmp_path: Path, alertmanager: Alertmanager
) -> None:
    port = free_port()
    rule = rule_name("outage")
    node = Host(tmp_path, "node-4", config(f"http://127.0.0.1:{port}", resend=60.0), behind=10)

    node.fires(rule)
    assert node.send() == 1
    [row] = node.rows()
    assert (row.status, row.attempts) == ("pending", 1)  # kept, to be tried again
    assert row.last_error is not None
    assert "Connection refused" in row.last_error

    # Still down: the incident resolves. The resolve is queued behind the firing post, which
    # waits for its retry; the resolve is due first.
    node.clock.advance(2)
    node.resolves(rule)
    node.told.flush(node.clock.now())
    assert [r.kind for r in node.told.outbox.pending()] == ["alert", "alert-resolve"]

    webhook = Webhook().start()
    back = alertmanager_server.start(tmp_path / "am", webhook, address=f"127.0.0.1:{port}")
    try:
        node.clock.advance(60)  # past the firing post's retry
        assert node.told.deliver_now() == 2
        assert {r.status for r in node.rows()} == {"sent"}
        # Only the resolve was posted: the older firing post, delivered after it, would
        # have fired the alert again. A canary posted afterwards is told; the rule is not.
        canary = rule_name("canary")
        later = Host(tmp_path, "node-6", config(back.url))
        later.fires(canary)
        assert later.send() == 1
        wait_for(lambda: webhook.about(canary), "no notification for the canary")
        assert webhook.about(rule) == []
        assert back.alerts(alertname=rule) == []
        later.close()
    finally:
        alertmanager_server.stop(back)
        webhook.stop()
        node.close()


def test_an_open_incident_is_posted_again_each_resend_interval(
    tmp_path: Path, alertmanager: Alertmanager
) -> None:
    rule = rule_name("resend")
    node = Host(tmp_path, "node-5", config(alertmanager.url, resend=30.0))
    node.fires(rule)
    assert node.send() == 1
    [before] = alertmanager.alerts(alertname=rule)

    node.clock.advance(29)
    assert node.send() == 0
    node.clock.advance(1)
    assert node.send() == 1

    [after] = alertmanager.alerts(alertname=rule)
    assert after["fingerprint"] == before["fingerprint"]  # the same alert, kept alive
    assert after["endsAt"] > before["endsAt"]
    assert after["startsAt"] == before["startsAt"]
    node.resolves(rule)
    node.send()
    node.close()


def test_notify_test_posts_a_test_alert(alertmanager: Alertmanager) -> None:
    cfg = config(alertmanager.url)

    [result] = service.test_target(cfg, "fleet", host="node-test")

    assert result.ok, result.detail
    assert result.url == alertmanager.url  # http(s) URLs show their host
    [alert] = alertmanager.alerts(alertname="GpuwardenTest", host="node-test")
    assert alert["labels"]["severity"] == "info"


SCENARIO = """\
version: 1
name: full-gpu
description: GPU 0 is full from the start.
host: node-9
start: 2026-12-01T00:00:00Z
gpus:
  - {index: 0, name: NVIDIA A100, memory_total_mib: 81920}
timeline:
  - at: 0s
    gpus:
      0: {memory_used_mib: 81000}
  - at: 10m
    end: true
"""

PLAYBOOK = """\
rules:
  - name: {rule}
    description: GPU 0 is full.
    for_each: gpu
    when: gpu.memory.used_pct > 90
    severity: critical
    pause_on_ack: true
    steps:
      - notify: fleet
      - after: 2m
        notify: {{targets: [fleet], message: "still full"}}
"""


def test_a_silence_pauses_a_pause_on_ack_ladder_in_the_daemon(
    tmp_path: Path, alertmanager: Alertmanager
) -> None:
    rule = rule_name("paused")
    cfg = config(alertmanager.url, ack_on_silence=True)
    (tmp_path / "scenario.yaml").write_text(SCENARIO)
    (tmp_path / "rules.yaml").write_text(PLAYBOOK.format(rule=rule))
    playbooks = loader.load([tmp_path / "rules.yaml"], cfg)
    source = ScenarioSource.open(tmp_path / "scenario.yaml", spawn=False)
    clock = SimClock(start=time.time())
    source.start_time = clock.now()
    path = tmp_path / "state" / "journal.db"
    told = Notifications(cfg, path, host="node-9", background=False, clock=clock)
    runtime = Runtime(
        cfg, source, playbooks, Journal(path), clock=clock, host="node-9", notifications=told
    )

    runtime.tick()  # fires, and the first step notifies
    told.deliver_now()
    [incident] = runtime.engine.incidents
    [alert] = alertmanager.alerts(alertname=rule)
    assert alert["annotations"]["incident"] == incident.id
    alertmanager.silence(comment="looking", alertname=rule, host="node-9")
    wait_for(told.silences.poll_once, "the silence was not seen")
    clock.advance(cfg.tick)
    runtime.tick()  # the silence is the acknowledgement
    clock.advance(180)
    runtime.tick()  # the second step is due, and waits
    runtime.shutdown()

    with Journal.open_readonly(path) as journal:
        [row] = journal.incidents()
        assert row.acked_at is not None
        timeline = journal.timeline(row.id)
    steps = [r for r in timeline if r.kind == "step"]
    assert [s.step for s in steps] == [0]  # the second notify never ran
    assert any(r.kind == "ack" for r in timeline)
    waiting = [r for r in timeline if r.kind == "waiting"]
    assert waiting
    assert waiting[-1].reason == "acknowledged"
