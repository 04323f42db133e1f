"""The field catalogue: every documented field reads real model objects, unknown stays None,
and the host and time views are what rules expect."""

from __future__ import annotations

import ast
import datetime
from pathlib import Path

import pytest

from gpuwarden.config import Priorities
from gpuwarden.model import THROTTLE_REASONS, EventKind, GpuState, Memory, Snapshot
from gpuwarden.playbook.fields import (
    FIELDS,
    FUNCTIONS,
    ROOTS,
    Field,
    HostView,
    helper_globals,
    host_view,
    tick_env,
    time_view,
)
from tests.playbook_envs import CLASSES, NOW, SNAPSHOT, TRAINER, UTC, XID79, env

# The fields the playbook reference promises (issue 3 and DESIGN.md).
_PROMISED_TEXT = """
gpu.index gpu.name gpu.uuid gpu.lost gpu.error gpu.memory.used_mib gpu.memory.total_mib
gpu.memory.free_mib gpu.memory.reserved_mib gpu.memory.used_pct gpu.memory.free_pct
gpu.utilization_pct gpu.memory_utilization_pct gpu.temperature_c gpu.power_w gpu.power_limit_w
gpu.power_pct gpu.throttle gpu.throttled gpu.ecc.volatile_corrected gpu.ecc.volatile_uncorrected
gpu.ecc.aggregate_corrected gpu.ecc.aggregate_uncorrected gpu.remapped_rows.correctable
gpu.remapped_rows.uncorrectable gpu.remapped_rows.pending gpu.remapped_rows.failure
gpu.retired_pages.single_bit gpu.retired_pages.double_bit gpu.retired_pages.pending gpu.pstate
gpu.mig_mode gpu.process_count process.pid process.gpu process.gpu_memory_mib
process.sm_util_pct process.idle process.user process.uid process.name process.cmdline
process.priority process.declared_priority process.checkpointable process.checkpoint_signal
process.status process.zombie process.orphaned process.nice process.cpu_pct process.rss_mib
process.age_s process.container process.pod process.slurm_job process.unit host.name
host.gpu_count host.gpus_lost host.memory_used_mib host.memory_total_mib host.memory_used_pct
host.process_count event.kind event.gpu event.xid event.detail time.epoch time.year time.month
time.day time.hour time.minute time.weekday time.weekday_name time.is_weekend
"""
PROMISED = _PROMISED_TEXT.split()
ENV_NAMES = set(ROOTS) | {"_now", "_gpu_procs", "_rank", "_benign_throttle"}
PYTHON_TYPES: dict[str, tuple[type, ...]] = {
    "number": (int, float),
    "integer": (int,),
    "string": (str,),
    "boolean": (bool,),
    "list[string]": (tuple,),
    "priority": (int,),
}


def read(field: Field, scope: dict[str, object], classes: tuple[str, ...] = CLASSES) -> object:
    return eval(field.accessor, helper_globals(classes), scope)


def test_every_promised_field_is_documented() -> None:
    assert [p for p in PROMISED if p not in FIELDS] == []


def test_catalogue_is_consistent() -> None:
    for path, field in FIELDS.items():
        assert field.path == path
        assert field.root in ROOTS
        assert field.doc
        assert "\n" not in field.doc
        assert field.numeric == (field.type in ("number", "integer"))
        names = {
            n.id
            for n in ast.walk(ast.parse(field.accessor, mode="eval"))
            if isinstance(n, ast.Name)
        }
        assert names <= ENV_NAMES, path
        assert field.root in names, f"{path} does not read its own root"
    assert set(FUNCTIONS) == {"avg", "min", "max", "rate", "predict", "held_for", "abs"}


def test_choices_are_the_model_names() -> None:
    assert FIELDS["gpu.throttle"].choices == tuple(THROTTLE_REASONS.values())
    assert FIELDS["event.kind"].choices == tuple(k.value for k in EventKind)


