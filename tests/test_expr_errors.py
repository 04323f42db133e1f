"""What the expression compiler refuses, with the exact message, offset and hint people see
(the whitelist is the security boundary); roots restricted by place."""

from __future__ import annotations

import pytest

from gpuwarden.playbook.expr import Compiler, ExprError
from gpuwarden.playbook.expr_text import MAX_LENGTH
from tests.playbook_envs import ALL_ROOTS, CLASSES

FUNCTIONS_HINT = "functions: avg, min, max, rate, predict, held_for, abs"
RESERVED = "is not allowed: names starting with _ are reserved"

# (expression, message, offset into the expression, hint)
REJECTED: list[tuple[str, str, int, str | None]] = [
    # the security boundary: no Python beyond the whitelist
    ("__import__('os')", f"__import__ {RESERVED}", 0, None),
    ("gpu.__class__", f"__class__ {RESERVED}", 4, None),
    ("gpu.memory.__dict__", f"__dict__ {RESERVED}", 11, None),
    ("().__class__.__bases__", f"__class__ {RESERVED}", 3, None),
    ("gpu.name.__len__()", f"__len__ {RESERVED}", 9, None),
    ("_rank", f"_rank {RESERVED}", 0, None),
    ("_h.avg(0, 1) > 1", f"_h {RESERVED}", 0, None),
    ("[x for x in y]", "comprehensions are not allowed", 0, None),
    ("lambda: 1", "lambda is not allowed", 0, None),
    ("gpu.memory['x']", "subscripts (x[...]) are not allowed", 10, None),
    ('f"{gpu}"', "f-strings are not allowed", 0, None),
    ("open('x')", "open() is not a function here", 0, FUNCTIONS_HINT),
    ("getattr(gpu, 'x')", "getattr() is not a function here", 0, FUNCTIONS_HINT),
    ("gpu.name.upper() == 'X'", "only the documented functions can be called", 0, FUNCTIONS_HINT),
    ("process.info.user", "unknown field process.info.user", 0, "did you mean process.user?"),
    (
        "avg(gpu.power_w, window=5m) > 1",
        "keyword arguments are not allowed",
        17,
        "write avg(field, window)",
    ),
    ("avg(*gpu) > 1", "starred arguments (*x) are not allowed", 4, None),
    (
        "gpu.index if gpu.lost else 1",
        "conditional expressions (a if c else b) are not allowed",
        0,
        None,
    ),
    ("(x := 1)", "assignments (:=) are not allowed", 1, None),
    ("{1, 2}", "sets ({...}) are not allowed; after in, write a list [...]", 0, None),
    ("{'a': 1}", "dicts are not allowed", 0, None),
    ("b'x' == b'x'", "bytes literals (b'...') are not allowed", 0, None),
    ("1j == 1", "complex numbers are not allowed", 0, None),
    ("...", "... is not allowed", 0, None),
    ("await x", "await is not allowed", 0, None),
    ("2 ** 10 > 1", "the operator ** is not allowed", 2, None),
    ("gpu.index | 1 == 1", "the operator | is not allowed", 10, None),
    ("~gpu.index == 1", "the operator ~ is not allowed", 0, None),
    # names and fields
    (
        "gpu.memory.usedpct >= 95",
        "unknown field gpu.memory.usedpct",
        0,
        "did you mean gpu.memory.used_pct?",
    ),
    (
        "gpu.memory.used_pct >= 95 and gpu.tempreature_c < 85",
        "unknown field gpu.tempreature_c",
        30,
        "did you mean gpu.temperature_c?",
    ),
    ("gpu.temperature > 80", "unknown field gpu.temperature", 0, "did you mean gpu.temperature_c?"),
    (
        "process.memory > 1",
        "unknown field process.memory",
        0,
        "did you mean process.gpu_memory_mib?",
    ),
    ("foo.bar > 1", "unknown field foo.bar", 0, None),
    ("temperature_c > 3", "unknown name temperature_c", 0, "did you mean gpu.temperature_c?"),
    ("name == 'x'", "unknown name name", 0, "did you mean gpu.name, process.name or host.name?"),
    ("nromal", "unknown name nromal", 0, "did you mean normal?"),
    ("gpu", "gpu alone is not a value", 0, "use one of its fields, e.g. gpu.index"),
    (
        "gpu.remapped_rows > 0",
        "gpu.remapped_rows is a group of fields, not a value",
        0,
        "use one of gpu.remapped_rows.correctable, gpu.remapped_rows.uncorrectable, "
        "gpu.remapped_rows.pending, gpu.remapped_rows.failure",
    ),
    ("avg", "avg is a function: call it", 0, "e.g. avg(field, window)"),
    (
        "average(gpu.power_w, 5m) > 1",
        "average() is not a function here",
        0,
        f"did you mean 'avg'? ({FUNCTIONS_HINT})",
    ),
    # types
    (
        "gpu.memory.used_pct",
        "a condition must be true or false; gpu.memory.used_pct is a number",
        0,
        "compare it, e.g. gpu.memory.used_pct > 0",
    ),
    ("gpu.name > 5", "cannot compare gpu.name (a string) with 5 (a number)", 0, None),
    ("event.kind == 5", "cannot compare event.kind (a string) with 5 (a number)", 0, None),
    (
        "gpu.index and gpu.lost",
        "and needs true/false on both sides; gpu.index is a number",
        0,
        "compare it, e.g. gpu.index > 0",
    ),
    (
        "gpu.lost or gpu.throttle",
        "or needs true/false on both sides; gpu.throttle is a list",
        12,
        'test for an item, e.g. "..." in gpu.throttle',
    ),
    (
        "not gpu.name",
        "not needs true/false; gpu.name is a string",
        4,
        'compare it, e.g. gpu.name == "..."',
    ),
    ("gpu.lost > 1", "gpu.lost is true/false; it cannot be ordered with >", 0, None),
    (
        "gpu.temperature_c > None",
        "cannot order against null with >",
        20,
        "to test for an unknown value, write x == None",
    ),
    (
        "gpu.name is 'x'",
        "is / is not can only test for null: write x is None",
        12,
        "to compare values, use == or !=",
    ),
    ("gpu.name + 1 > 2", "+ needs numbers; gpu.name is a string", 0, None),
    ("gpu.index / 0 > 1", "division by zero", 12, None),
    (
        "gpu.index in [1, 'a']",
        "a list must hold values of one kind (all numbers or all strings)",
        13,
        None,
    ),
    ("gpu.name in [1, 2]", "gpu.name is a string, but the list after in holds numbers", 0, None),
    ("5 in gpu.throttle", "gpu.throttle holds strings; 5 is a number", 0, None),
    ("5 in process.cmdline", "in a string, look for a string; 5 is a number", 0, None),
    (
        "gpu.index in 5",
        "in needs a list or a string after it; 5 is a number",
        13,
        'e.g. event.xid in [48, 79] or "hw_slowdown" in gpu.throttle',
    ),
    ("[1, 2] == gpu.index", "a list can only follow in or not in", 0, "e.g. event.xid in [48, 79]"),
    ("gpu.index in [[1]]", "a list cannot hold another list", 14, None),
    (
        "gpu.index in [gpu.pstate]",
        "a list may only hold numbers, strings or priority class names",
        14,
        None,
    ),
    # priorities and fixed values
    (
        "process.priority > 2",
        "process.priority compares with a priority class, not a number",
        19,
        "e.g. process.priority <= normal",
    ),
    (
        "process.priority == 'nromal'",
        "unknown priority class 'nromal'",
        20,
        "did you mean 'normal'? (classes: critical, high, normal, low, scavenger)",
    ),
    (
        "process.priority in ['low', 'scavnger']",
        "unknown priority class 'scavnger'",
        28,
        "did you mean 'scavenger'? (classes: critical, high, normal, low, scavenger)",
    ),
    (
        "process.priority == process.name",
        "cannot compare process.priority (a priority class) with process.name (a string)",
        0,
        None,
    ),
    (
        "event.kind == 'xdi'",
        "unknown value 'xdi' for event.kind",
        14,
        "did you mean 'xid'? (one of: xid, ecc_single_bit, ecc_double_bit, gpu_lost, pstate, "
        "clock)",
    ),
    (
        "'hw_thermal' in gpu.throttle",
        "unknown value 'hw_thermal' for gpu.throttle",
        0,
        "did you mean 'hw_thermal_slowdown'? (one of: gpu_idle, applications_clocks_setting, "
        "sw_power_cap, hw_slowdown, sync_boost, sw_thermal_slowdown, hw_thermal_slowdown, "
        "hw_power_brake_slowdown)",
    ),
    (
        "time.weekday_name in ['Mon', 'Fry']",
        "unknown value 'Fry' for time.weekday_name",
        29,
        "did you mean 'Fri'? (one of: Mon, Tue, Wed, Thu, Fri, Sat, Sun)",
    ),
    # functions
    ("avg(gpu.name, 5m) == 'x'", "avg() needs a numeric field; gpu.name is a string", 4, None),
    (
        "avg(5, 5m) > 1",
        "the first argument of avg() must be a field",
        4,
        "e.g. avg(gpu.memory.used_pct, 5m)",
    ),
    (
        "avg(gpu.power_w, gpu.index) > 1",
        "the window of avg() must be a constant duration such as 5m",
        17,
        None,
    ),
    ("avg(gpu.power_w, 0s) > 1", "the window of avg() must be more than 0", 17, None),
    ("predict(gpu.power_w, -1m) > 1", "the horizon of predict() must be 0 or more", 21, None),
    ("avg(gpu.power_w) > 1", "avg() takes 2 arguments: avg(field, window)", 0, None),
    (
        "predict(gpu.power_w) > 1",
        "predict() takes 2 or 3 arguments: predict(field, horizon[, window])",
        0,
        None,
    ),
    ("held_for(true, 1) > 0", "held_for() takes 1 argument: held_for(condition)", 0, None),
    (
        "avg(time.hour, 5m) > 1",
        "avg() keeps history of gpu.*, process.* and host.* fields only",
        4,
        None,
    ),
    (
        "held_for(gpu.index) > 1",
        "held_for() needs a condition (true/false); gpu.index is a number",
        9,
        "compare it, e.g. gpu.index > 0",
    ),
    ("held_for(avg(gpu.power_w, 5m) > 1) > 1", "avg() cannot be used inside held_for()", 9, None),
    (
        "held_for(held_for(gpu.lost) > 1) > 1",
        "held_for() cannot be used inside held_for()",
        9,
        None,
    ),
    (
        "held_for(event.xid == 79) > 1",
        "held_for() cannot watch event.* fields: events have no history",
        9,
        None,
    ),
    ("abs(gpu.name) > 1", "abs() needs numbers; gpu.name is a string", 4, None),
    # syntax, with offsets in the text as written (durations and non-ASCII before the error)
    ("", "empty expression", 0, "e.g. gpu.memory.used_pct >= 95"),
    ("gpu.index == 1;", "not a valid expression: invalid syntax", 14, None),
    ("gpu.index > -", "not a valid expression: invalid syntax", 13, "the expression is incomplete"),
    ("gpu.index == 1 and (", "not a valid expression: '(' was never closed", 19, None),
    ("'abc", "not a valid expression: unterminated string literal (detected at line 1)", 0, None),
    (
        "gpu.lost || gpu.mig_mode",
        "not a valid expression: invalid syntax",
        10,
        "write and / or instead of && / ||",
    ),
    ("!gpu.lost", "not a valid expression: invalid syntax", 0, "write not instead of !"),
    (
        "gpu.memory.used_pct = 95",
        "not a valid expression: invalid syntax",
        20,
        "compare with ==, not =",
    ),
    ("gpu.index >= 5m5", "not a valid expression: invalid decimal literal", 13, None),
    ("avg(gpu.power_w, 5m) > gpu.nope", "unknown field gpu.nope", 23, "did you mean gpu.name?"),
    (
        "avg(gpu.power_w, 1h30m) + 2h > 30s * gpu.nope",
        "unknown field gpu.nope",
        37,
        "did you mean gpu.name?",
    ),
    ("'é' == gpu.nme", "unknown field gpu.nme", 7, "did you mean gpu.name?"),
    ("gpu.index == 1 and\n  gpu.nme == 'x'", "unknown field gpu.nme", 21, "did you mean gpu.name?"),
    ("a\0b", "a NUL character is not allowed", 1, None),
    ("not " * 70 + "true", "expression nested too deeply (more than 64 levels)", 256, None),
    (
        "x" * (MAX_LENGTH + 1),
        f"expression too long ({MAX_LENGTH + 1} characters; at most {MAX_LENGTH})",
        MAX_LENGTH,
        None,
    ),
]


