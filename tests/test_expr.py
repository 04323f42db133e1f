"""The expression compiler: what it accepts and how it evaluates on real model objects, what
it rejects (the whitelist is the security boundary) with exact messages and offsets, durations,
priorities, root restrictions and the history series it registers."""

from __future__ import annotations

import pytest

from gpuwarden.model import Event, EventKind, GpuProcess, GpuState, ProcessInfo
from gpuwarden.playbook.expr import Compiler, ExprError
from tests.playbook_envs import ALL_ROOTS, CLASSES, NOW, XID79, env

# (expression, gpu, process, expected test()): gpu/process name fixtures in playbook_envs.
VALID: list[tuple[str, str | None, str | None, bool]] = [
    ("gpu.memory.used_pct >= 95 and gpu.temperature_c < 85", "hot", None, True),
    ("gpu.memory.used_pct >= 95 and gpu.temperature_c < 85", "unknown", None, False),
    ("gpu.memory.used_pct < 95", "unknown", None, False),
    ("gpu.memory.used_pct >= 95", "unknown", None, False),
    ("not (gpu.memory.used_pct >= 95)", "unknown", None, True),
    ("gpu.temperature_c == None", "unknown", None, True),
    ("gpu.temperature_c is None", "unknown", None, True),
    ("gpu.temperature_c is not None", "hot", None, True),
    ("gpu.temperature_c != 80", "unknown", None, True),
    ("gpu.temperature_c == 84", "unknown", None, False),
    ('"hw_thermal_slowdown" in gpu.throttle or gpu.throttled', "hot", None, True),
    ('"hw_thermal_slowdown" in gpu.throttle', "unknown", None, False),
    ('"hw_thermal_slowdown" not in gpu.throttle', "unknown", None, False),
    ('"gpu_idle" not in gpu.throttle', "hot", None, True),
    ("gpu.throttled", "idle", None, False),
    ("gpu.throttled", "unknown", None, False),
    ("not gpu.throttled", "unknown", None, True),
    ("gpu.power_pct > 95", "hot", None, True),
    ("gpu.power_w > 0.95 * gpu.power_limit_w", "hot", None, True),
    ("gpu.power_w > 0.95 * gpu.power_limit_w", "unknown", None, False),
    ("gpu.power_pct == None", "idle", None, True),
    ("gpu.memory.free_pct < 5", "hot", None, True),
    ("gpu.ecc.volatile_corrected > 0", "hot", None, True),
    ("gpu.ecc.volatile_corrected > 0 or gpu.remapped_rows.pending", "unknown", None, False),
    (
        "gpu.ecc.volatile_corrected == None and gpu.retired_pages.pending == None",
        "unknown",
        None,
        True,
    ),
    ("gpu.remapped_rows.pending and not gpu.remapped_rows.failure", "hot", None, True),
    ("gpu.retired_pages.single_bit >= 2 and not gpu.retired_pages.pending", "idle", None, True),
    ("gpu.lost and gpu.error == 'GPU is lost'", "lost", None, True),
    ("gpu.lost", "hot", None, False),
    ("gpu.process_count == 1", "hot", None, True),
    ("gpu.process_count == None", "lost", None, True),
    ("gpu.process_count == 0", "idle", None, True),
    ("gpu.index in [0, 2]", "hot", None, True),
    ("gpu.index not in (0, 2)", "idle", None, True),
    ("gpu.name == 'NVIDIA A100-SXM4-80GB' and 'A100' in gpu.name", "hot", None, True),
    ("'A100' in gpu.name", "unknown", None, False),
    ("0 < gpu.temperature_c < 85", "hot", None, True),
    ("0 < gpu.temperature_c < 85", "unknown", None, False),
    ("80 <= gpu.temperature_c <= gpu.utilization_pct", "hot", None, True),
    ("gpu.temperature_c - 80 >= 4", "hot", None, True),
    ("gpu.memory.used_mib / gpu.memory.total_mib > 0.9", "hot", None, True),
    ("gpu.memory.used_mib / gpu.memory.reserved_mib > 0 or gpu.index == 0", "hot", None, True),
    ("gpu.memory.used_mib // gpu.memory.reserved_mib == None", "hot", None, True),
    ("gpu.memory.used_mib % gpu.memory.reserved_mib == None", "hot", None, True),
    ("abs(gpu.temperature_c - 90) < 10", "hot", None, True),
    ("abs(gpu.temperature_c - 90) < 10", "unknown", None, False),
    ("abs(-5) == 5 and abs(gpu.index - 3) == 3", "hot", None, True),
    ("-gpu.temperature_c < -80", "hot", None, True),
    ("+gpu.temperature_c > 80", "hot", None, True),
    ("gpu.temperature_c % 10 == 4 and gpu.temperature_c // 10 == 8", "hot", None, True),
    ("gpu.pstate == 0 and gpu.mig_mode == false", "hot", None, True),
    ("gpu.utilization_pct >= 100 and gpu.memory_utilization_pct < 70", "hot", None, True),
    ("gpu.uuid == 'GPU-0000' and gpu.pci_bus_id != None", "hot", None, True),
    # processes
    ("process.checkpointable and process.priority <= normal", "hot", "trainer", True),
    ("process.priority == 'low'", "hot", "trainer", True),
    ("process.priority == low", "hot", "trainer", True),
    ("'low' == process.priority", "hot", "trainer", True),
    ("process.priority < normal and process.priority > scavenger", "hot", "trainer", True),
    ("process.priority in ['low', 'scavenger']", "hot", "trainer", True),
    ("process.priority in [low, 'scavenger']", "hot", "trainer", True),
    ("process.priority not in [critical, high]", "hot", "trainer", True),
    ("scavenger < process.priority <= 'low'", "hot", "trainer", True),
    ("process.declared_priority == normal", "hot", "trainer", True),
    ("process.declared_priority > process.priority", "hot", "trainer", True),
    ("process.declared_priority >= scavenger", "unknown", "ghost", False),
    ("process.idle and process.gpu_memory_mib > 8192", "hot", "trainer", True),
    ("process.idle", "unknown", "ghost", False),
    ("process.user == 'alice' and process.uid == 1001", "hot", "trainer", True),
    ("'ml' in process.groups", "hot", "trainer", True),
    ("'ml' in process.groups", "unknown", "ghost", False),
    ("'train.py' in process.cmdline", "hot", "trainer", True),
    ("process.cmdline == 'python3 train.py --epochs 90'", "hot", "trainer", True),
    ("process.name == 'python3' and process.kind == 'compute'", "hot", "trainer", True),
    ("process.age_s > 2h and process.age_s < 3h1s", "hot", "trainer", True),
    ("process.age_s > 2h", "unknown", "ghost", False),
    ("process.container == 'abc123' and process.slurm_job == '77'", "hot", "trainer", True),
    ("process.unit == None and process.pod == None", "hot", "trainer", True),
    ("process.orphaned and process.gpu_memory_mib == None", "unknown", "ghost", True),
    ("process.gpu_memory_mib > 0", "unknown", "ghost", False),
    ("process.zombie", "hot", "trainer", False),
    ("process.zombie == None", "unknown", "ghost", True),
    ("process.status == 'sleeping' and process.nice == 0", "hot", "trainer", True),
    ("process.cpu_pct > 10 and process.rss_mib >= 2048", "hot", "trainer", True),
    ("process.checkpoint_signal == 'SIGUSR1'", "hot", "trainer", True),
    ("process.pid == 4242 and process.gpu == gpu.index", "hot", "trainer", True),
    ("process.sm_util_pct == 0 and gpu.utilization_pct == 100", "hot", "trainer", True),
    # a process whose GPU is not in the snapshot: its gpu.* fields are unknown
    ("gpu.index == 0", None, "trainer", False),
    ("gpu.index != 0 and process.pid == 4242", None, "trainer", True),
    # host and time
    ("host.gpu_count == 4 and host.gpus_lost == 1", "hot", None, True),
    ("host.memory_used_mib == 78000 and host.memory_total_mib == 160000", "hot", None, True),
    ("host.memory_used_pct < 50 and host.process_count == 2", "hot", None, True),
    ("host.name == 'gpu-node-7'", None, None, True),
    ("time.weekday <= 5 and time.hour >= 8", None, None, True),
    ("time.weekday_name == 'Mon' and not time.is_weekend", None, None, True),
    (
        "time.year == 2026 and time.month == 1 and time.day == 5 and time.minute == 30",
        None,
        None,
        True,
    ),
    (f"time.epoch == {NOW}", None, None, True),
    # constants and durations
    ("true", None, None, True),
    ("True and not False", None, None, True),
    ("false or null == None", None, None, True),
    ("2 * 3 == 6 and 7 / 2 == 3.5 and 7 // 2 == 3 and 7 % 2 == 1", None, None, True),
    ("1h == 3600 and 1h30m == 5400 and 500ms == 0.5 and 2d == 172800", None, None, True),
    ("1.5h == 90m and 30s < 1m", None, None, True),
    ("'5m' != '300.0' and \"1h\" == '1h'", None, None, True),
    ("gpu.temperature_c > 80 and\n  gpu.memory.used_pct > 90", "hot", None, True),
]