def test_a_field_type_must_be_known() -> None:
    with pytest.raises(ValueError, match="unknown field type"):
        Field("gpu.x", "gpu.x", "float", True, "x")


def scopes() -> list[tuple[str, dict[str, object]]]:
    return [
        ("hot+trainer", env("hot", "trainer", event=XID79)),
        ("unknown+ghost", env("unknown", "ghost", event=XID79)),
        ("lost+ghost", env("lost", "ghost", event=XID79)),
        ("idle+trainer", env("idle", "trainer", event=XID79)),
    ]


@pytest.mark.parametrize("path", sorted(FIELDS))
def test_every_accessor_reads_real_objects_with_its_declared_type(path: str) -> None:
    field = FIELDS[path]
    for name, scope in scopes():
        value = read(field, scope)
        if value is None:
            assert field.nullable, f"{path} is None for {name} but not nullable"
            continue
        assert isinstance(value, PYTHON_TYPES[field.type]), (path, name, value)
        if field.type == "list[string]":
            assert all(isinstance(v, str) for v in value)  # type: ignore[attr-defined]


def test_full_gpu_reads_what_it_holds() -> None:
    scope = env("hot", "trainer", event=XID79)
    expected = {
        "gpu.memory.used_pct": 97.5,
        "gpu.memory.free_pct": 2.5,
        "gpu.power_pct": 97.5,
        "gpu.throttle": ("sw_power_cap", "hw_thermal_slowdown"),
        "gpu.throttled": True,
        "gpu.ecc.aggregate_uncorrected": 1,
        "gpu.remapped_rows.pending": True,
        "gpu.retired_pages.single_bit": None,
        "gpu.process_count": 1,
        "process.cmdline": "python3 train.py --epochs 90",
        "process.priority": 1,
        "process.declared_priority": 2,
        "process.idle": True,
        "process.zombie": False,
        "process.checkpointable": True,
        "process.age_s": 3 * 3600.0,
        "process.unit": None,
        "event.kind": "xid",
        "event.xid": 79,
        "host.name": "gpu-node-7",
        "time.weekday_name": "Mon",
    }
    assert {p: read(FIELDS[p], scope) for p in expected} == expected


def test_missing_sub_objects_read_as_none_not_errors() -> None:
    scope = env("unknown", "ghost")
    for path in FIELDS:
        if path.startswith(("gpu.ecc.", "gpu.remapped_rows.", "gpu.retired_pages.")):
            assert read(FIELDS[path], scope) is None, path
    for path in (
        "gpu.power_pct",
        "gpu.throttle",
        "gpu.throttled",
        "process.cmdline",
        "process.idle",
        "process.zombie",
        "process.age_s",
        "process.declared_priority",
    ):
        assert read(FIELDS[path], scope) is None, path


def test_throttled_ignores_idle_and_pinned_clocks() -> None:
    assert read(FIELDS["gpu.throttled"], env("idle")) is False
    assert read(FIELDS["gpu.throttled"], env("hot")) is True


def test_power_pct_is_unknown_without_a_limit() -> None:
    assert read(FIELDS["gpu.power_pct"], env("idle")) is None  # limit reported as 0 W


def test_process_count_is_unknown_on_a_lost_gpu() -> None:
    assert read(FIELDS["gpu.process_count"], env("lost")) is None
    assert read(FIELDS["gpu.process_count"], env("idle")) == 0
    assert read(FIELDS["gpu.process_count"], env("unknown")) == 1  # the ghost holds it


def test_priority_reads_the_rank_of_the_configured_classes() -> None:
    priorities = Priorities()
    ranks = helper_globals(priorities.names)["_rank"]
    assert ranks == {name: priorities.rank(name) for name in priorities.names}
    custom = read(FIELDS["process.priority"], env("hot", "trainer"), ("gold", "low", "tin"))
    assert custom == 1


