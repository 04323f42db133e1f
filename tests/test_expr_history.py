"""History functions: the store fed with known samples gives exact avg/min/max/rate/predict and
held_for; and compiled expressions read it through ``_h`` over a simulated stretch of time."""

from __future__ import annotations

import dataclasses

import pytest

from gpuwarden.engine.history import History
from gpuwarden.model import GpuProcess, GpuState, Memory, ProcessInfo
from gpuwarden.playbook.expr import Compiler, Series
from gpuwarden.playbook.fields import tick_env
from tests.playbook_envs import CLASSES, SNAPSHOT, UTC

T0 = 1_767_225_600.0


def series(sid: int = 0, window: float = 300.0, kind: str = "value") -> Series:
    code = compile("0", "<test>", "eval")
    return Series(sid, "gpu", kind, code, window, f"s{sid}")


def fed(samples: list[tuple[float, float | None]], window: float = 300.0) -> History:
    history = History()
    for t, value in samples:
        history.record("gpu:0", series(window=window), value, T0 + t)
    return history


def test_avg_min_max_over_a_window_including_now() -> None:
    history = fed([(0, 10.0), (10, 20.0), (20, 60.0), (30, 30.0)])
    view = history.view("gpu:0", T0 + 30)
    assert view.avg(0, 20) == pytest.approx((20 + 60 + 30) / 3)  # samples at 10, 20, 30
    assert view.avg(0, 300) == 30.0
    assert (view.min(0, 15), view.max(0, 15)) == (30.0, 60.0)
    assert (view.min(0, 0), view.max(0, 0), view.avg(0, 0.5)) == (30.0, 30.0, 30.0)


def test_unknown_values_are_not_samples() -> None:
    history = fed([(0, 10.0), (10, None), (20, 30.0), (30, None)])
    view = history.view("gpu:0", T0 + 30)
    assert view.avg(0, 300) == 20.0
    assert view.avg(0, 5) is None  # nothing known in the last 5 s
    assert history.view("gpu:9", T0).avg(0, 300) is None  # a scope never seen


def test_rate_is_last_minus_first_over_their_span() -> None:
    history = fed([(0, 100.0), (10, 130.0), (40, 160.0)])
    view = history.view("gpu:0", T0 + 40)
    assert view.rate(0, 60) == 1.5
    assert view.rate(0, 30) == 1.0  # samples at 10 and 40
    assert view.rate(0, 5) is None  # one sample
    same_instant = fed([(0, 1.0), (0, 5.0)])  # recorded twice in one tick: the last wins
    assert same_instant.view("gpu:0", T0).rate(0, 60) is None
    assert same_instant.view("gpu:0", T0).avg(0, 60) == 5.0


def test_predict_is_a_least_squares_line_from_now() -> None:
    # Relative times -2, -1, 0 with values 1, 3, 2: slope 0.5 through the mean point (-1, 2).
    history = fed([(8, 1.0), (9, 3.0), (10, 2.0)])
    view = history.view("gpu:0", T0 + 10)
    assert view.predict(0, 2, 300) == pytest.approx(3.5)
    assert view.predict(0, 0, 300) == pytest.approx(2.5)
    assert view.predict(0, 2, 1.5) == pytest.approx(2 + (2 - 3) * 2)  # the last two: slope -1
    assert view.predict(0, 60, 0.5) is None  # one sample


def test_predict_of_a_straight_line_is_exact_at_epoch_scale() -> None:
    history = fed([(t, 40.0 + 0.5 * t) for t in range(0, 301, 10)])
    view = history.view("gpu:0", T0 + 300)
    assert view.predict(0, 600, 300) == pytest.approx(40 + 0.5 * 900, rel=1e-9)