@pytest.fixture
def compiler() -> Compiler:
    return Compiler(CLASSES)


@pytest.mark.parametrize(("text", "gpu", "process", "expected"), VALID)
def test_valid(
    compiler: Compiler, text: str, gpu: str | None, process: str | None, expected: bool
) -> None:
    compiled = compiler.compile(text, roots=ALL_ROOTS)
    scope = env(gpu, process)
    assert compiled.test(scope) is expected
    assert compiled.evaluate(env(gpu, process)) in (expected, None)


def test_event_expressions(compiler: Compiler) -> None:
    rule = "event.kind == 'xid' and event.xid in [48, 63, 64, 74, 79, 94, 95]"
    compiled = compiler.compile(rule, roots=ALL_ROOTS)
    assert compiled.test(env(event=XID79))
    lost = Event(EventKind.GPU_LOST, time=NOW, gpu=3)
    assert not compiled.test(env(event=lost))
    detail = compiler.compile("event.gpu == 0 and 'bus' in event.detail", roots=ALL_ROOTS)
    assert detail.test(env(event=XID79))
    assert not detail.test(env(event=lost))


def test_a_select_outside_an_event_rule_reads_event_fields_as_unknown(compiler: Compiler) -> None:
    compiled = compiler.compile("event.xid == 79 or process.pid == 4242", roots=ALL_ROOTS)
    assert compiled.test(env("hot", "trainer", event=None))


