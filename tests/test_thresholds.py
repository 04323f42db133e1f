"""The lines a rule's conditions draw: field-versus-number comparisons, as written."""

from __future__ import annotations

import pytest

from gpuwarden.playbook.thresholds import Threshold, fields_read, thresholds

MEM = "gpu.memory.used_pct"
CASES: list[tuple[str, list[Threshold]]] = [
    (f"{MEM} >= 95", [Threshold(MEM, ">=", 95.0, f"{MEM} >= 95")]),
    # the number first: the comparison is turned round, the text stays as written
    (
        "80 <= gpu.temperature_c",
        [Threshold("gpu.temperature_c", ">=", 80.0, "80 <= gpu.temperature_c")],
    ),
    # a chain is two lines
    (
        "0 < gpu.power_w < 300",
        [
            Threshold("gpu.power_w", ">", 0.0, "0 < gpu.power_w"),
            Threshold("gpu.power_w", "<", 300.0, "gpu.power_w < 300"),
        ],
    ),
    # a history function in the field's unit draws on the field's chart; durations as written
    (
        f"predict({MEM}, 10m) >= 100 and {MEM} < 95",
        [
            Threshold(MEM, ">=", 100.0, f"predict({MEM}, 10m) >= 100", "predict"),
            Threshold(MEM, "<", 95.0, f"{MEM} < 95"),
        ],
    ),
    (
        "avg(gpu.power_w, 5m) > -1.5",
        [Threshold("gpu.power_w", ">", -1.5, "avg(gpu.power_w, 5m) > -1.5", "avg")],
    ),
    # a rate is another unit; a non-numeric field, two fields, arithmetic: nothing to draw
    ("rate(gpu.memory.used_mib, 1m) > 5", []),
    ('event.kind == "xid" and event.xid in [79, 94]', []),
    ("gpu.memory.used_mib > gpu.memory.total_mib", []),
    ("gpu.memory.used_mib + 10 > 100", []),
    (
        "process.priority <= low and process.gpu_memory_mib >= 40960",
        [Threshold("process.gpu_memory_mib", ">=", 40960.0, "process.gpu_memory_mib >= 40960")],
    ),
    # a multi-line YAML block scalar
    (
        "gpu.temperature_c >= 85\n  and gpu.throttled",
        [Threshold("gpu.temperature_c", ">=", 85.0, "gpu.temperature_c >= 85")],
    ),
    ("not valid ((", []),
    ("", []),
]


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_thresholds(text: str, expected: list[Threshold]) -> None:
    assert thresholds(text) == expected


def test_fields_read_in_the_order_written() -> None:
    text = "process.gpu_memory_mib >= 8192 and held_for(process.idle) >= 30m and gpu.lost"
    assert fields_read(text) == ["process.gpu_memory_mib", "process.idle", "gpu.lost"]
    assert fields_read("gpu.memory.used_pct > 1 or gpu.memory.used_pct < 0") == [
        "gpu.memory.used_pct"
    ]
    assert fields_read(None) == []
    assert fields_read("gpu.nonsense > 1") == []