@pytest.mark.parametrize(("text", "message", "offset", "hint"), REJECTED)
def test_rejected(text: str, message: str, offset: int, hint: str | None) -> None:
    with pytest.raises(ExprError) as caught:
        Compiler(CLASSES).compile(text, roots=ALL_ROOTS)
    assert (caught.value.message, caught.value.offset, caught.value.hint) == (
        message,
        offset,
        hint,
    )
    assert 0 <= caught.value.offset <= len(text)


def test_str_carries_the_hint() -> None:
    error = ExprError("unknown field gpu.x", 4, "did you mean gpu.index?")
    assert str(error) == "unknown field gpu.x (hint: did you mean gpu.index?)"
    assert str(ExprError("empty expression", 0)) == "empty expression"


@pytest.mark.parametrize(
    ("text", "roots", "place", "message", "hint"),
    [
        (
            "process.pid > 1",
            {"gpu", "host", "time"},
            "in a rule with for_each: gpu",
            "process.* is not available in a rule with for_each: gpu",
            "this expression can read gpu.*, host.*, time.*",
        ),
        (
            "gpu.index == 0 and event.xid == 79",
            {"gpu", "host", "time"},
            None,
            "event.* is not available here",
            "this expression can read gpu.*, host.*, time.*",
        ),
        (
            "avg(process.cpu_pct, 5m) > 1",
            {"host", "time"},
            None,
            "process.* is not available here",
            "this expression can read host.*, time.*",
        ),
        (
            "held_for(gpu.lost) > 1",
            {"host"},
            None,
            "gpu.* is not available here",
            "this expression can read host.*",
        ),
    ],
)
def test_roots_are_restricted_by_place(
    text: str, roots: set[str], place: str | None, message: str, hint: str
) -> None:
    with pytest.raises(ExprError) as caught:
        Compiler(CLASSES).compile(text, roots=roots, place=place)
    assert (caught.value.message, caught.value.hint) == (message, hint)