def test_guards_are_written_into_the_code(compiler: Compiler) -> None:
    compiled = compiler.compile(
        "gpu.memory.used_pct >= 95 and gpu.temperature_c < 85", roots={"gpu", "host", "time"}
    )
    assert compiled.python == (
        "((_t1 := gpu.memory.used_pct) is not None and _t1 >= 95) and "
        "((_t2 := gpu.temperature_c) is not None and _t2 < 85)"
    )
    assert compiled.roots == frozenset({"gpu"})
    assert compiled.fields == frozenset({"gpu.memory.used_pct", "gpu.temperature_c"})
    assert compiled.series == ()


def test_a_chain_reads_its_middle_operand_once(compiler: Compiler) -> None:
    compiled = compiler.compile("0 < gpu.temperature_c < 85", roots={"gpu"})
    assert compiled.python.count("gpu.temperature_c") == 1


def test_lists_become_constant_sets(compiler: Compiler) -> None:
    compiled = compiler.compile("process.priority in ['low', scavenger]", roots=ALL_ROOTS)
    assert compiled.python == "_rank.get(process.info.priority) in frozenset({0, 1})"


def test_values(compiler: Compiler) -> None:
    def value(text: str, gpu: str | None = "hot", process: str | None = "trainer") -> object:
        return compiler.compile(text, roots=ALL_ROOTS, kind="value").evaluate(env(gpu, process))

    assert value("process.gpu_memory_mib") == 9000
    assert value("process.priority") == 1
    assert value("gpu.power_w / 2") == 195.0
    assert value("gpu.temperature_c + 1", "unknown") is None
    assert value("gpu.memory.used_mib / gpu.memory.reserved_mib") is None
    assert value("process.name") == "python3"
    assert compiler.compile("gpu.index", roots={"gpu"}, kind="value").result == "number"
    assert compiler.compile("gpu.lost", roots={"gpu"}).result == "boolean"


def test_evaluate_turns_bad_data_into_unknown(compiler: Compiler) -> None:
    """Objects that break the model's promises (a string where a number belongs) give unknown,
    never an exception in the tick."""
    odd = GpuState(index=0, temperature_c="hot")  # type: ignore[arg-type]
    compiled = compiler.compile("gpu.temperature_c > 80 or gpu.index == 0", roots={"gpu"})
    scope: dict[str, object] = {"gpu": odd}
    assert compiled.evaluate(scope) is None
    assert compiled.test(scope) is False


def test_a_missing_root_is_a_caller_bug(compiler: Compiler) -> None:
    compiled = compiler.compile("gpu.index == 0", roots={"gpu"})
    with pytest.raises(NameError):
        compiled.test({})


def test_other_priority_classes() -> None:
    metals = Compiler(("gold", "silver", "bronze"))
    compiled = metals.compile("process.priority >= silver", roots={"process"})
    info = ProcessInfo(pid=1, priority="gold")
    assert compiled.test({"process": GpuProcess(pid=1, gpu=0, gpu_memory_mib=1, info=info)})
    with pytest.raises(ExprError, match="unknown name normal"):
        metals.compile("process.priority <= normal", roots={"process"})
    with pytest.raises(ValueError, match="repeat"):
        Compiler(("a", "a"))


