"""positional_maker: what it makes cannot be told from what the dataclass's own __init__ makes."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from typing import Any

import pytest

from gpuwarden.model import (
    Ecc,
    Event,
    EventKind,
    GpuProcess,
    GpuState,
    Memory,
    ProcessInfo,
    RemappedRows,
    Snapshot,
    positional_maker,
)

INFO = ProcessInfo(pid=4242, name="python", cmdline=("python", "train.py"), groups=("ml",))
MEMORY = Memory(81920, 40100, 41820, None)
GPU = GpuState(
    0,
    "NVIDIA H100",
    "GPU-1",
    "00000000:18:00.0",
    False,
    None,
    MEMORY,
    90,
    None,
    71,
    512.25,
    700.0,
    ("sw_power_cap",),
    Ecc(0, 0, 1, 0),
    RemappedRows(2, 0, True, False),
    None,
    0,
    False,
    1980,
    2619,
    None,
)
PROCESS = GpuProcess(4242, 0, 40000, INFO, 93, "GPU-1", "compute")
SNAPSHOT = Snapshot(
    "node-1",
    1.5,
    (GPU,),
    (PROCESS,),
    (Event(EventKind.XID, 1.0, 0, 79, "fell off"),),
    "scenario:x",
    True,
)
ORIGINALS: list[Any] = [MEMORY, GPU, PROCESS, SNAPSHOT, INFO, Event(EventKind.CLOCK, 2.0)]


def values(obj: Any) -> list[Any]:
    return [getattr(obj, f.name) for f in dataclasses.fields(obj)]


@pytest.mark.parametrize("original", ORIGINALS, ids=lambda o: type(o).__name__)
def test_made_objects_are_the_dataclass_s_own(original: Any) -> None:
    cls = type(original)
    made = positional_maker(cls)(*values(original))
    assert type(made) is cls
    assert made == original
    assert original == made
    assert hash(made) == hash(original)
    assert repr(made) == repr(original)
    assert values(made) == values(original)
    assert all(a is b for a, b in zip(values(made), values(original), strict=True))
    assert pickle.loads(pickle.dumps(made)) == original
    assert copy.copy(made) == original
    assert copy.deepcopy(made) == original
    assert dataclasses.replace(made) == original
    assert not hasattr(made, "__dict__")
    name = dataclasses.fields(made)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(made, name, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        delattr(made, name)
    with pytest.raises((AttributeError, TypeError)):
        made.extra = 1


def test_a_made_object_differs_where_a_value_differs() -> None:
    make = positional_maker(Memory)
    assert make(1, 2, 3, None) != Memory(1, 2, 3, 0)
    assert make(1, 2, 3, None) == Memory(1, 2, 3)
    assert hash(make(1, 2, 3, None)) != hash(make(1, 2, 4, None))


def test_every_field_must_be_given() -> None:
    with pytest.raises(TypeError):
        positional_maker(Memory)(1, 2, 3)


@dataclasses.dataclass(frozen=True, slots=True)
class Checked:
    value: int

    def __post_init__(self) -> None:
        if self.value < 0:
            raise ValueError("negative")


@dataclasses.dataclass(frozen=True)
class Unslotted:
    value: int


@dataclasses.dataclass(frozen=True, slots=True)
class Derived:
    value: int
    twice: int = dataclasses.field(init=False, default=0)


@pytest.mark.parametrize("cls", [Checked, Unslotted, Derived])
def test_a_class_whose_init_does_more_than_store_is_refused(cls: type) -> None:
    with pytest.raises(TypeError, match="not a slotted dataclass"):
        positional_maker(cls)
