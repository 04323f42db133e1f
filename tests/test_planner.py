"""Victim planning: which processes a step chooses, in which order, and why it skips the others.

First the planner on its own (a compiled step from a real playbook file, real model objects),
then through the engine, where candidates come from the rule's scope, earlier steps and
incidents mark processes as targeted, and ``free_until`` is checked on the projected GPU or host.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.config import Protected
from gpuwarden.engine.engine import Engine
from gpuwarden.engine.history import History
from gpuwarden.engine.planner import Plan, Planner, freed_gpu
from gpuwarden.engine.protect import ProtectedMatcher
from gpuwarden.model import GpuProcess, GpuState, Intent, Memory, Reason, Target
from gpuwarden.playbook.fields import tick_env
from gpuwarden.playbook.loader import CompiledStep
from tests.test_engine import OK, T0, UTC, config, gpu, make_engine, playbooks, proc, snap, xid

HOUR = 3600.0


def compiled_step(tmp_path: Path, step: str, for_each: str = "gpu") -> CompiledStep:
    text = f"""
    rules:
      - name: r
        for_each: {for_each}
        when: "true"
        steps:
          - {step}
    """
    return playbooks(tmp_path, text).rules[0].steps[0]


def plan(
    step: CompiledStep,
    procs: Iterable[GpuProcess],
    *,
    state: GpuState | None = None,
    protected: Protected | None = None,
    self_pid: int | None = None,
    already: Iterable[tuple[int, float | None]] = (),
) -> Plan:
    """Plan ``step`` for the processes on one GPU (``state``, 96 % full by default)."""
    state = state or gpu(0, 96)
    candidates = list(procs)
    base = tick_env(snap(state, procs=candidates), T0, UTC)
    base.update(gpu=state, process=None, event=None, _h=History().view("gpu:0", T0))

    def env_for(p: GpuProcess) -> dict[str, Any]:
        return {**base, "process": p}

    def projected(freed: Mapping[int, int]) -> dict[str, Any]:
        return {**base, "gpu": freed_gpu(state, freed.get(state.index, 0))}

    planner = Planner(ProtectedMatcher(protected or Protected(), self_pid=self_pid))
    return planner.plan(step, candidates, env_for, set(already), projected)


def chosen(result: Plan | Intent) -> list[int]:
    return [t.pid for t in result.targets]


def skipped(result: Plan | Intent) -> list[tuple[int, Reason]]:
    return [(s.target.pid, s.reason) for s in result.skipped]


# -- filters -----------------------------------------------------------------------------------

SKIPS: list[tuple[str, str, dict[str, Any], Reason | None]] = [
    ("selected", "kill: {select: process.user == 'alice'}", {}, None),
    ("not selected", "kill: {select: process.user == 'bob'}", {}, Reason.NOT_SELECTED),
    (
        "select before protection",
        "kill: {select: process.user == 'bob'}",
        {"uid": 0},
        Reason.NOT_SELECTED,
    ),
    ("orphaned", "kill: {}", {"orphaned": True, "user": None, "uid": None}, Reason.ORPHANED),
    ("root-owned", "kill: {}", {"uid": 0, "user": "svc"}, Reason.PROTECTED),
    ("the init process", "kill: {}", {"pid": 1}, Reason.PROTECTED),
    ("kthreadd", "kill: {}", {"pid": 2}, Reason.PROTECTED),
    (
        "a renamed process is not protected",
        "kill: {}",
        {"name": "sshd", "cmdline": ("sshd",)},
        None,
    ),
    ("zombie", "kill: {}", {"status": "zombie"}, Reason.ZOMBIE),
    ("already targeted", "kill: {}", {"pid": 77}, Reason.ALREADY_TARGETED),
    ("a reused pid is not the targeted one", "kill: {}", {"pid": 77, "created": T0 - 5}, None),
    ("checkpoint: not opted in", "checkpoint: {}", {}, Reason.NOT_CHECKPOINTABLE),
    ("checkpoint: opted in", "checkpoint: {}", {"checkpoint_signal": "SIGUSR2"}, None),
    ("checkpoint with its own signal", "checkpoint: {signal: SIGUSR1}", {}, None),
    ("kill needs no opt-in", "kill: {select: not process.checkpointable}", {}, None),
    ("requeue: in no Slurm job", "requeue: {}", {}, Reason.NOT_SLURM_JOB),
    ("requeue: a Slurm job", "requeue: {}", {"slurm_job": "7001"}, None),
    ("via slurm: in no Slurm job", "suspend: {via: slurm}", {}, Reason.NOT_SLURM_JOB),
    ("via slurm: a Slurm job", "kill: {via: slurm}", {"slurm_job": "7001"}, None),
    ("via auto: in no Slurm job", "kill: {via: auto}", {}, None),
]


@pytest.mark.parametrize(
    ("step", "fields", "reason"), [c[1:] for c in SKIPS], ids=[c[0] for c in SKIPS]
)
def test_each_candidate_is_kept_or_skipped_with_its_reason(
    tmp_path: Path, step: str, fields: dict[str, Any], reason: Reason | None
) -> None:
    fields = dict(fields)
    pid = fields.pop("pid", 4242)
    candidate = proc(pid, **fields)
    result = plan(compiled_step(tmp_path, step), [candidate], already=[(77, T0 - 3600)])
    if reason is None:
        assert (chosen(result), skipped(result), result.reason) == ([pid], [], Reason.STEP_DUE)
    else:
        assert (chosen(result), skipped(result)) == ([], [(pid, reason)])
        assert result.reason == Reason.NO_CANDIDATES


def test_the_daemon_itself_is_never_chosen(tmp_path: Path) -> None:
    result = plan(compiled_step(tmp_path, "kill: {}"), [proc(900), proc(901)], self_pid=900)
    assert (chosen(result), skipped(result)) == ([901], [(900, Reason.PROTECTED)])


def test_no_candidates_at_all(tmp_path: Path) -> None:
    result = plan(compiled_step(tmp_path, "kill: {}"), [])
    assert (result.targets, result.skipped, result.reason) == ((), (), Reason.NO_CANDIDATES)


def test_a_target_carries_what_executors_need(tmp_path: Path) -> None:
    candidate = proc(
        4242,
        mib=1234,
        priority="low",
        cmdline=("python3", "train.py", "x" * 300),
        checkpoint_signal="SIGUSR2",
    )
    (target,) = plan(compiled_step(tmp_path, "checkpoint: {}"), [candidate]).targets
    assert target == Target(
        pid=4242,
        create_time=T0 - 3600,
        gpu=0,
        user="alice",
        priority="low",
        gpu_memory_mib=1234,
        command=("python3 train.py " + "x" * 300)[:200],
        checkpoint_signal="SIGUSR2",
        uid=1000,
        ack_dir=None,
    )


def test_a_target_carries_its_slurm_job(tmp_path: Path) -> None:
    (target,) = plan(compiled_step(tmp_path, "kill: {}"), [proc(4242, slurm_job="7001")]).targets
    assert target.slurm_job == "7001"


# -- order and limit ---------------------------------------------------------------------------

# (pid, priority, MiB, age in seconds)
MIXED = [
    (1001, "normal", 9000, 100.0),
    (1002, "low", 2000, 100.0),
    (1003, "scavenger", 1000, 100.0),
    (1004, "low", 5000, 100.0),
    (1005, "low", 5000, 50.0),
    (1006, "high", 30000, 10.0),
    (1007, "low", None, 1.0),
]


def mixed() -> list[GpuProcess]:
    return [
        proc(pid, priority=priority, mib=mib, created=T0 - age) for pid, priority, mib, age in MIXED
    ]


@pytest.mark.parametrize(
    ("order", "expected"),
    [
        # default: lowest priority first, then most memory, then youngest; unknown memory last
        (None, [1003, 1005, 1004, 1002, 1007, 1001, 1006]),
        ('["-gpu_memory_mib"]', [1006, 1001, 1004, 1005, 1002, 1003, 1007]),
        ('["gpu_memory_mib"]', [1003, 1002, 1004, 1005, 1001, 1006, 1007]),
        ('["-age_s", pid]', [1001, 1002, 1003, 1004, 1005, 1006, 1007]),
        ('["-priority", "-pid"]', [1006, 1001, 1007, 1005, 1004, 1002, 1003]),
        ("age_s", [1007, 1006, 1005, 1001, 1002, 1003, 1004]),
    ],
)
def test_order(tmp_path: Path, order: str | None, expected: list[int]) -> None:
    step = "kill: {}" if order is None else f"kill: {{order: {order}}}"
    result = plan(compiled_step(tmp_path, step), mixed())
    assert chosen(result) == expected


def test_limit(tmp_path: Path) -> None:
    result = plan(compiled_step(tmp_path, "kill: {limit: 2}"), mixed())
    assert chosen(result) == [1003, 1005]
    assert skipped(result) == [
        (pid, Reason.LIMIT_REACHED) for pid in (1004, 1002, 1007, 1001, 1006)
    ]


def test_skipped_candidates_come_first_then_those_left_over(tmp_path: Path) -> None:
    step = compiled_step(tmp_path, "kill: {select: process.priority <= low, limit: 1}")
    result = plan(step, mixed())
    assert chosen(result) == [1003]
    assert skipped(result) == [
        (1001, Reason.NOT_SELECTED),
        (1006, Reason.NOT_SELECTED),
        (1005, Reason.LIMIT_REACHED),
        (1004, Reason.LIMIT_REACHED),
        (1002, Reason.LIMIT_REACHED),
        (1007, Reason.LIMIT_REACHED),
    ]


# -- free_until on the projected GPU -----------------------------------------------------------

FREE = "kill: {free_until: gpu.memory.used_pct < 90}"


def by_size(*sizes: int | None) -> list[GpuProcess]:
    return [proc(100 + n, mib=mib, priority="low") for n, mib in enumerate(sizes)]


@pytest.mark.parametrize(
    ("pct", "sizes", "expected"),
    [
        # 96 % full: 6001 MiB or more must go. Biggest first, and not one more than needed.
        (96, (4000, 3000, 2500), [100, 101]),
        (96, (7000, 3000, 2500), [100]),
        (96, (2000, 2000, 2000, 1000), [100, 101, 102, 103]),
        (96, (2000, 2000, 2000), [100, 101, 102]),  # not enough: all of them, still not met
        (96, (6000, 1, 3000), [100, 102]),  # 6000 leaves exactly 90 %: not below
        (96, (None, 7000), [101]),  # unknown memory sorts last and frees nothing known
        (96, (None, 3000, 4000), [102, 101]),
    ],
)
def test_free_until_stops_once_the_projected_gpu_satisfies_it(
    tmp_path: Path, pct: float, sizes: tuple[int | None, ...], expected: list[int]
) -> None:
    result = plan(compiled_step(tmp_path, FREE), by_size(*sizes), state=gpu(0, pct))
    assert chosen(result) == expected
    rest = [p.pid for p in by_size(*sizes) if p.pid not in expected]
    assert sorted(skipped(result)) == [(pid, Reason.FREE_UNTIL_MET) for pid in sorted(rest)]
    assert result.reason == Reason.STEP_DUE


def test_free_until_never_chooses_more_than_it_needs(tmp_path: Path) -> None:
    procs = by_size(3000, 2500, 2000, 1500, 1000, 500)
    result = plan(compiled_step(tmp_path, FREE), procs, state=gpu(0, 96))
    freed = [t.gpu_memory_mib or 0 for t in result.targets]
    assert sum(freed) > 6000
    assert sum(freed[:-1]) <= 6000  # the last one was needed


def test_free_until_already_met_chooses_nobody(tmp_path: Path) -> None:
    result = plan(compiled_step(tmp_path, FREE), by_size(1000, 2000), state=gpu(0, 80))
    assert result.targets == ()
    assert result.reason == Reason.FREE_UNTIL_MET
    assert skipped(result) == [(101, Reason.FREE_UNTIL_MET), (100, Reason.FREE_UNTIL_MET)]


def test_free_until_before_limit(tmp_path: Path) -> None:
    step = compiled_step(tmp_path, "kill: {free_until: gpu.memory.used_pct < 90, limit: 1}")
    result = plan(step, by_size(4000, 3000, 8000), state=gpu(0, 96))
    assert chosen(result) == [102]
    assert skipped(result) == [(100, Reason.FREE_UNTIL_MET), (101, Reason.FREE_UNTIL_MET)]
    result = plan(step, by_size(4000, 3000, 2500), state=gpu(0, 96))
    assert chosen(result) == [100]  # the limit takes the first of the two that are needed
    assert sorted(skipped(result)) == [(101, Reason.LIMIT_REACHED), (102, Reason.FREE_UNTIL_MET)]


def decoys_and_hog() -> list[GpuProcess]:
    """Five 300 MiB processes declared scavenger, and a 79 GB low-priority one."""
    swarm = [proc(200 + n, mib=300, priority="scavenger") for n in range(5)]
    return [*swarm, proc(300, mib=79_000, priority="low")]


@pytest.mark.parametrize("limit", ["", ", limit: 5", ", limit: 1"])
def test_a_decoy_swarm_cannot_shield_the_process_that_frees_the_memory(
    tmp_path: Path, limit: str
) -> None:
    step = compiled_step(
        tmp_path,
        "kill: {select: process.priority <= low, order: [priority, -gpu_memory_mib],"
        f" free_until: gpu.memory.used_pct < 80{limit}}}",
    )
    a100 = GpuState(index=0, memory=Memory(total_mib=81_920, used_mib=80_500, free_mib=1_420))
    result = plan(step, decoys_and_hog(), state=a100)
    assert chosen(result) == [300]
    assert sorted(skipped(result)) == [(200 + n, Reason.FREE_UNTIL_MET) for n in range(5)]


def test_needless_targets_are_let_go_the_most_important_first(tmp_path: Path) -> None:
    # 96 % full: 6001 MiB must go. Lowest class first takes 100 (5000) and 101 (900), not
    # enough, then 102 (5000): enough. Without 101 it still is: 101 goes free; 100 and 102
    # are both needed. Among equals the lower class (100) is kept before the higher (102).
    procs = [
        proc(100, mib=5000, priority="scavenger"),
        proc(101, mib=900, priority="scavenger"),
        proc(102, mib=5000, priority="low"),
        proc(103, mib=7000, priority="normal"),
    ]
    step = compiled_step(tmp_path, "kill: {order: [priority, -gpu_memory_mib], " + FREE[7:])
    result = plan(step, procs, state=gpu(0, 96))
    assert chosen(result) == [100, 102]
    assert sorted(skipped(result)) == [(101, Reason.FREE_UNTIL_MET), (103, Reason.FREE_UNTIL_MET)]


def test_free_until_on_a_gpu_of_unknown_memory_never_holds(tmp_path: Path) -> None:
    result = plan(compiled_step(tmp_path, FREE), by_size(4000, 3000), state=gpu(0, None))
    assert chosen(result) == [100, 101]


# -- through the engine ------------------------------------------------------------------------

GPU_RULE = """
rules:
  - name: full
    when: gpu.memory.used_pct >= 95
    cooldown: 0s
    steps:
{steps}
"""


def engine_with(tmp_path: Path, steps: str, **kwargs: Any) -> Engine:
    return make_engine(tmp_path, GPU_RULE.format(steps=textwrap.indent(steps, "      ")), **kwargs)


def intents(engine: Engine, *procs: GpuProcess, at: float = 0.0, **gpus: Any) -> list[Intent]:
    states = gpus.get("states") or (gpu(0, 99), gpu(1, 50))
    tick = engine.step(snap(*states, procs=procs), T0 + at)
    for intent in tick.intents:
        engine.complete(intent.id, OK)
    return list(tick.intents)


def test_a_gpu_rule_chooses_among_the_processes_on_its_gpu(tmp_path: Path) -> None:
    engine = engine_with(tmp_path, "- kill: {}")
    (kill,) = intents(engine, proc(10, gpu=0), proc(11, gpu=1), proc(12, gpu=0, mib=5000))
    assert (chosen(kill), skipped(kill)) == ([12, 10], [])


def test_protection_through_the_engine(tmp_path: Path) -> None:
    cfg = config(
        protected=Protected(
            users=("carol",), exes=("/usr/lib/xorg/Xorg",), pids=(15,), priorities=("critical",)
        )
    )
    engine = engine_with(tmp_path, "- kill: {}", cfg=cfg, self_pid=14)
    candidates = [
        proc(2),
        proc(11, uid=0, user="root"),
        proc(12, user="carol", uid=1002),
        proc(13, exe="/usr/lib/xorg/Xorg"),
        proc(14),
        proc(15),
        proc(16, priority="critical"),
        proc(17),
    ]
    (kill,) = intents(engine, *candidates)
    assert chosen(kill) == [17]
    assert sorted(skipped(kill)) == [(p, Reason.PROTECTED) for p in (2, 11, 12, 13, 14, 15, 16)]


def test_a_step_skips_what_an_earlier_step_of_its_kind_chose(tmp_path: Path) -> None:
    engine = engine_with(tmp_path, "- kill: {limit: 1}\n- renice: {}\n- kill: {limit: 1}")
    procs = proc(10, mib=5000), proc(11, mib=1000), proc(12, mib=500)
    first, renice, second = (intents(engine, *procs, at=t)[0] for t in (0, 1, 2))
    assert (chosen(first), skipped(first)) == (
        [10],
        [(11, Reason.LIMIT_REACHED), (12, Reason.LIMIT_REACHED)],
    )
    # A kill marks the process for every later step of every incident.
    assert (chosen(renice), skipped(renice)) == ([11, 12], [(10, Reason.ALREADY_TARGETED)])
    assert (chosen(second), skipped(second)) == (
        [11],
        [(10, Reason.ALREADY_TARGETED), (12, Reason.LIMIT_REACHED)],
    )


def test_steps_of_the_same_kind_other_than_kill_skip_within_the_incident_only(
    tmp_path: Path,
) -> None:
    steps = "- renice: {limit: 1}\n- renice: {}"
    other = "  - name: other\n    when: gpu.memory.used_pct >= 95\n    steps: [renice: {}]\n"
    engine = make_engine(tmp_path, GPU_RULE.format(steps=textwrap.indent(steps, "      ")) + other)
    procs = proc(10, mib=5000), proc(11, mib=1000)
    tick = engine.step(snap(gpu(0, 99), procs=procs), T0)
    first, elsewhere = tick.intents
    assert (first.rule, chosen(first), elsewhere.rule, chosen(elsewhere)) == (
        "full",
        [10],
        "other",
        [10, 11],
    )
    engine.complete(first.id, OK)
    (second,) = engine.step(snap(gpu(0, 99), procs=procs), T0 + 1).intents
    assert (chosen(second), skipped(second)) == ([11], [(10, Reason.ALREADY_TARGETED)])


def test_a_step_of_another_kind_may_choose_the_same_process(tmp_path: Path) -> None:
    engine = engine_with(tmp_path, "- checkpoint: {signal: SIGUSR1}\n- renice: {}\n- kill: {}")
    checkpoint, renice, kill = (intents(engine, proc(10), at=t)[0] for t in (0, 1, 2))
    assert chosen(checkpoint) == chosen(renice) == chosen(kill) == [10]


def test_a_killed_process_is_skipped_by_later_incidents_but_not_its_pid_successor(
    tmp_path: Path,
) -> None:
    engine = engine_with(tmp_path, "- kill: {}")
    victim = proc(10)
    assert chosen(intents(engine, victim)[0]) == [10]
    intents(engine, victim, states=(gpu(0, 50),), at=10)  # resolved; the kill did not work
    (again,) = intents(engine, victim, at=20)
    assert skipped(again) == [(10, Reason.ALREADY_TARGETED)]
    intents(engine, states=(gpu(0, 50),), at=30)
    reborn = proc(10, created=T0 + 25)
    (third,) = intents(engine, reborn, at=40)
    assert chosen(third) == [10]
    assert third.targets[0].create_time == T0 + 25


def test_a_requeued_process_is_skipped_by_later_incidents(tmp_path: Path) -> None:
    engine = engine_with(tmp_path, "- requeue: {}")
    victim = proc(10, slurm_job="7001")
    assert chosen(intents(engine, victim)[0]) == [10]
    intents(engine, victim, states=(gpu(0, 50),), at=10)
    (again,) = intents(engine, victim, at=20)
    assert skipped(again) == [(10, Reason.ALREADY_TARGETED)]


def test_a_process_rule_acts_on_its_process_only(tmp_path: Path) -> None:
    text = """
    rules:
      - name: hog
        for_each: process
        when: process.gpu_memory_mib > 4000
        steps:
          - kill: {}
    """
    engine = make_engine(tmp_path, text)
    tick = engine.step(snap(gpu(0, 99), procs=[proc(10, mib=5000), proc(11, mib=100)]), T0)
    assert [(i.where, chosen(i)) for i in tick.intents] == [("pid 10 on GPU 0", [10])]


EVENT_RULE = """
rules:
  - name: xid
    for_each: event
    when: event.kind == "xid"
    steps:
      - {step}