def test_a_long_run_keeps_exact_sums() -> None:
    """Hours of samples through a short window: trimming shifts the lists and rebuilds the
    running sums many times, and the answers stay those of the last window alone."""
    history = History()
    s = series(window=300)
    for t in range(0, 4 * 3600):
        history.record("gpu:0", s, 1000.0 + 0.25 * t, T0 + t)
    end = T0 + 4 * 3600 - 1
    view = history.view("gpu:0", end)
    last = [1000.0 + 0.25 * t for t in range(4 * 3600 - 301, 4 * 3600)]
    assert view.avg(0, 300) == pytest.approx(sum(last) / len(last), rel=1e-12)
    assert view.rate(0, 300) == pytest.approx(0.25, rel=1e-12)
    assert view.predict(0, 3600, 300) == pytest.approx(last[-1] + 0.25 * 3600, rel=1e-9)
    assert (view.min(0, 300), view.max(0, 300)) == (last[0], last[-1])


def test_samples_are_trimmed_to_the_series_window() -> None:
    history = fed([(t, float(t)) for t in range(1000)], window=10)
    view = history.view("gpu:0", T0 + 999)
    assert view.avg(0, 10_000) == sum(range(989, 1000)) / 11
    # A query asking for more than the series kept widens what is kept from now on.
    for t in range(1000, 1100):
        history.record("gpu:0", 0, float(t), T0 + t)
    assert history.view("gpu:0", T0 + 1099).min(0, 10_000) == 989.0


def test_a_bare_series_id_learns_its_window_from_queries_and_memory_is_bounded() -> None:
    history = History(max_samples=50)
    for t in range(200):  # no Series, no query yet: only the sample bound applies
        history.record("gpu:0", 3, float(t), T0 + t)
    assert history.view("gpu:0", T0 + 199).min(3, 10_000) == 150.0
    assert history.view("gpu:0", T0 + 199).avg(3, 4) == 197.0  # asks for 4 s: keeps 10_000 s
    for t in range(200, 400):
        history.record("gpu:0", 3, float(t), T0 + t)
    assert history.view("gpu:0", T0 + 399).min(3, 10_000) == 350.0


def test_a_clock_that_goes_back_starts_over() -> None:
    history = fed([(100, 1.0), (110, 2.0)])
    history.record("gpu:0", series(), 7.0, T0 + 50)
    assert history.view("gpu:0", T0 + 50).avg(0, 1000) == 7.0


def test_held_for_counts_from_when_it_became_true() -> None:
    history = History()
    held = series(kind="held", window=0)
    steps = [(0, True, 0.0), (10, True, 10.0), (11, False, 0.0), (12, True, 0.0), (15, True, 3.0)]
    for t, is_true, expected in steps:
        history.record_held("pid:1", held, is_true, T0 + t)
        assert history.view("pid:1", T0 + t).held_for(0) == expected
    assert history.view("pid:2", T0).held_for(0) == 0.0


def test_forget_scopes_that_are_gone() -> None:
    history = History()
    for key in ("gpu:0", "gpu:1", "pid:5"):
        history.record(key, series(), 1.0, T0)
        history.record_held(key, series(1, kind="held"), True, T0)
    history.forget(["gpu:1"])
    assert history.scope_keys() == {"gpu:0", "pid:5"}
    history.forget_except({"gpu:0"})
    assert history.scope_keys() == {"gpu:0"}
    assert history.view("pid:5", T0 + 1).held_for(1) == 0.0
    assert history.view("gpu:0", T0 + 1).held_for(1) == 1.0


def test_a_process_view_reads_its_gpu_series() -> None:
    history = History()
    history.record("gpu:0", series(0), 50.0, T0)
    history.record("host", series(1), 7.0, T0)
    history.record("pid:1", series(2), 1.0, T0)
    view = history.view("pid:1", T0, also=("gpu:0", "host"))
    assert (view.avg(0, 60), view.avg(1, 60), view.avg(2, 60)) == (50.0, 7.0, 1.0)
    assert history.view("pid:1", T0).avg(0, 60) is None


# -- compiled expressions over time ---------------------------------------------------------------


def run(compiler: Compiler, history: History, key: str, scope: dict[str, object], t: float) -> None:
    """What the engine does each tick for one scope: record every series, then hand out _h."""
    for s in compiler.series:
        history.observe(key, s, scope, t)
    scope["_h"] = history.view(key, t)


