from __future__ import annotations

import threading

import pytest

from gpuwarden.units import MAX_DURATION, DurationTooLong, format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        (90, 90.0),
        (1.5, 1.5),
        ("45", 45.0),
        ("30s", 30.0),
        ("2m", 120.0),
        ("2m30s", 150.0),
        ("1h30m", 5400.0),
        ("3d2h", 266400.0),
        ("500ms", 0.5),
        (" 1h 5m ", 3900.0),
    ],
)
def test_parse(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text",
    [
        "",
        "abc",
        "5x",
        "m5",
        "-3",
        -1,
        True,
        None,
        "5m-3s",
        "1.2.3s",
        "1e400",
        "nan",
        "inf",
        float("inf"),
        float("nan"),
        10**400,
    ],
)
def test_rejects(text: object) -> None:
    with pytest.raises(ValueError, match=r"duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (59.4, "59s"), (60, "1m"), (150, "2m30s"), (3900, "1h05m"), (266400, "3d02h")],
)
def test_format(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.5, "500ms"),
        (0.25, "250ms"),
        (1.5, "1.5s"),
        (2, "2s"),
        (90.5, "1m30.5s"),
        (150, "2m30s"),
        (3900, "1h05m"),
    ],
)
def test_format_exact_keeps_what_was_written(seconds: float, text: str) -> None:
    assert format_duration(seconds, exact=True) == text


@pytest.mark.parametrize("value", ["3651d", "1000000d", 10**12, 1e300, "99999999999999999999h"])
def test_durations_longer_than_ten_years_are_refused(value: object) -> None:
    with pytest.raises(DurationTooLong, match=r"duration too long: .* \(at most 3650d\)"):
        parse_duration(value)


def test_the_longest_duration_is_ten_years_and_fits_every_wait() -> None:
    assert parse_duration("3650d") == MAX_DURATION
    assert threading.TIMEOUT_MAX > MAX_DURATION  # an Event.wait or sleep of it cannot overflow