"""


def test_an_event_rule_chooses_from_every_process_and_select_narrows(tmp_path: Path) -> None:
    everyone = make_engine(tmp_path, EVENT_RULE.format(step="checkpoint: {signal: SIGUSR1}"))
    procs = [proc(10, gpu=0), proc(11, gpu=1)]
    frame = snap(gpu(0), gpu(1), procs=procs, events=[xid(79, 1)])
    (intent,) = everyone.step(frame, T0).intents
    assert sorted(chosen(intent)) == [10, 11]
    step = "checkpoint: {signal: SIGUSR1, select: process.gpu == event.gpu}"
    narrowed = make_engine(tmp_path, EVENT_RULE.format(step=step))
    (intent,) = narrowed.step(frame, T0).intents
    assert (chosen(intent), skipped(intent)) == ([11], [(10, Reason.NOT_SELECTED)])


def test_an_event_rule_projects_only_the_memory_freed_on_its_gpu(tmp_path: Path) -> None:
    step = "kill: {free_until: gpu.memory.used_pct < 90}"
    engine = make_engine(tmp_path, EVENT_RULE.format(step=step))
    # The big low-priority job is on GPU 1: killing it frees nothing on GPU 0, the XID's GPU.
    procs = [proc(10, gpu=1, mib=50000, priority="low"), proc(11, gpu=0, mib=8000)]
    frame = snap(gpu(0, 96), gpu(1, 60), procs=procs, events=[xid(79, 0)])
    (intent,) = engine.step(frame, T0).intents
    # Taken first (lowest class), it did not make free_until hold; 11 did, and alone: 10 is
    # let go rather than killed for nothing.
    assert chosen(intent) == [11]
    assert skipped(intent) == [(10, Reason.FREE_UNTIL_MET)]


HOST_RULE = """
rules:
  - name: host-full
    for_each: host
    when: host.memory_used_pct >= 95
    steps:
      - kill: {free_until: host.memory_used_pct < 90}