def test_compile_arguments_are_checked(compiler: Compiler) -> None:
    with pytest.raises(ValueError, match="roots"):
        compiler.compile("true", roots={"gpus"})
    with pytest.raises(ValueError, match="kind"):
        compiler.compile("true", roots={"gpu"}, kind="number")


def test_every_documented_example_compiles(compiler: Compiler) -> None:
    for text in (
        "gpu.memory.used_pct >= 95 and gpu.temperature_c < 85",
        "process.checkpointable and process.priority <= normal",
        "gpu.memory.used_pct < 80",
        "predict(gpu.memory.used_pct, 10m) >= 100",
        "held_for(process.sm_util_pct == 0) > 2h and process.gpu_memory_mib > 8192",
        'event.kind == "xid" and event.xid in [48, 63, 64, 74, 79, 94, 95]',
        "avg(gpu.power_w, 5m) > 0.95 * gpu.power_limit_w",
        '"hw_thermal_slowdown" in gpu.throttle or gpu.throttled',
        "time.weekday <= 5 and time.hour >= 8",
        "rate(gpu.ecc.volatile_corrected, 1h) > 0 or min(host.memory_used_pct, 1m) > 90",
        "max(process.gpu_memory_mib, 30m) > 1000 and predict(gpu.temperature_c, 2m, 10m) > 90",
    ):
        assert compiler.compile(text, roots=ALL_ROOTS).text == text


# -- series -------------------------------------------------------------------------------------


def test_history_calls_register_shared_series(compiler: Compiler) -> None:
    first = compiler.compile("avg(gpu.power_w, 5m) > 300", roots=ALL_ROOTS)
    second = compiler.compile(
        "max(gpu.power_w, 1h) > 390 and rate(gpu.power_w, 1m) > 1", roots=ALL_ROOTS
    )
    third = compiler.compile("predict(gpu.memory.used_pct, 10m) >= 100", roots=ALL_ROOTS)
    assert [(s.id, s.root, s.kind, s.text, s.window) for s in compiler.series] == [
        (0, "gpu", "value", "gpu.power_w", 3600.0),
        (1, "gpu", "value", "gpu.memory.used_pct", 300.0),
    ]
    assert [s.id for s in first.series] == [0]
    assert [s.id for s in second.series] == [0]
    assert [s.id for s in third.series] == [1]
    assert first.python == "(_t1 := _h.avg(0, 300.0)) is not None and _t1 > 300"
    assert third.python == "(_t1 := _h.predict(1, 600.0, 300.0)) is not None and _t1 >= 100"


def test_held_for_series_and_their_roots(compiler: Compiler) -> None:
    idle = compiler.compile("held_for(process.sm_util_pct == 0) > 2h", roots=ALL_ROOTS)
    again = compiler.compile("held_for(process.sm_util_pct  ==  0) > 1h", roots=ALL_ROOTS)
    hot = compiler.compile(
        "held_for(gpu.temperature_c > 85 and time.hour > 8) > 0", roots=ALL_ROOTS
    )
    night = compiler.compile("held_for(time.hour < 6) > 1h", roots=ALL_ROOTS)
    assert [(s.root, s.kind, s.text, s.window) for s in compiler.series] == [
        ("process", "held", "process.sm_util_pct == 0", 0.0),
        ("gpu", "held", "gpu.temperature_c > 85 and time.hour > 8", 0.0),
        ("host", "held", "time.hour < 6", 0.0),
    ]
    assert idle.series == again.series
    assert idle.python == "_h.held_for(0) > 7200.0"
    assert hot.roots == frozenset({"gpu", "time"})
    assert night.roots == frozenset({"time"})


def test_series_sample_in_a_scope(compiler: Compiler) -> None:
    compiler.compile(
        "avg(gpu.power_w, 5m) > 1 and held_for(gpu.temperature_c > 80) > 1", roots=ALL_ROOTS
    )
    power, hot = compiler.series
    assert power.sample(env("hot")) == 390.0
    assert power.sample(env("unknown")) is None
    assert hot.sample(env("hot")) is True
    assert hot.sample(env("unknown")) is False


def test_a_failed_compile_registers_nothing(compiler: Compiler) -> None:
    compiler.compile("avg(gpu.power_w, 5m) > 1", roots=ALL_ROOTS)
    with pytest.raises(ExprError):
        compiler.compile(
            "avg(gpu.power_w, 2h) > 1 and avg(gpu.power_pct, 1m) > gpu.nope", roots=ALL_ROOTS
        )
    assert [(s.text, s.window) for s in compiler.series] == [("gpu.power_w", 300.0)]
    later = compiler.compile("avg(gpu.power_pct, 1m) > 1", roots=ALL_ROOTS)
    assert [s.id for s in later.series] == [1]