def test_helper_globals_have_no_builtins() -> None:
    assert helper_globals(CLASSES)["__builtins__"] == {}


def test_host_view_sums_what_gpus_report() -> None:
    assert host_view(SNAPSHOT) == HostView(
        name="gpu-node-7",
        gpu_count=4,
        gpus_lost=1,
        memory_used_mib=78000,
        memory_total_mib=160000,
        memory_used_pct=48.75,
        process_count=2,
    )


def test_host_view_of_gpus_that_report_no_memory() -> None:
    view = host_view(Snapshot(host="h", time=NOW, gpus=(GpuState(index=0, lost=True),)))
    assert (view.memory_used_mib, view.memory_total_mib, view.memory_used_pct) == (None,) * 3
    empty = host_view(Snapshot(host="h", time=NOW, gpus=()))
    assert (empty.gpu_count, empty.process_count, empty.memory_used_pct) == (0, 0, None)


def test_host_counts_a_process_on_two_gpus_once() -> None:
    twice = (TRAINER, TRAINER.__class__(pid=4242, gpu=1, gpu_memory_mib=1, info=TRAINER.info))
    gpus = (GpuState(index=0, memory=Memory(total_mib=0, used_mib=0)),)
    view = host_view(Snapshot(host="h", time=NOW, gpus=gpus, processes=twice))
    assert view.process_count == 1
    assert view.memory_used_pct is None  # a total of 0 MiB says nothing


@pytest.mark.parametrize(
    ("moment", "tz", "expected"),
    [
        (
            datetime.datetime(2026, 1, 5, 10, 30, tzinfo=UTC),
            UTC,
            (2026, 1, 5, 10, 30, 1, "Mon", False),
        ),
        (
            datetime.datetime(2026, 1, 11, 23, 59, tzinfo=UTC),
            UTC,
            (2026, 1, 11, 23, 59, 7, "Sun", True),
        ),
        # 02:00 UTC on a Monday is still Sunday evening five hours west.
        (
            datetime.datetime(2026, 1, 12, 2, 0, tzinfo=UTC),
            datetime.timezone(datetime.timedelta(hours=-5)),
            (2026, 1, 11, 21, 0, 7, "Sun", True),
        ),
        (
            datetime.datetime(2026, 1, 10, 0, 0, tzinfo=UTC),
            UTC,
            (2026, 1, 10, 0, 0, 6, "Sat", True),
        ),
    ],
)
def test_time_view(
    moment: datetime.datetime, tz: datetime.tzinfo, expected: tuple[object, ...]
) -> None:
    view = time_view(moment.timestamp(), tz)
    got = (
        view.year,
        view.month,
        view.day,
        view.hour,
        view.minute,
        view.weekday,
        view.weekday_name,
        view.is_weekend,
    )
    assert got == expected
    assert view.epoch == moment.timestamp()


def test_tick_env_holds_the_shared_part() -> None:
    base = tick_env(SNAPSHOT, NOW, UTC)
    assert set(base) == {"host", "time", "_now", "_gpu_procs"}
    assert base["_gpu_procs"] == {0: 1, 1: 1}
    assert base["_now"] == NOW


def test_playbook_and_history_modules_import_no_io() -> None:
    """The expression code and the history are pure: no module that does I/O."""
    banned = {
        "os",
        "subprocess",
        "socket",
        "time",
        "pynvml",
        "psutil",
        "pathlib",
        "shutil",
        "signal",
        "threading",
        "io",
        "sqlite3",
        "urllib",
        "http",
        "requests",
        "builtins",
    }
    root = Path(__file__).resolve().parent.parent / "daemon" / "gpuwarden"
    mine = [
        *(root / "playbook").glob("expr*.py"),
        root / "playbook" / "fields.py",
        root / "playbook" / "views.py",
        root / "engine" / "history.py",
    ]
    assert len(mine) >= 9
    for path in mine:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] not in banned, f"{path.name} imports {name}"