"""


def test_a_host_rule_projects_the_host_memory(tmp_path: Path) -> None:
    engine = make_engine(tmp_path, HOST_RULE)
    # 2 x 100000 MiB at 96 %: 192000 used, must drop below 180000 (12001 MiB or more).
    procs = [proc(10, gpu=0, mib=7000), proc(11, gpu=1, mib=6000), proc(12, gpu=1, mib=4000)]
    frame = snap(gpu(0, 96), gpu(1, 96), procs=procs)
    (intent,) = engine.step(frame, T0).intents
    assert (chosen(intent), skipped(intent)) == ([10, 11], [(12, Reason.FREE_UNTIL_MET)])
    assert intent.gpu is None


def test_a_process_on_two_gpus_is_one_candidate_with_its_memory_summed(tmp_path: Path) -> None:
    engine = make_engine(tmp_path, HOST_RULE)
    procs = [
        proc(20, gpu=0, mib=7000),
        proc(30, gpu=0, mib=6500),
        proc(30, gpu=1, mib=6500),  # 13000 in all: enough on its own
    ]
    frame = snap(gpu(0, 96), gpu(1, 96), procs=procs)
    (intent,) = engine.step(frame, T0).intents
    assert [(t.pid, t.gpu_memory_mib) for t in intent.targets] == [(30, 13000)]
    assert skipped(intent) == [(20, Reason.FREE_UNTIL_MET)]


def test_a_gpu_rule_may_free_until_the_host_is_fine(tmp_path: Path) -> None:
    engine = engine_with(tmp_path, "- kill: {free_until: host.memory_used_pct < 90}")
    # GPU 0 at 99 %, GPU 1 at 85 %: 184000 of 200000 used; below 180000 takes 4001 MiB or more.
    procs = [proc(10, mib=3000), proc(11, mib=2000), proc(12, mib=1000)]
    (kill,) = intents(engine, *procs, states=(gpu(0, 99), gpu(1, 85)))
    assert (chosen(kill), skipped(kill)) == ([10, 11], [(12, Reason.FREE_UNTIL_MET)])


def test_a_kill_ladder_frees_just_enough(tmp_path: Path) -> None:
    """The shipped memory-pressure ladder's kill step, as one engine sees it."""
    steps = textwrap.dedent(
        """\
        - notify: oncall
        - checkpoint: {select: process.checkpointable, wait: 2m}
        - after: 2m
          kill:
            select: process.priority <= low
            order: [priority, -gpu_memory_mib]
            free_until: gpu.memory.used_pct < 80
        """
    )
    engine = engine_with(tmp_path, steps)
    procs = [
        proc(10, priority="high", mib=40000, checkpoint_signal="SIGUSR1"),
        proc(11, priority="low", mib=9000),
        proc(12, priority="scavenger", mib=6000),
        proc(13, priority="low", mib=12000),
        proc(14, priority="low", mib=3000),
    ]
    first = intents(engine, *procs, states=(gpu(0, 97),))
    assert [(i.kind, chosen(i)) for i in first] == [("notify", []), ("checkpoint", [10])]
    assert intents(engine, *procs, states=(gpu(0, 97),), at=60) == []
    (kill,) = intents(engine, *procs, states=(gpu(0, 97),), at=2 * 60)
    # 97000 used, below 80000 needs 17001 MiB: scavenger 6000, then low 12000 = 18000.
    assert chosen(kill) == [12, 13]
    assert skipped(kill) == [
        (10, Reason.NOT_SELECTED),
        (11, Reason.FREE_UNTIL_MET),
        (14, Reason.FREE_UNTIL_MET),
    ]


def test_a_process_listed_twice_on_one_gpu_is_one_candidate(tmp_path: Path) -> None:
    """NVML lists a process with both a compute and a graphics context once per context."""
    compute = proc(10, mib=4000, priority="low")
    graphics = GpuProcess(pid=10, gpu=0, gpu_memory_mib=3000, info=compute.info, kind="graphics")
    result = plan(compiled_step(tmp_path, FREE), [compute, graphics, *by_size(5000)])
    # 7000 MiB together: enough on their own, so the 5000 MiB job is spared.
    assert [(t.pid, t.gpu_memory_mib) for t in result.targets] == [(10, 7000)]
    assert skipped(result) == [(100, Reason.FREE_UNTIL_MET)]