def gpu_env(gpu: GpuState, t: float) -> dict[str, object]:
    scope = tick_env(SNAPSHOT, t, UTC)
    scope["gpu"] = gpu
    return scope


def test_avg_of_power_against_the_limit() -> None:
    compiler = Compiler(CLASSES)
    rule = compiler.compile("avg(gpu.power_w, 1m) > 0.95 * gpu.power_limit_w", roots={"gpu"})
    history = History()
    results = []
    for i, watts in enumerate([300, 400, 400, 400, 400, 400, 400]):
        t = T0 + 20 * i
        scope = gpu_env(GpuState(index=0, power_w=float(watts), power_limit_w=400.0), t)
        run(compiler, history, "gpu:0", scope, t)
        results.append(rule.test(scope))
    # Both ends of a window count: the 300 W sample at 0 s is still averaged in at 60 s.
    assert results == [False, False, False, False, True, True, True]


def test_predict_memory_full_in_ten_minutes() -> None:
    compiler = Compiler(CLASSES)
    rule = compiler.compile("predict(gpu.memory.used_pct, 10m) >= 100", roots={"gpu"})
    history = History()
    fired = []
    for minute in range(18):  # 51 % and 2 % more every minute: full in (100 - 51) / 2 min
        t = T0 + 60 * minute
        gpu = GpuState(index=0, memory=Memory(total_mib=1000, used_mib=510 + 20 * minute))
        scope = gpu_env(gpu, t)
        run(compiler, history, "gpu:0", scope, t)
        fired.append(rule.test(scope))
        if minute > 0:
            assert rule.evaluate(scope) is fired[-1]
    # Ten minutes ahead the line says 51 + 2 m + 20 %: 99 % at minute 14, 101 % at minute 15.
    assert fired.index(True) == 15
    assert all(fired[15:])
    assert not fired[0]  # one sample: no line, unknown


def test_held_for_an_idle_process_holding_memory() -> None:
    compiler = Compiler(CLASSES)
    rule = compiler.compile(
        "held_for(process.sm_util_pct == 0) > 2h and process.gpu_memory_mib > 8192",
        roots={"process", "gpu", "host", "time"},
    )
    history = History()
    info = ProcessInfo(pid=7, create_time=T0 - 10)
    fired = []
    for step in range(16):  # every 10 minutes; busy once at 30 minutes
        t = T0 + 600 * step
        util = 50 if step == 3 else 0
        proc = GpuProcess(pid=7, gpu=0, gpu_memory_mib=9000, info=info, sm_util_pct=util)
        scope = gpu_env(GpuState(index=0), t)
        scope["process"] = proc
        run(compiler, history, "pid:7", scope, t)
        fired.append(rule.test(scope))
    # Idle again from 40 minutes on: by 150 minutes that is 110 minutes, not yet 2 h.
    assert not any(fired)
    assert history.view("pid:7", T0 + 600 * 15).held_for(0) == 600 * 11
    idle_since = T0 + 600 * 4
    t = idle_since + 7200 + 60
    proc = GpuProcess(pid=7, gpu=0, gpu_memory_mib=9000, info=info, sm_util_pct=0)
    scope = gpu_env(GpuState(index=0), t)
    scope["process"] = proc
    run(compiler, history, "pid:7", scope, t)
    assert rule.test(scope)
    small = dataclasses.replace(proc, gpu_memory_mib=100)
    scope["process"] = small
    assert not rule.test(scope)


def test_rate_of_ecc_errors_and_unknown_without_history() -> None:
    compiler = Compiler(CLASSES)
    rule = compiler.compile("rate(gpu.ecc.volatile_corrected, 1h) > 0", roots={"gpu"})
    scope = gpu_env(GpuState(index=0), T0)
    run(compiler, History(), "gpu:0", scope, T0)
    assert rule.evaluate(scope) is False  # no ECC counters at all: no samples, unknown
