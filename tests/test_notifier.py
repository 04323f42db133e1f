"""The notifier driven by the real engine over the shipped memory-pressure playbook and the
shipped config: what people are told, when, and how often.

Each test plays snapshots on a fake clock (a tick every 2 s), completes every step the way an
executor would (a kill terminates its targets), and collects what ``Notifier.due`` returns.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuwarden import config as config_module
from gpuwarden.config import Config
from gpuwarden.engine.engine import Engine
from gpuwarden.model import (
    Event,
    EventKind,
    GpuProcess,
    GpuState,
    Intent,
    Memory,
    Outcome,
    ProcessInfo,
    Snapshot,
    TargetResult,
)
from gpuwarden.notify.messages import Message, gpu_facts
from gpuwarden.notify.notifier import Notifier
from gpuwarden.playbook.loader import load

ROOT = Path(__file__).resolve().parent.parent
T0 = datetime.datetime(2026, 3, 14, 2, 58, tzinfo=datetime.UTC).timestamp()  # a Saturday
TOTAL = 81920
HOST = "gpu-node-07"


def shipped_config(**notify: object) -> Config:
    cfg = config_module.load(ROOT / "config" / "gpuwarden.yaml")
    return cfg.model_copy(update={"notify": cfg.notify.model_copy(update=notify)})


def gpu(index: int, used_mib: int) -> GpuState:
    memory = Memory(TOTAL, used_mib, TOTAL - used_mib)
    return GpuState(index=index, memory=memory, temperature_c=76, utilization_pct=99)


def proc(pid: int, index: int, mib: int, user: str, priority: str, cmd: str) -> GpuProcess:
    info = ProcessInfo(
        pid=pid,
        name=cmd.split(maxsplit=1)[0],
        cmdline=tuple(cmd.split()),
        user=user,
        uid=1000 + pid % 100,
        create_time=T0 - 3600,
        status="running",
        priority=priority,
        checkpoint_signal="SIGUSR1" if priority == "high" else None,
    )
    return GpuProcess(pid=pid, gpu=index, gpu_memory_mib=mib, info=info)


class Machine:
    """GPUs with a trainer and a sweep each; a terminated sweep leaves its GPU."""

    def __init__(self, gpus: tuple[int, ...], sweep_mib: int = 28900) -> None:
        self.gpus = gpus
        self.sweep_mib = sweep_mib
        self.killed: set[int] = set()

    def snapshot(self, now: float) -> Snapshot:
        states, procs = [], []
        for index in self.gpus:
            trainer = proc(4000 + index, index, 52000, "alice", "high", "python train.py")
            sweep = proc(4200 + index, index, self.sweep_mib, "bob", "low", "python sweep.py")
            alive = [trainer] + ([] if sweep.pid in self.killed else [sweep])
            states.append(gpu(index, 500 + sum(p.gpu_memory_mib or 0 for p in alive)))
            procs.extend(alive)
        return Snapshot(HOST, now, tuple(states), tuple(procs))

    def outcome(self, intent: Intent) -> Outcome:
        if intent.kind != "kill":
            return Outcome(ok=True, detail="done")
        for target in intent.targets:
            self.killed.add(target.pid)
        results = tuple(
            TargetResult(t.pid, t.create_time, ok=True, state="terminated") for t in intent.targets
        )
        return Outcome(ok=True, targets=results)


def play(
    cfg: Config,
    machine: Machine,
    seconds: float,
    *,
    marker: str = "",
    notifier: Notifier | None = None,
    start: float = 0.0,
    engine: Engine | None = None,
    between: Callable[[Notifier, float], None] | None = None,
) -> tuple[list[tuple[float, Message]], Notifier, Engine]:
    playbooks = load([ROOT / "playbooks" / "memory-pressure.yaml"], cfg)
    engine = engine or Engine(playbooks, cfg)
    descriptions = {r.name: r.spec.description for r in playbooks.rules}
    notifier = notifier or Notifier(cfg, host=HOST, marker=marker, descriptions=descriptions)
    out: list[tuple[float, Message]] = []
    t = start
    while t <= seconds:
        now = T0 + t
        snapshot = machine.snapshot(now)
        tick = engine.step(snapshot, now)
        facts = {
            i.id: gpu_facts(state)
            for i in engine.incidents
            if i.gpu is not None and (state := snapshot.gpu(i.gpu)) is not None
        }
        notifier.observe(tick.records, now, incidents=facts)
        for intent in tick.intents:
            outcome = machine.outcome(intent)
            engine.complete(intent.id, outcome)
            notifier.observe_outcome(intent, outcome, now)
        if between is not None:
            between(notifier, t)
        out.extend((t, m) for m in notifier.due(now))
        t += 2.0
    return out, notifier, engine


def test_one_open_one_kill_one_resolve_to_oncall() -> None:
    cfg = shipped_config(group_interval=60.0)
    sent, _, _ = play(cfg, Machine((0,)), 600)
    assert [(t, m.kind, m.target) for t, m in sent] == [
        (60.0, "open", "oncall"),  # fired at 30 s, group_wait 30 s
        (150.0, "step", "oncall"),  # the kill's outcome, a minute after the open
        (210.0, "resolve", "oncall"),  # resolved at 152 s, a group_interval after the step
    ]
    opened, kill, resolve = (m for _, m in sent)
    assert opened.title == "[CRITICAL] GPU memory pressure on gpu-node-07: GPU 0"
    assert "A GPU is nearly out of memory; free it before jobs crash." in opened.body
    assert "GPU 0: memory 99.4 % used" in opened.body
    incident = opened.incidents[0]
    assert f"gpuwarden incident {incident}" in opened.body
    assert opened.severity == "critical"
    assert opened.notify_type == "failure"
    assert "kill pid 4200 (bob, low, 28900 MiB, python sweep.py): terminated" in kill.body
    assert resolve.title == "[RESOLVED] GPU memory pressure on gpu-node-07: GPU 0"
    assert resolve.notify_type == "success"
    assert resolve.incidents == (incident,)
    assert len({m.id for m in (opened, kill, resolve)}) == 3


def test_default_interval_batches_the_kill_into_the_resolve() -> None:
    sent, _, _ = play(shipped_config(), Machine((0,)), 600)
    assert [(t, m.kind) for t, m in sent] == [(60.0, "open"), (360.0, "resolve")]
    assert "kill pid 4200" in sent[1][1].body
    assert "terminated" in sent[1][1].body


def test_eight_gpus_in_one_tick_make_one_open_message() -> None:
    sent, _, _ = play(shipped_config(), Machine(tuple(range(8))), 62)
    assert len(sent) == 1
    message = sent[0][1]
    assert message.title == (
        "[CRITICAL] GPU memory pressure on gpu-node-07: GPUs 0, 1, 2, 3, 4, 5, 6, 7"
    )
    assert len(message.incidents) == 8
    assert message.body.count("memory 99.4 % used") == 8


def test_a_gpu_joining_later_goes_out_as_one_update() -> None:
    machine = Machine((0,))

    def add_gpu(notifier: Notifier, t: float) -> None:
        if t == 100.0:
            machine.gpus = (0, 3)

    cfg = shipped_config(group_interval=120.0)
    machine.sweep_mib = 29000
    playbooks = load([ROOT / "playbooks" / "memory-pressure.yaml"], cfg)
    # no kill succeeds: the sweep stays, so both incidents stay open
    engine = Engine(playbooks, cfg)
    machine.outcome = lambda intent: Outcome(ok=False, detail="denied")  # type: ignore[method-assign]
    sent, _, _ = play(cfg, machine, 200, engine=engine, between=add_gpu)
    kinds = [(t, m.kind) for t, m in sent]
    assert kinds[0] == (60.0, "open")
    assert kinds[1] == (180.0, "step")
    update = sent[1][1]
    assert "GPU 3 joined" in update.body
    assert update.title.endswith("GPUs 0, 3 (update)")


def test_reminders_every_repeat_until_acknowledged() -> None:
    cfg = shipped_config(repeat=600.0)
    machine = Machine((0,))
    machine.outcome = lambda intent: Outcome(ok=False, detail="denied")  # type: ignore[method-assign]
    acked: list[str] = []

    def ack(notifier: Notifier, t: float) -> None:
        if t == 1500.0:
            (incident,) = notifier.grouper.open_incidents()
            assert notifier.ack(incident, T0 + t)
            acked.append(incident)

    sent, _, _ = play(cfg, machine, 3600, between=ack)
    reminders = [t for t, m in sent if m.kind == "reminder"]
    # open at 60; the kill's failure at 360 (group_interval after the open) counts as a
    # message; then every 600 s until the ack at 1500.
    assert [t for t, m in sent if m.kind != "reminder"] == [60.0, 360.0]
    assert reminders == [960.0]
    assert acked
    reminder = next(m for t, m in sent if m.kind == "reminder")
    assert reminder.title.startswith("[REMINDER] GPU memory pressure on gpu-node-07: GPU 0")
    assert f"gpuwarden ack {acked[0]}" in reminder.body


def test_repeat_zero_never_reminds() -> None:
    machine = Machine((0,))
    machine.outcome = lambda intent: Outcome(ok=False, detail="denied")  # type: ignore[method-assign]
    sent, _, _ = play(shipped_config(repeat=0.0), machine, 8000)
    assert [m.kind for _, m in sent] == ["open", "step"]


@pytest.mark.parametrize("marker", ["[DRILL]", "[DRY-RUN]"])
def test_markers_lead_every_title(marker: str) -> None:
    sent, _, _ = play(shipped_config(group_interval=60.0), Machine((0,)), 300, marker=marker)
    assert len(sent) == 3
    for _, message in sent:
        assert message.title.startswith(marker + " [")
        assert message.marker == marker


def test_marked_messages_are_rate_limited_and_summarised() -> None:
    cfg = shipped_config(drill_rate=2)
    notifier = Notifier(cfg, host=HOST, marker="[DRILL]")
    for n in range(5):
        assert notifier.admin(f"reload failed #{n}", "bad playbook", T0)
    first = notifier.due(T0)
    assert [m.title for m in first] == ["[DRILL] reload failed #0", "[DRILL] reload failed #1"]
    assert notifier.held_total == 3
    later = notifier.due(T0 + 61)
    assert len(later) == 1
    assert later[0].title == "[DRILL] 3 more messages held back"
    assert "3 [DRILL] messages to oncall were counted and not sent" in later[0].body
    assert notifier.due(T0 + 200) == []


def test_unmarked_messages_are_not_rate_limited() -> None:
    notifier = Notifier(shipped_config(drill_rate=1), host=HOST)
    for n in range(5):
        notifier.admin(f"breaker tripped #{n}", "too many kills", T0)
    assert len(notifier.due(T0)) == 5


def test_replaying_a_run_yields_the_same_message_ids() -> None:
    cfg = shipped_config(group_interval=60.0)
    first, _, _ = play(cfg, Machine((0,)), 300)
    again, _, _ = play(cfg, Machine((0,)), 300)
    assert [m.id for _, m in first] == [m.id for _, m in again]


def test_shadow_rules_are_never_announced(tmp_path: Path) -> None:
    text = (ROOT / "playbooks" / "memory-pressure.yaml").read_text()
    shadow = tmp_path / "shadow.yaml"
    shadow.write_text(text.replace("severity: critical", "severity: critical\n    mode: shadow"))
    cfg = shipped_config()
    engine = Engine(load([shadow], cfg), cfg)
    sent, _, _ = play(cfg, Machine((0,)), 400, engine=engine)
    assert sent == []


def test_unknown_marker_is_refused() -> None:
    with pytest.raises(ValueError, match="marker"):
        Notifier(shipped_config(), host=HOST, marker="[TEST]")


def test_test_message_names_the_host() -> None:
    message = Notifier(shipped_config(), host=HOST).test_message("chat", T0)
    assert message.kind == "test"
    assert message.target == "chat"
    assert HOST in message.title
    assert HOST in message.body


def test_a_step_told_in_progress_has_its_outcome_told_later() -> None:
    """A kill still running a group_interval after it started goes out as "in progress";
    how it ended (the targets terminated) must follow in a later message, not be lost."""
    cfg = shipped_config(group_interval=60.0)
    machine = Machine((0,))
    playbooks = load([ROOT / "playbooks" / "memory-pressure.yaml"], cfg)
    engine = Engine(playbooks, cfg)
    notifier = Notifier(cfg, host=HOST, descriptions={})
    running: list[tuple[float, Intent]] = []
    sent: list[tuple[float, Message]] = []
    t = 0.0
    while t <= 900:
        now = T0 + t
        tick = engine.step(machine.snapshot(now), now)
        notifier.observe(tick.records, now)
        running += [(now + 120, i) for i in tick.intents]  # every step takes two minutes
        for item in [r for r in running if r[0] <= now]:
            running.remove(item)
            outcome = machine.outcome(item[1])
            engine.complete(item[1].id, outcome)
            notifier.observe_outcome(item[1], outcome, now)
        sent.extend((t, m) for m in notifier.due(now))
        t += 2.0
    kill_lines = [line for _, m in sent for line in m.body.splitlines() if "kill pid 4200" in line]
    assert any("in progress" in line for line in kill_lines), kill_lines
    assert any("terminated" in line for line in kill_lines), kill_lines


def test_a_plain_note_goes_to_each_named_target_that_takes_its_severity() -> None:
    notifier = Notifier(shipped_config(), host=HOST, descriptions={})
    # oncall takes warning and above; chat takes everything; nobody is not a target.
    assert notifier.tell(["oncall", "chat", "chat", "nobody"], "k", "T", "B", "info", T0) == 1
    assert notifier.tell(["oncall"], "k2", "T2", "B2", "critical", T0) == 1
    sent = notifier.due(T0)
    assert [(m.target, m.title, m.kind) for m in sent] == [
        ("chat", "T", "note"),
        ("oncall", "T2", "note"),
    ]


def test_a_note_can_be_routed_like_the_incident_it_follows() -> None:
    """The end of a critical burst reaches the on-call who heard of its start, though the
    note itself is only information."""
    notifier = Notifier(shipped_config(), host=HOST, descriptions={})
    assert notifier.tell(["oncall"], "k", "T", "B", "info", T0, route_as="critical") == 1
    (sent,) = notifier.due(T0)
    assert (sent.target, sent.severity) == ("oncall", "info")


SLOW_LADDER = """rules:
  - name: gpu-fatal-error
    description: A GPU fell off the bus.
    for_each: event
    when: event.kind == "xid" and event.xid == 79
    severity: critical
    steps:
      - notify: oncall
      - after: 2m
        checkpoint: {select: process.checkpointable}
