"""The ``power_cap`` executor and its undo, against a small PowerControl fake (our seam); and
``NvmlPower`` through pynvml's real wrappers against the fake NVML library, and the real driver
where there is one."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from gpuwarden.actions import power_cap, registry
from gpuwarden.actions.base import Context
from gpuwarden.actions.nvml_power import NvmlPower
from gpuwarden.actions.power_cap import PowerControlError
from gpuwarden.clock import SimClock
from gpuwarden.model import Intent, Reason, Undo
from gpuwarden.playbook.schema import PowerCapParams
from tests.fake_nvml import (
    DRIVER_NOT_LOADED,
    GPU_IS_LOST,
    INVALID_ARGUMENT,
    NO_PERMISSION,
    NOT_SUPPORTED,
    SUCCESS,
    TIMEOUT,
    FakeGpu,
    FakeNvml,
    _target,
    installed,
)

# -- a PowerControl fake -------------------------------------------------------------------------


class FakePower:
    """One H100-like GPU per index: limit 700 W, range [200, 700] W, default 700 W."""

    def __init__(self, **limits: Any) -> None:
        self.limit: dict[int, float | None] = {0: 700.0, 1: 700.0}
        self.range: dict[int, tuple[float, float] | None] = {0: (200.0, 700.0), 1: (200.0, 700.0)}
        self.default: dict[int, float | None] = {0: 700.0, 1: 700.0}
        for name, value in limits.items():
            getattr(self, name).update(value)
        self.sets: list[tuple[int, float]] = []
        self.set_error: Exception | None = None
        self.read_error: Exception | None = None
        self.ignores_sets = False

    def power_limit_w(self, gpu: int) -> float | None:
        if self.read_error is not None:
            raise self.read_error
        return self.limit[gpu]

    def power_limit_range_w(self, gpu: int) -> tuple[float, float] | None:
        return self.range[gpu]

    def default_power_limit_w(self, gpu: int) -> float | None:
        return self.default[gpu]

    def set_power_limit_w(self, gpu: int, watts: float) -> None:
        if self.set_error is not None:
            raise self.set_error
        self.sets.append((gpu, watts))
        if not self.ignores_sets:
            self.limit[gpu] = watts


def make_intent(gpu: int | None = 1, shadow: bool = False, **params: Any) -> Intent:
    return Intent(
        id="inc-3/1",
        incident="inc-3",
        rule="gpu-too-hot",
        scope="gpu:1" if gpu is not None else "host",
        step=1,
        kind="power_cap",
        label="power_cap",
        time=1_767_225_600.0,
        reason=Reason.STEP_DUE,
        severity="warning",
        shadow=shadow,
        gpu=gpu,
        params=PowerCapParams(**params),
        where="GPU 1" if gpu is not None else "gpu-node-7",
    )


def make_ctx(power: Any, dry_run: bool = False) -> Context:
    return Context(dry_run=dry_run, clock=SimClock(), host="gpu-node-7", power=power)


# -- execute -------------------------------------------------------------------------------------


def test_watts_lower_the_limit_and_leave_an_undo() -> None:
    power = FakePower()
    outcome = power_cap.execute(make_intent(watts=450), make_ctx(power))
    assert outcome.ok
    assert outcome.detail == "set GPU 1 power limit 700 W → 450 W"
    assert power.sets == [(1, 450.0)]
    assert outcome.undo == (Undo(kind="power_limit", gpu=1, value=700.0),)


def test_percent_is_of_the_default_limit_not_the_current_one() -> None:
    power = FakePower(limit={1: 600.0}, default={1: 500.0})
    outcome = power_cap.execute(make_intent(percent=80), make_ctx(power))
    assert outcome.ok
    assert power.sets == [(1, 400.0)]
    assert outcome.detail == "set GPU 1 power limit 600 W → 400 W; 80% of the default 500 W"
    assert outcome.undo == (Undo(kind="power_limit", gpu=1, value=600.0),)


@pytest.mark.parametrize(
    ("params", "expected_w", "note"),
    [
        ({"watts": 50}, 200.0, "50 W clamped to the device's minimum 200 W"),
        ({"percent": 10}, 200.0, "70 W clamped to the device's minimum 200 W"),
    ],
)
def test_a_limit_below_the_range_is_clamped(
    params: dict[str, Any], expected_w: float, note: str
) -> None:
    power = FakePower()
    outcome = power_cap.execute(make_intent(**params), make_ctx(power))
    assert outcome.ok
    assert power.sets == [(1, expected_w)]
    assert note in outcome.detail


def test_a_limit_above_the_range_is_clamped_and_then_already_met() -> None:
    power = FakePower(limit={1: 650.0}, range={1: (200.0, 600.0)})
    outcome = power_cap.execute(make_intent(watts=900), make_ctx(power))
    assert outcome.ok
    assert power.sets == [(1, 600.0)]
    assert "900 W clamped to the device's maximum 600 W" in outcome.detail


@pytest.mark.parametrize("watts", [700, 800, 700.3])
def test_a_limit_is_never_raised(watts: float) -> None:
    power = FakePower()
    outcome = power_cap.execute(make_intent(watts=watts), make_ctx(power))
    assert outcome.ok
    assert outcome.detail.startswith("already: GPU 1 limit 700 W is at or below")
    assert power.sets == []
    assert outcome.undo == ()


def test_an_unknown_range_is_said_and_not_guessed() -> None:
    power = FakePower(range={1: None})
    outcome = power_cap.execute(make_intent(watts=300), make_ctx(power))
    assert outcome.ok
    assert power.sets == [(1, 300.0)]
    assert outcome.detail.endswith("; the device's range is unknown")


def test_restore_false_leaves_no_undo() -> None:
    power = FakePower()
    outcome = power_cap.execute(make_intent(watts=300, restore=False), make_ctx(power))
    assert outcome.ok
    assert outcome.undo == ()
    assert outcome.detail.endswith("kept after the incident (restore: false)")


@pytest.mark.parametrize("how", ["dry_run", "shadow"])
def test_dry_run_plans_with_the_device_and_changes_nothing(
    how: str, caplog: pytest.LogCaptureFixture
) -> None:
    power = FakePower(default={1: 600.0})
    intent = make_intent(percent=50, shadow=how == "shadow")
    with caplog.at_level(logging.INFO, logger="gpuwarden.action"):
        outcome = power_cap.execute(intent, make_ctx(power, dry_run=how == "dry_run"))
    assert outcome.ok
    assert outcome.dry_run
    assert outcome.detail == "would set GPU 1 power limit 700 W → 300 W; 50% of the default 600 W"
    assert power.sets == []
    assert power.limit[1] == 700.0
    assert outcome.undo == ()
    assert len(caplog.records) == 1
    assert caplog.records[0].getMessage() == (
        "action=power_cap rule=gpu-too-hot incident=inc-3 dry_run=true "
        "gpu=1 from_w=700 to_w=300 outcome=would"
    )


def test_without_nvml_the_step_fails_plainly() -> None:
    outcome = power_cap.execute(make_intent(watts=300), make_ctx(None))
    assert not outcome.ok
    assert not outcome.recoverable
    assert outcome.detail == "power control unavailable (no NVML)"


def test_a_scope_without_a_gpu_fails_plainly() -> None:
    power = FakePower()
    outcome = power_cap.execute(make_intent(gpu=None, watts=300), make_ctx(power))
    assert not outcome.ok
    assert outcome.detail == "power_cap needs a GPU; gpu-node-7 has none"
    assert power.sets == []


@pytest.mark.parametrize(
    ("limits", "params", "expected"),
    [
        ({"limit": {1: None}}, {"watts": 300}, "GPU 1 cannot report its power limit"),
        (
            {"default": {1: None}},
            {"percent": 50},
            "GPU 1 cannot report its default power limit to take 50% of",
        ),
    ],
)
def test_what_the_device_cannot_tell_stops_the_step(
    limits: dict[str, Any], params: dict[str, Any], expected: str
) -> None:
    power = FakePower(**limits)
    outcome = power_cap.execute(make_intent(**params), make_ctx(power))
    assert not outcome.ok
    assert outcome.detail == expected
    assert power.sets == []


def test_a_refused_set_is_an_outcome() -> None:
    power = FakePower()
    power.set_error = PowerControlError("GPU 1: setting the power limit needs root", denied=True)
    outcome = power_cap.execute(make_intent(watts=300), make_ctx(power))
    assert not outcome.ok
    assert not outcome.recoverable
    assert outcome.detail == "GPU 1: setting the power limit needs root"
    assert outcome.undo == ()


def test_a_read_that_blows_up_is_an_outcome() -> None:
    power = FakePower()
    power.read_error = RuntimeError("driver hiccup")
    outcome = power_cap.execute(make_intent(watts=300), make_ctx(power))
    assert not outcome.ok
    assert outcome.detail == "GPU 1: reading the power limits failed: RuntimeError('driver hiccup')"


def test_a_set_the_device_ignores_is_reported() -> None:
    power = FakePower()
    power.ignores_sets = True
    outcome = power_cap.execute(make_intent(watts=300), make_ctx(power))
    assert not outcome.ok
    assert outcome.recoverable
    assert (
        outcome.detail == "set GPU 1 power limit 700 W → 300 W, but the device still reports 700 W"
    )
    assert outcome.undo == (Undo(kind="power_limit", gpu=1, value=700.0),)


# -- undo ----------------------------------------------------------------------------------------


def test_undo_restores_the_old_limit() -> None:
    power = FakePower()
    outcome = power_cap.execute(make_intent(watts=300), make_ctx(power))
    result = power_cap.undo(outcome.undo[0], make_ctx(power))
    assert result.ok
    assert result.state == "restored"
    assert result.detail == "restored GPU 1 power limit 300 W → 700 W"
    assert power.limit[1] == 700.0
    assert power.sets == [(1, 300.0), (1, 700.0)]


def test_undo_in_dry_run_changes_nothing() -> None:
    power = FakePower(limit={1: 300.0})
    undo = Undo(kind="power_limit", gpu=1, value=700.0)
    result = power_cap.undo(undo, make_ctx(power, dry_run=True))
    assert result.ok
    assert result.state == "would"
    assert result.detail == "would restore GPU 1 power limit 300 W → 700 W"
    assert power.sets == []


def test_undo_of_a_limit_already_back_does_nothing() -> None:
    power = FakePower()
    result = power_cap.undo(Undo(kind="power_limit", gpu=1, value=700.0), make_ctx(power))
    assert result.ok
    assert result.state == "already"
    assert power.sets == []


@pytest.mark.parametrize(
    ("undo", "power", "state", "detail"),
    [
        (Undo(kind="power_limit", gpu=1, value=700.0), None, "failed", "power control unavailable"),
        (Undo(kind="power_limit", gpu=None, value=700.0), FakePower(), "failed", "not a power"),
        (Undo(kind="resume", pid=42), FakePower(), "failed", "not a power limit to restore"),
    ],
)
def test_undo_that_cannot_be_done_says_why(undo: Undo, power: Any, state: str, detail: str) -> None:
    result = power_cap.undo(undo, make_ctx(power))
    assert not result.ok
    assert result.state == state
    assert result.detail.startswith(detail)


def test_undo_denied_is_a_result() -> None:
    power = FakePower(limit={1: 300.0})
    power.set_error = PowerControlError("GPU 1: needs root", denied=True)
    result = power_cap.undo(Undo(kind="power_limit", gpu=1, value=700.0), make_ctx(power))
    assert not result.ok
    assert result.state == "denied"
    assert result.detail == "GPU 1: needs root"


def test_the_registry_finds_the_executor_and_its_undo() -> None:
    assert registry.executor("power_cap") is power_cap.execute
    assert registry.undoer("power_limit") is power_cap.undo


# -- NvmlPower on the fake NVML library ----------------------------------------------------------


class PowerNvml(FakeNvml):
    """The fake NVML library plus the power-limit calls (the limit is the GPU's
    ``power_limit_mw``; its range and default live here)."""

    def __init__(self, gpus: list[FakeGpu]) -> None:
        super().__init__(gpus)
        self.constraints_mw: dict[int, tuple[int, int]] = {
            g.index: (200_000, 700_000) for g in gpus
        }
        self.default_mw: dict[int, int] = {g.index: 700_000 for g in gpus}
        self.sets_mw: list[tuple[int, int]] = []

    def _c_nvmlDeviceGetPowerManagementLimit(self, handle: Any, out: Any) -> int:
        name = "nvmlDeviceGetPowerManagementLimit"
        return self._uint(handle, name, out, lambda g: g.power_limit_mw)

    def _c_nvmlDeviceGetPowerManagementDefaultLimit(self, handle: Any, out: Any) -> int:
        name = "nvmlDeviceGetPowerManagementDefaultLimit"
        return self._uint(handle, name, out, lambda g: self.default_mw[g.index])

    def _c_nvmlDeviceGetPowerManagementLimitConstraints(
        self, handle: Any, low: Any, high: Any
    ) -> int:
        gpu, code = self._answer(handle, "nvmlDeviceGetPowerManagementLimitConstraints")
        if code == SUCCESS:
            _target(low).value, _target(high).value = self.constraints_mw[gpu.index]
        return code

    def _c_nvmlDeviceSetPowerManagementLimit(self, handle: Any, limit: Any) -> int:
        gpu, code = self._answer(handle, "nvmlDeviceSetPowerManagementLimit")
        milliwatts = int(limit.value)
        low, high = self.constraints_mw[gpu.index]
        if code == SUCCESS and not low <= milliwatts <= high:
            return INVALID_ARGUMENT
        if code == SUCCESS:
            self.sets_mw.append((gpu.index, milliwatts))
            gpu.power_limit_mw = milliwatts
        return code


@pytest.fixture
def nvml() -> Iterator[PowerNvml]:
    fake = PowerNvml([FakeGpu(index=0), FakeGpu(index=1)])
    with installed(fake):
        yield fake


@pytest.fixture
def nvml_power(nvml: PowerNvml) -> Iterator[NvmlPower]:
    with NvmlPower() as power:
        yield power
    assert nvml.shutdowns == 1


def test_nvml_power_reads_watts(nvml: PowerNvml, nvml_power: NvmlPower) -> None:
    nvml.gpus[1].power_limit_mw = 612_500
    nvml.constraints_mw[1] = (150_000, 650_000)
    nvml.default_mw[1] = 600_000
    assert nvml_power.power_limit_w(1) == 612.5
    assert nvml_power.power_limit_range_w(1) == (150.0, 650.0)
    assert nvml_power.default_power_limit_w(1) == 600.0
    assert nvml.init_flags == [1]  # once, not failing when there are no GPUs


def test_nvml_power_sets_milliwatts(nvml: PowerNvml, nvml_power: NvmlPower) -> None:
    nvml_power.set_power_limit_w(0, 333.3334)
    assert nvml.sets_mw == [(0, 333_333)]
    assert nvml_power.power_limit_w(0) == 333.333


@pytest.mark.parametrize(
    "function",
    [
        "nvmlDeviceGetPowerManagementLimit",
        "nvmlDeviceGetPowerManagementLimitConstraints",
        "nvmlDeviceGetPowerManagementDefaultLimit",
    ],
)
@pytest.mark.parametrize("how", ["unsupported", "no_permission", "missing"])
def test_nvml_power_readings_the_device_cannot_give_are_none(
    nvml: PowerNvml, nvml_power: NvmlPower, function: str, how: str
) -> None:
    if how == "unsupported":
        nvml.gpus[0].unsupported.add(function)
    elif how == "no_permission":
        nvml.gpus[0].failing[function] = NO_PERMISSION
    else:
        nvml.missing.add(function)
    readings = {
        "nvmlDeviceGetPowerManagementLimit": nvml_power.power_limit_w,
        "nvmlDeviceGetPowerManagementLimitConstraints": nvml_power.power_limit_range_w,
        "nvmlDeviceGetPowerManagementDefaultLimit": nvml_power.default_power_limit_w,
    }
    assert readings[function](0) is None
    # a missing call is missing for every GPU; an unsupported one only for that GPU
    assert (readings[function](1) is None) == (how == "missing")


@pytest.mark.parametrize(
    ("code", "message", "denied", "recoverable"),
    [
        (NO_PERMISSION, "GPU 0: setting the power limit to 300 W needs root", True, False),
        (NOT_SUPPORTED, "GPU 0 does not support setting the power limit to 300 W", False, False),
        (TIMEOUT, "GPU 0: setting the power limit to 300 W timed out", False, True),
        (GPU_IS_LOST, "GPU 0 cannot be reached for setting the power limit", False, False),
    ],
)
def test_nvml_power_set_errors_are_clear(
    nvml: PowerNvml,
    nvml_power: NvmlPower,
    code: int,
    message: str,
    denied: bool,
    recoverable: bool,
) -> None:
    nvml.gpus[0].failing["nvmlDeviceSetPowerManagementLimit"] = code
    with pytest.raises(PowerControlError) as caught:
        nvml_power.set_power_limit_w(0, 300)
    assert str(caught.value).startswith(message)
    assert caught.value.denied is denied
    assert caught.value.recoverable is recoverable
    assert nvml.gpus[0].power_limit_mw == 700_000


def test_nvml_power_out_of_range_is_refused(nvml: PowerNvml, nvml_power: NvmlPower) -> None:
    with pytest.raises(PowerControlError, match="GPU 0 refused setting the power limit to 50 W"):
        nvml_power.set_power_limit_w(0, 50)


def test_nvml_power_a_lost_gpu_raises_on_read(nvml: PowerNvml, nvml_power: NvmlPower) -> None:
    nvml.gpus[1].lost = GPU_IS_LOST
    with pytest.raises(PowerControlError, match="GPU 1 cannot be reached"):
        nvml_power.power_limit_w(1)
    assert nvml_power.power_limit_w(0) == 700.0


def test_nvml_power_without_nvml_raises_clearly() -> None:
    fake = PowerNvml([FakeGpu()])
    fake.init_error = DRIVER_NOT_LOADED
    with (
        installed(fake),
        NvmlPower() as power,
        pytest.raises(PowerControlError, match="NVML is not available"),
    ):
        power.power_limit_w(0)
    assert fake.shutdowns == 0


def test_the_executor_on_nvml_caps_and_restores(nvml: PowerNvml, nvml_power: NvmlPower) -> None:
    ctx = make_ctx(nvml_power)
    outcome = power_cap.execute(make_intent(percent=60), ctx)
    assert outcome.ok, outcome.detail
    assert nvml.gpus[1].power_limit_mw == 420_000
    assert outcome.detail == "set GPU 1 power limit 700 W → 420 W; 60% of the default 700 W"
    result = power_cap.undo(outcome.undo[0], ctx)
    assert result.state == "restored"
    assert nvml.gpus[1].power_limit_mw == 700_000
    assert nvml.sets_mw == [(1, 420_000), (1, 700_000)]


def test_the_executor_on_nvml_without_root_says_so(nvml: PowerNvml, nvml_power: NvmlPower) -> None:
    nvml.gpus[1].failing["nvmlDeviceSetPowerManagementLimit"] = NO_PERMISSION
    outcome = power_cap.execute(make_intent(watts=300), make_ctx(nvml_power))
    assert not outcome.ok
    assert outcome.detail.startswith("GPU 1: setting the power limit to 300 W needs root")
    assert nvml.gpus[1].power_limit_mw == 700_000


# -- the real driver -----------------------------------------------------------------------------


@pytest.mark.gpu
def test_nvml_power_on_a_real_gpu_reads_and_plans_without_changing_anything() -> None:
    """Read-only: it never sets a limit on the machine it runs on (dry-run plans only)."""
    with NvmlPower() as power:
        current = power.power_limit_w(0)
        span = power.power_limit_range_w(0)
        default = power.default_power_limit_w(0)
        if current is None or span is None or default is None:
            pytest.skip("GPU 0 does not report adjustable power limits")
        low, high = span
        assert 0 < low <= current <= high
        assert low <= default <= high
        outcome = power_cap.execute(make_intent(gpu=0, watts=low), make_ctx(power, dry_run=True))
        assert outcome.ok
        assert outcome.dry_run
        if current > low + power_cap.TOLERANCE_W:
            assert outcome.detail.startswith("would set GPU 0 power limit")
        else:
            assert outcome.detail.startswith("already:")
        assert power.power_limit_w(0) == current