"""


def _fatal_xid_messages(
    group_wait: float, playbook: Path = ROOT / "playbooks" / "gpu-lost-fatal-xid.yaml"
) -> list[tuple[float, Message]]:
    """A fatal XID on GPU 0 at t=10: the event rule's ladder runs and its incident closes
    when the last step is done (the shipped playbook: within the tick)."""
    cfg = shipped_config(group_wait=group_wait, group_interval=60.0)
    playbooks = load([playbook], cfg)
    engine = Engine(playbooks, cfg)
    descriptions = {r.name: r.spec.description for r in playbooks.rules}
    notifier = Notifier(cfg, host=HOST, descriptions=descriptions)
    out: list[tuple[float, Message]] = []
    for t in range(0, 400, 2):
        now = T0 + t
        events = (
            (Event(EventKind.XID, now, gpu=0, xid=79, detail="fell off the bus"),)
            if t == 10
            else ()
        )
        snapshot = Snapshot(HOST, now, (gpu(0, 1000),), (), events)
        tick = engine.step(snapshot, now)
        notifier.observe(
            tick.records, now, incidents={i.id: {"xid": "79"} for i in engine.incidents}
        )
        for intent in tick.intents:
            outcome = Outcome(ok=True, detail="nothing to checkpoint")
            engine.complete(intent.id, outcome)
            notifier.observe_outcome(intent, outcome, now)
        out.extend((t, m) for m in notifier.due(now))
    return out


def test_a_fatal_xid_is_paged_as_critical_never_as_resolved() -> None:
    # Its incident closed (the ladder ran) before the group wait was over: the first and only
    # message is the page, not "[RESOLVED]".
    sent = _fatal_xid_messages(group_wait=30.0)
    assert [(t, m.kind) for t, m in sent] == [(40, "open")]
    page = sent[0][1]
    assert page.title == "[CRITICAL] GPU fatal error on gpu-node-07: GPU 0"
    assert "RESOLVED" not in page.title
    assert "Resolved" not in page.body
    assert "A GPU fell off the bus" in page.body


def test_a_fatal_xid_paged_before_its_ladder_ends_gets_an_update_not_a_resolve(
    tmp_path: Path,
) -> None:
    playbook = tmp_path / "slow.yaml"
    playbook.write_text(SLOW_LADDER)
    sent = _fatal_xid_messages(0.0, playbook)
    assert [(t, m.kind) for t, m in sent] == [(10, "open"), (130, "step")]
    update = sent[1][1]
    assert update.title == "[CRITICAL] GPU fatal error on gpu-node-07: GPU 0 (update)"
    assert "GPU 0 handled: its ladder has run" in update.body
    assert "resolved" not in update.body.lower()
