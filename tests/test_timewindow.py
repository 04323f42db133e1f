"""Time windows (`active:`) and schedules (`every:`): exact instants, overnight and week wrap,
daylight-saving changes in Europe/Berlin and America/New_York, and every error with its offset."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, tzinfo
from zoneinfo import ZoneInfo

import pytest

from gpuwarden.timewindow import (
    ActiveWindows,
    Schedule,
    WindowError,
    parse_active,
    parse_every,
)

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")
KOLKATA = ZoneInfo("Asia/Kolkata")
Z = ZoneInfo("UTC")
HOUR = 3600.0
DAY = 86400.0
WEEK = 7 * DAY


def at(tz: tzinfo, month: int, day: int, hour: int = 0, minute: int = 0, *, fold: int = 0) -> float:
    """An instant in 2026 given as wall-clock time in ``tz``."""
    return datetime(2026, month, day, hour, minute, tzinfo=tz, fold=fold).timestamp()


def utc(month: int, day: int, hour: int = 0, minute: int = 0) -> float:
    return datetime(2026, month, day, hour, minute, tzinfo=UTC).timestamp()


# 2026-01-05 is a Monday; 2026-01-11 a Sunday.
# Europe/Berlin: clocks go 02:00 CET -> 03:00 CEST on Sun 2026-03-29 at 01:00 UTC,
#                and 03:00 CEST -> 02:00 CET on Sun 2026-10-25 at 01:00 UTC.
# America/New_York: 02:00 EST -> 03:00 EDT on Sun 2026-03-08 at 07:00 UTC,
#                   and 02:00 EDT -> 01:00 EST on Sun 2026-11-01 at 06:00 UTC.


def test_dst_dates_are_what_the_tables_assume() -> None:
    assert at(BERLIN, 3, 29, 3, 0) == utc(3, 29, 1)
    assert at(BERLIN, 3, 29, 1, 59) == utc(3, 29, 0, 59)
    assert at(BERLIN, 10, 25, 2, 0, fold=1) == utc(10, 25, 1)
    assert at(NEW_YORK, 3, 8, 3, 0) == utc(3, 8, 7)
    assert at(NEW_YORK, 11, 1, 1, 0, fold=1) == utc(11, 1, 6)
    assert datetime(2026, 1, 5).weekday() == 0


CONTAINS = [
    # days and times, in UTC
    ("Mon-Fri 08:00-20:00", Z, at(Z, 1, 5, 7, 59), False),
    ("Mon-Fri 08:00-20:00", Z, at(Z, 1, 5, 8, 0), True),
    ("Mon-Fri 08:00-20:00", Z, at(Z, 1, 9, 19, 59) + 59.999, True),
    ("Mon-Fri 08:00-20:00", Z, at(Z, 1, 9, 20, 0), False),
    ("Mon-Fri 08:00-20:00", Z, at(Z, 1, 10, 12, 0), False),
    ("Sat,Sun", Z, at(Z, 1, 10, 0, 0), True),
    ("Sat,Sun", Z, at(Z, 1, 11, 23, 59), True),
    ("Sat,Sun", Z, at(Z, 1, 12, 0, 0), False),
    ("Sat,Sun", Z, at(Z, 1, 9, 23, 59), False),
    ("sat, SUNDAY", Z, at(Z, 1, 11, 12, 0), True),
    # overnight: every day, and belonging to the listed start day only
    ("22:00-06:00", Z, at(Z, 1, 6, 23, 0), True),
    ("22:00-06:00", Z, at(Z, 1, 7, 5, 59), True),
    ("22:00-06:00", Z, at(Z, 1, 7, 6, 0), False),
    ("22:00-06:00", Z, at(Z, 1, 7, 12, 0), False),
    ("Mon 22:00-06:00", Z, at(Z, 1, 5, 23, 0), True),
    ("Mon 22:00-06:00", Z, at(Z, 1, 6, 5, 0), True),
    ("Mon 22:00-06:00", Z, at(Z, 1, 6, 23, 0), False),
    ("Mon 22:00-06:00", Z, at(Z, 1, 5, 5, 0), False),
    ("Mon 22:00-00:00", Z, at(Z, 1, 6, 0, 0), False),
    ("Mon 20:00-24:00", Z, at(Z, 1, 5, 23, 59), True),
    ("Mon 20:00-24:00", Z, at(Z, 1, 6, 0, 0), False),
    # the week wraps: Sunday night runs into Monday, Fri-Mon covers the weekend
    ("Sun 22:00-06:00", Z, at(Z, 1, 12, 3, 0), True),
    ("Sun 22:00-06:00", Z, at(Z, 1, 11, 3, 0), False),
    ("Fri-Mon", Z, at(Z, 1, 9, 0, 0), True),
    ("Fri-Mon", Z, at(Z, 1, 11, 12, 0), True),
    ("Fri-Mon", Z, at(Z, 1, 12, 23, 59), True),
    ("Fri-Mon", Z, at(Z, 1, 13, 0, 0), False),
    ("Fri-Mon", Z, at(Z, 1, 8, 23, 59), False),
    ("Monday-Friday", Z, at(Z, 1, 7, 12, 0), True),
    # several ranges, clauses, spacing, en dash
    ("Mon-Fri 08:00-12:00, 13:00-18:00", Z, at(Z, 1, 6, 12, 30), False),
    ("Mon-Fri 08:00-12:00, 13:00-18:00", Z, at(Z, 1, 6, 13, 0), True),
    ("Mon-Fri 08:00-12:00, 13:00-18:00", Z, at(Z, 1, 10, 9, 0), False),
    ("Mon-Fri 08:00-20:00; Sat 10:00-14:00", Z, at(Z, 1, 10, 11, 0), True),
    ("Mon-Fri 08:00-20:00; Sat 10:00-14:00", Z, at(Z, 1, 10, 9, 0), False),
    ("Mon-Fri 08:00-20:00, Sat 10:00-14:00", Z, at(Z, 1, 10, 11, 0), True),
    ("Mon-Fri 08:00-20:00, Sat 10:00-14:00", Z, at(Z, 1, 9, 19, 0), True),
    ("Sat,Sun; Mon-Fri 08:00-20:00", Z, at(Z, 1, 10, 3, 0), True),
    ("Sat,Sun; Mon-Fri 08:00-20:00", Z, at(Z, 1, 7, 3, 0), False),
    ("Sat, Sun, 10:00-12:00", Z, at(Z, 1, 10, 9, 0), False),
    ("Sat, Sun, 10:00-12:00", Z, at(Z, 1, 10, 10, 0), True),
    ("09:00-10:00; 12:00-13:00", Z, at(Z, 1, 8, 12, 30), True),
    ("  Mon - Fri   8:00 \u2013 20:00 ", Z, at(Z, 1, 5, 8, 0), True),
    ("00:00-24:00", Z, at(Z, 1, 5, 0, 0), True),
    ("always", Z, at(Z, 1, 5, 3, 0), True),
    ("ALWAYS", Z, at(Z, 1, 5, 3, 0), True),
    # a zone: Berlin is UTC+1 in January, UTC+2 in July
    ("Mon-Fri 08:00-20:00", BERLIN, utc(1, 5, 7, 0), True),
    ("Mon-Fri 08:00-20:00", BERLIN, utc(1, 5, 6, 59), False),
    ("Mon-Fri 08:00-20:00", BERLIN, utc(7, 6, 6, 0), True),
    ("Mon-Fri 08:00-20:00", BERLIN, utc(7, 6, 5, 59), False),
    ("Mon 22:00-06:00", NEW_YORK, utc(1, 6, 10, 59), True),  # Tue 05:59 EST
    ("Mon 22:00-06:00", NEW_YORK, utc(1, 6, 11, 0), False),
    # spring forward: 02:00-03:00 does not happen; 02:30-03:30 starts when clocks jump
    ("02:00-03:00", BERLIN, utc(3, 29, 0, 59), False),
    ("02:00-03:00", BERLIN, utc(3, 29, 1, 0), False),
    ("02:30-03:30", BERLIN, utc(3, 29, 1, 0), True),
    ("02:30-03:30", BERLIN, utc(3, 29, 0, 59), False),
    ("Sun 02:30-03:00", NEW_YORK, utc(3, 8, 6, 59), False),
    ("Sun 02:30-03:00", NEW_YORK, utc(3, 8, 7, 0), False),
    ("Sun 02:30-03:00", NEW_YORK, utc(3, 15, 6, 30), True),
    # fall back: 02:00-03:00 happens twice in Berlin, 01:00-02:00 twice in New York
    ("02:00-03:00", BERLIN, utc(10, 25, 0, 0), True),
    ("02:00-03:00", BERLIN, utc(10, 25, 1, 30), True),
    ("02:00-03:00", BERLIN, utc(10, 25, 2, 0), False),
    ("01:00-02:00", NEW_YORK, utc(11, 1, 5, 30), True),
    ("01:00-02:00", NEW_YORK, utc(11, 1, 6, 30), True),
    ("01:00-02:00", NEW_YORK, utc(11, 1, 7, 0), False),
]


@pytest.mark.parametrize(("text", "tz", "epoch", "inside"), CONTAINS)
def test_contains(text: str, tz: tzinfo, epoch: float, inside: bool) -> None:
    assert parse_active(text).contains(epoch, tz) is inside


def test_a_list_is_any_of_its_windows() -> None:
    windows = parse_active(["Mon-Fri 09:00-17:00", "Sat,Sun 10:00-12:00"])
    assert windows.contains(at(Z, 1, 7, 9, 0), Z)
    assert windows.contains(at(Z, 1, 10, 11, 0), Z)
    assert not windows.contains(at(Z, 1, 10, 9, 0), Z)
    assert not windows.contains(at(Z, 1, 7, 8, 59), Z)
    assert windows == ActiveWindows("Mon-Fri 09:00-17:00; Sat,Sun 10:00-12:00")
    assert parse_active(("22:00-06:00",)).contains(at(Z, 1, 7, 1, 0), Z)


def test_always_in_a_list_is_always() -> None:
    windows = parse_active(["Mon 08:00-09:00", "always"])
    assert windows.always
    assert windows.text == "always"
    assert windows.next_change(at(Z, 1, 5), Z) is None


@pytest.mark.parametrize(
    "text", ["always", "00:00-24:00", "Mon-Sun", "Fri-Thu", "Sat,Sun; Mon-Fri"]
)
def test_the_whole_week_never_changes(text: str) -> None:
    windows = parse_active(text)
    assert windows.always
    assert windows.contains(at(BERLIN, 3, 29, 2, 30), BERLIN)
    assert windows.next_change(at(BERLIN, 3, 28, 12, 0), BERLIN) is None


def test_the_text_is_kept_and_defines_equality() -> None:
    assert parse_active("Mon-Fri 08:00-20:00").text == "Mon-Fri 08:00-20:00"
    assert ActiveWindows("Sat,Sun") == parse_active("Sat,Sun")
    assert parse_active("Sat,Sun") != parse_active("Sat-Sun")
    assert parse_active("Sat,Sun").spans == parse_active("Sat-Sun").spans


NEXT_CHANGE = [
    ("Mon-Fri 08:00-20:00", Z, at(Z, 1, 5, 7, 0), at(Z, 1, 5, 8, 0)),
    ("Mon-Fri 08:00-20:00", Z, at(Z, 1, 5, 8, 0), at(Z, 1, 5, 20, 0)),
    ("Mon-Fri 08:00-20:00", Z, at(Z, 1, 9, 20, 0), at(Z, 1, 12, 8, 0)),  # over the weekend
    ("Mon-Fri 08:00-20:00", Z, at(Z, 1, 10, 12, 0), at(Z, 1, 12, 8, 0)),
    ("Sat,Sun", Z, at(Z, 1, 7, 12, 0), at(Z, 1, 10, 0, 0)),
    ("Sat,Sun", Z, at(Z, 1, 10, 0, 0), at(Z, 1, 12, 0, 0)),
    ("Sun 22:00-06:00", Z, at(Z, 1, 11, 23, 0), at(Z, 1, 12, 6, 0)),  # across the week's end
    ("Sun 22:00-06:00", Z, at(Z, 1, 12, 6, 0), at(Z, 1, 18, 22, 0)),
    ("Fri-Mon", Z, at(Z, 1, 9, 3, 0), at(Z, 1, 13, 0, 0)),
    ("22:00-06:00", Z, at(Z, 1, 6, 12, 0) + 0.5, at(Z, 1, 6, 22, 0)),
    ("Mon 20:00-24:00, Tue 00:00-02:00", Z, at(Z, 1, 5, 21, 0), at(Z, 1, 6, 2, 0)),
    # Berlin spring forward (Sun 03-29, 02:00 -> 03:00)
    ("02:30-02:45", BERLIN, at(BERLIN, 3, 28, 3, 0), utc(3, 30, 0, 30)),  # Sunday's never happens
    ("02:30-03:30", BERLIN, utc(3, 29, 0, 30), utc(3, 29, 1, 0)),  # opens as clocks jump
    ("02:30-03:30", BERLIN, utc(3, 29, 1, 0), utc(3, 29, 1, 30)),
    ("Mon-Fri 08:00-20:00", BERLIN, at(BERLIN, 3, 27, 20, 0), utc(3, 30, 6, 0)),
    # Berlin fall back (Sun 10-25, 03:00 -> 02:00)
    ("02:00-03:00", BERLIN, utc(10, 25, 0, 30), utc(10, 25, 2, 0)),  # two real hours
    ("01:00-02:30", BERLIN, utc(10, 24, 23, 30), utc(10, 25, 0, 30)),
    ("01:00-02:30", BERLIN, utc(10, 25, 0, 30), utc(10, 25, 1, 0)),  # 02:00 comes again
    ("01:00-02:30", BERLIN, utc(10, 25, 1, 0), utc(10, 25, 1, 30)),
    # New York spring forward (Sun 03-08, 02:00 -> 03:00): the 02:30 window is skipped a week
    ("Sun 02:30-03:00", NEW_YORK, at(NEW_YORK, 3, 7, 12, 0), utc(3, 15, 6, 30)),
    ("Sun 02:30-03:00", NEW_YORK, at(NEW_YORK, 3, 1, 2, 45), utc(3, 1, 8, 0)),
    ("Sun 02:00-04:00", NEW_YORK, at(NEW_YORK, 3, 8, 1, 0), utc(3, 8, 7, 0)),
    ("Sun 02:00-04:00", NEW_YORK, utc(3, 8, 7, 0), utc(3, 8, 8, 0)),
    # New York fall back (Sun 11-01, 02:00 -> 01:00)
    ("Sun 01:30-02:00", NEW_YORK, utc(11, 1, 5, 0), utc(11, 1, 5, 30)),
    ("Sun 01:30-02:00", NEW_YORK, utc(11, 1, 5, 30), utc(11, 1, 6, 0)),
    ("Sun 01:30-02:00", NEW_YORK, utc(11, 1, 6, 0), utc(11, 1, 6, 30)),
    ("Sun 01:30-02:00", NEW_YORK, utc(11, 1, 6, 30), utc(11, 1, 7, 0)),
]


@pytest.mark.parametrize(("text", "tz", "epoch", "expected"), NEXT_CHANGE)
def test_next_change(text: str, tz: tzinfo, epoch: float, expected: float) -> None:
    windows = parse_active(text)
    change = windows.next_change(epoch, tz)
    assert change == expected
    assert windows.contains(change, tz) != windows.contains(epoch, tz)
    assert windows.contains(change - 1, tz) == windows.contains(epoch, tz)


BRUTE_WINDOWS = [
    "Mon-Fri 08:00-20:00",
    "22:00-06:00",
    "Sun 01:30-03:30",
    "02:15-02:45",
    "Sat 23:00-01:00; Sun 02:00-03:00",
    "Fri-Mon 00:00-02:30, 20:00-24:00",
]
BRUTE_STARTS = [
    (BERLIN, at(BERLIN, 3, 28, 0, 0)),
    (BERLIN, at(BERLIN, 10, 24, 0, 0)),
    (NEW_YORK, at(NEW_YORK, 3, 7, 0, 0)),
    (NEW_YORK, at(NEW_YORK, 10, 31, 0, 0)),
]


@pytest.mark.parametrize(("text", "start"), list(itertools.product(BRUTE_WINDOWS, BRUTE_STARTS)))
def test_next_change_agrees_with_a_minute_by_minute_walk(
    text: str, start: tuple[ZoneInfo, float]
) -> None:
    """Every flip over three days around a clock change, found by stepping one minute at a time."""
    tz, t = start
    windows = parse_active(text)
    flips = []
    state = windows.contains(t, tz)
    for minute in range(1, 3 * 24 * 60):
        now = t + 60 * minute
        if windows.contains(now, tz) != state:
            flips.append(now)
            state = not state
    assert flips, "the walk should cross at least one edge"
    chained: list[float] = []
    cursor = t
    while len(chained) < len(flips):
        nxt = windows.next_change(cursor, tz)
        assert nxt is not None
        chained.append(nxt)
        cursor = nxt
    assert chained == flips


ACTIVE_ERRORS = [
    # (value, offset, index, problem, expected contains)
    ("Mnn-Fri 08:00-20:00", 0, None, "unknown day 'Mnn'", "Mon, Tue, Wed, Thu, Fri, Sat, Sun"),
    ("Mon-Frx", 4, None, "unknown day 'Frx'", "Mon, Tue"),
    ("Mon-", 4, None, "expected a day after '-'", "Mon, Tue"),
    ("Mon-08:00", 4, None, "expected a day after '-'", "Mon, Tue"),
    ("hourly", 0, None, "unknown day 'hourly'", "Mon, Tue"),
    ("Mon-Fri 25:00-26:00", 8, None, "hour 25 out of range", "00-23"),
    ("Mon-Fri 08:00-24:30", 14, None, "hour 24 out of range", "24:00 to end a range"),
    ("Mon-Fri 08:60-20:00", 11, None, "minute 60 out of range", "00-59"),
    ("8-20", 0, None, "not a time '8'", "HH:MM"),
    ("08:0-20:00", 0, None, "not a time '08:0'", "HH:MM"),
    ("08:00", 0, None, "time '08:00' has no end", "a range"),
    ("Mon 08:00-", 10, None, "expected an end time after '-'", "HH:MM"),
    ("08:00-Mon", 6, None, "expected an end time after '-'", "HH:MM"),
    ("24:00-06:00", 0, None, "24:00 can only end a range", "00:00-23:59"),
    ("08:00-08:00", 0, None, "empty time range '08:00-08:00'", "00:00-24:00"),
    ("Mon-Fri08:00-20:00", 7, None, "expected a space or ',' before '08:00'", None),
    ("08:00pm-10:00", 5, None, "unexpected 'pm' after a time", "24-hour"),
    ("08:00-10:00 Mon", 12, None, "day 'Mon' after a time", "days before times"),
    ("Mon,,Tue", 4, None, "unexpected ','", "a day"),
    ("Mon,", 3, None, "nothing after ','", "a day"),
    ("Mon-Fri 08:00-12:00;", 19, None, "nothing after ';'", "a day"),
    (", Mon", 0, None, "unexpected ','", "a day"),
    ("-Mon", 0, None, "unexpected '-'", "a day"),
    (":15", 0, None, "unexpected ':15'", "a day"),
    ("Mon & Tue", 4, None, "unexpected '&'", "a day"),
    ("08.00-10.00", 2, None, "unexpected '.'", "a day"),
    ("", 0, None, "empty time window", "always"),
    ("   ", 0, None, "empty time window", "always"),
    ("always, Mon", 0, None, "'always' cannot be combined with other windows", '"always" alone'),
    ("Mon, always", 5, None, "'always' cannot be combined with other windows", '"always" alone'),
    (["Mon-Fri 08:00-20:00", "Sun 25:00-26:00"], 4, 1, "hour 25 out of range", "00-23"),
    (["Sat", "Mnn"], 0, 1, "unknown day 'Mnn'", "Mon, Tue"),
    (["Sat", 5], 0, 1, "not a time window: 5", "always"),
    ([], 0, None, "empty list of time windows", "always"),
    ((), 0, None, "empty list of time windows", "always"),
    (5, 0, None, "not a time window: 5", "always"),
]


@pytest.mark.parametrize(("value", "offset", "index", "problem", "expected"), ACTIVE_ERRORS)
def test_active_errors(
    value: object, offset: int, index: int | None, problem: str, expected: str | None
) -> None:
    with pytest.raises(WindowError) as caught:
        parse_active(value)  # type: ignore[arg-type]
    err = caught.value
    assert (err.offset, err.index, err.problem) == (offset, index, problem)
    assert isinstance(err, ValueError)
    if expected is None:
        assert err.expected is None
    else:
        assert err.expected is not None
        assert expected in err.expected
        assert str(err).endswith(f" — expected {err.expected}")
    assert str(err).startswith(problem)
    assert 0 <= err.offset <= len(err.text)
    if index is not None:
        assert f"(window {index + 1} of the list)" in str(err)
        assert isinstance(value, list)
        assert err.text == (value[index] if isinstance(value[index], str) else repr(value[index]))


def test_the_offset_points_into_the_text() -> None:
    with pytest.raises(WindowError) as caught:
        parse_active("Mon-Fri 08:00-20:00, Sat 10:00-14:61")
    err = caught.value
    assert err.text[err.offset :] == "61"
    assert str(err) == "minute 61 out of range — expected 00-59"


def test_the_unknown_day_message_names_the_days() -> None:
    with pytest.raises(WindowError) as caught:
        parse_active("Mnn-Fri 08:00-20:00")
    assert str(caught.value) == ("unknown day 'Mnn' — expected Mon, Tue, Wed, Thu, Fri, Sat, Sun")


# ---- schedules -------------------------------------------------------------------------------

NEXT_RUN = [
    # weekly, across the week's end, strictly after
    ("Mon 09:00", Z, at(Z, 1, 6, 12, 0), at(Z, 1, 12, 9, 0)),
    ("Mon 09:00", Z, at(Z, 1, 11, 23, 0), at(Z, 1, 12, 9, 0)),
    ("Mon 09:00", Z, at(Z, 1, 5, 9, 0), at(Z, 1, 12, 9, 0)),
    ("Mon 09:00", Z, at(Z, 1, 5, 8, 59) + 59.9, at(Z, 1, 5, 9, 0)),
    ("Sun 23:30", Z, at(Z, 1, 11, 23, 30), at(Z, 1, 18, 23, 30)),
    ("sunday 23:30", Z, at(Z, 1, 10, 0, 0), at(Z, 1, 11, 23, 30)),
    ("Mon,Thu 09:00, 17:00", Z, at(Z, 1, 5, 9, 0), at(Z, 1, 5, 17, 0)),
    ("Mon,Thu 09:00, 17:00", Z, at(Z, 1, 5, 17, 0), at(Z, 1, 8, 9, 0)),
    ("Mon 09:00; Fri 17:00", Z, at(Z, 1, 6, 0, 0), at(Z, 1, 9, 17, 0)),
    ("Mon 09:00, Fri 17:00", Z, at(Z, 1, 9, 17, 0), at(Z, 1, 12, 9, 0)),
    ("Fri-Mon 06:00", Z, at(Z, 1, 12, 6, 0), at(Z, 1, 16, 6, 0)),
    # daily
    ("daily 03:00", Z, at(Z, 1, 5, 2, 0), at(Z, 1, 5, 3, 0)),
    ("daily 03:00", Z, at(Z, 1, 5, 3, 0), at(Z, 1, 6, 3, 0)),
    ("daily 00:00, 12:00", Z, at(Z, 1, 5, 12, 0), at(Z, 1, 6, 0, 0)),
    ("Daily 03:00", BERLIN, utc(1, 5, 1, 0), utc(1, 5, 2, 0)),
    # hourly
    ("hourly", Z, at(Z, 1, 5, 10, 0), at(Z, 1, 5, 11, 0)),
    ("hourly", Z, at(Z, 1, 5, 10, 0) + 1, at(Z, 1, 5, 11, 0)),
    ("hourly :15", Z, at(Z, 1, 5, 10, 0), at(Z, 1, 5, 10, 15)),
    ("hourly :15", Z, at(Z, 1, 5, 10, 15), at(Z, 1, 5, 11, 15)),
    ("hourly :00, :30", Z, at(Z, 1, 5, 10, 10), at(Z, 1, 5, 10, 30)),
    ("hourly :00, :30", Z, at(Z, 1, 11, 23, 30), at(Z, 1, 12, 0, 0)),
    ("hourly :15", KOLKATA, utc(1, 5, 0, 0), utc(1, 5, 0, 45)),  # UTC+05:30
    # Berlin spring forward: 02:30 does not exist on 03-29 and runs at 03:30 CEST
    ("daily 02:30", BERLIN, at(BERLIN, 3, 28, 2, 30), utc(3, 29, 1, 30)),
    ("daily 02:30", BERLIN, utc(3, 29, 1, 30), utc(3, 30, 0, 30)),
    ("Sun 02:30", BERLIN, at(BERLIN, 3, 27, 12, 0), utc(3, 29, 1, 30)),
    ("daily 03:00", BERLIN, at(BERLIN, 3, 28, 3, 0), utc(3, 29, 1, 0)),  # 23 h later
    # Berlin fall back: 02:30 happens twice and runs once, at the first
    ("daily 02:30", BERLIN, at(BERLIN, 10, 24, 2, 30), utc(10, 25, 0, 30)),
    ("daily 02:30", BERLIN, utc(10, 25, 0, 30), utc(10, 26, 1, 30)),
    ("hourly :15", BERLIN, utc(10, 25, 0, 0), utc(10, 25, 0, 15)),  # 02:15 CEST
    ("hourly :15", BERLIN, utc(10, 25, 0, 15), utc(10, 25, 1, 15)),  # 02:15 CET, again
    ("hourly :15", BERLIN, utc(10, 25, 1, 15), utc(10, 25, 2, 15)),
    # New York
    ("daily 02:30", NEW_YORK, at(NEW_YORK, 3, 7, 2, 30), utc(3, 8, 7, 30)),  # 03:30 EDT
    ("hourly :15", NEW_YORK, utc(3, 8, 6, 20), utc(3, 8, 7, 15)),  # 01:15 EST, then 03:15 EDT
    ("Sun 01:30", NEW_YORK, at(NEW_YORK, 10, 31, 12, 0), utc(11, 1, 5, 30)),  # first 01:30
    ("Sun 01:30", NEW_YORK, utc(11, 1, 5, 30), utc(11, 8, 6, 30)),
    ("Mon 09:00", NEW_YORK, at(NEW_YORK, 3, 2, 9, 0), utc(3, 9, 13, 0)),  # 9 EST -> 9 EDT
    # intervals, from the last run
    ("6h", Z, 1000.0, 1000.0 + 6 * HOUR),
    ("30m", BERLIN, utc(3, 29, 0, 45), utc(3, 29, 1, 15)),
    ("1h30m", Z, 0.0, 5400.0),
    ("90", Z, 10.0, 100.0),
]


@pytest.mark.parametrize(("text", "tz", "after", "expected"), NEXT_RUN)
def test_next_run(text: str, tz: tzinfo, after: float, expected: float) -> None:
    assert parse_every(text).next_run(after, tz) == expected


@pytest.mark.parametrize(
    ("text", "tz", "start"),
    [
        ("hourly :15", BERLIN, at(BERLIN, 10, 24, 12, 0)),
        ("hourly :15", NEW_YORK, at(NEW_YORK, 3, 7, 12, 0)),
        ("hourly :00, :45", KOLKATA, at(KOLKATA, 1, 5, 0, 0)),
        ("hourly", NEW_YORK, at(NEW_YORK, 10, 31, 12, 0)),
    ],
)
def test_hourly_runs_at_that_minute_of_every_real_hour(text: str, tz: tzinfo, start: float) -> None:
    schedule = parse_every(text)
    runs = []
    t = start
    for _ in range(48):
        t = schedule.next_run(t, tz)
        runs.append(t)
    walked = [
        start + 60 * m
        for m in range(1, 48 * 60 + 1)
        if datetime.fromtimestamp(start + 60 * m, tz).minute in schedule.minutes
    ]
    assert runs == walked[: len(runs)]


def test_weekly_due_across_the_week_boundary() -> None:
    weekly = parse_every("Mon 09:00")
    last = at(Z, 1, 5, 9, 0) + 3  # ran Monday 09:00:03
    assert not weekly.due(last, at(Z, 1, 11, 23, 59), Z)
    assert not weekly.due(last, at(Z, 1, 12, 8, 59), Z)
    assert weekly.due(last, at(Z, 1, 12, 9, 0), Z)
    assert weekly.due(last, at(Z, 1, 14, 0, 0), Z)  # missed while down: still due once
    assert not weekly.due(at(Z, 1, 12, 9, 0), at(Z, 1, 14, 0, 0), Z)


def test_never_ran_calendar_schedule_waits_for_its_time() -> None:
    weekly = parse_every("Mon 09:00")
    assert not weekly.due(None, at(Z, 1, 6, 10, 0), Z)  # started Tuesday: not last Monday's
    assert not weekly.due(None, at(Z, 1, 12, 8, 59), Z)
    assert weekly.due(None, at(Z, 1, 12, 9, 0), Z)
    assert weekly.due(None, at(Z, 1, 12, 9, 4), Z)  # within the default grace of 5 minutes
    assert not weekly.due(None, at(Z, 1, 12, 9, 5), Z)
    assert weekly.due(None, at(Z, 1, 12, 9, 30), Z, grace=HOUR)
    hourly = parse_every("hourly :30")
    assert not hourly.due(None, at(Z, 1, 6, 10, 0), Z)
    assert hourly.due(None, at(Z, 1, 6, 10, 31), Z)


def test_a_load_time_as_last_run_catches_the_first_instant_however_late() -> None:
    weekly = parse_every("Mon 09:00")
    loaded = at(Z, 1, 6, 10, 0)
    assert not weekly.due(loaded, at(Z, 1, 12, 8, 59), Z)
    assert weekly.due(loaded, at(Z, 1, 12, 11, 0), Z)


def test_interval_due() -> None:
    every = parse_every("6h")
    assert every.interval == 6 * HOUR
    assert every.due(None, 5000.0, Z)  # never ran: at once
    assert not every.due(5000.0, 5000.0 + 6 * HOUR - 1, Z)
    assert every.due(5000.0, 5000.0 + 6 * HOUR, Z)


def test_due_across_dst() -> None:
    daily = parse_every("daily 02:30")
    last = at(BERLIN, 3, 28, 2, 30)
    assert not daily.due(last, utc(3, 29, 1, 29), BERLIN)
    assert daily.due(last, utc(3, 29, 1, 30), BERLIN)  # 03:30 CEST: the skipped 02:30
    first = utc(10, 25, 0, 30)  # 02:30 CEST, the first of the two
    assert not daily.due(first, utc(10, 25, 1, 30), BERLIN)  # 02:30 CET: not again
    assert daily.due(first, utc(10, 26, 1, 30), BERLIN)


@pytest.mark.parametrize(
    ("value", "interval"),
    [(3600, 3600.0), (0.5, 0.5), ("500ms", 0.5), (" 2h ", 7200.0), ("1.5h", 5400.0)],
)
def test_intervals(value: str | float, interval: float) -> None:
    schedule = parse_every(value)
    assert schedule.interval == interval
    assert schedule.minutes == ()
    assert schedule.slots == ()


def test_schedule_fields() -> None:
    assert parse_every("hourly").minutes == (0,)
    assert parse_every("hourly :45, :15").minutes == (15, 45)
    assert parse_every("Mon 09:00").slots == ((0, 540),)
    assert parse_every("daily 03:00").slots == tuple((d, 180) for d in range(7))
    assert parse_every("Fri-Mon 06:00").slots == ((0, 360), (4, 360), (5, 360), (6, 360))
    assert parse_every(3600).text == "3600"
    assert Schedule("Mon 09:00") == parse_every("Mon 09:00")
    assert parse_every("Mon 09:00").interval is None


EVERY_ERRORS = [
    ("", 0, "empty schedule", "hourly"),
    ("  ", 0, "empty schedule", "hourly"),
    ("Mnn 09:00", 0, "unknown day or schedule 'Mnn'", "hourly, hourly :MM, daily HH:MM"),
    ("weekly", 0, "unknown day or schedule 'weekly'", "daily HH:MM"),
    ("Mon", 3, "expected a time after the days", "Mon 09:00"),
    ("Mon-Fri", 7, "expected a time after the days", "Mon 09:00"),
    ("Mon 9", 4, "not a time '9'", "HH:MM"),
    ("Mon 24:00", 4, "24:00 is not a time of day", "00:00-23:59"),
    ("Mon 23:60", 7, "minute 60 out of range", "00-59"),
    ("Mon 09:00-10:00", 9, "a schedule runs at a time, not a range", "09:00"),
    ("Mon 09:00 Tue", 10, "day 'Tue' after a time", "days before times"),
    ("Mon 09:00; 17:00", 11, "time '17:00' needs a day", "daily 09:00"),
    ("Mon-Xyz 09:00", 4, "unknown day 'Xyz'", "Mon, Tue"),
    ("daily", 5, "expected a time after 'daily'", "daily 03:00"),
    ("daily Mon 09:00", 6, "'daily' takes times only", "daily HH:MM"),
    ("daily 03:00,", 11, "nothing after ','", "a day"),
    ("hourly 15", 7, "not a minute '15'", ":MM"),
    ("hourly :5", 7, "not a minute ':5'", ":MM"),
    ("hourly :75", 8, "minute 75 out of range", "00-59"),
    ("hourly :15 :45", 11, "unexpected ':45'", "','"),
    ("hourly :15,", 10, "nothing after ','", ":MM"),
    ("6x", 1, "not an interval '6x'", "an interval (6h)"),
    ("1h30x", 4, "not an interval '1h30x'", "6h"),
    ("09:00", 0, "a time needs a day", "daily 09:00"),
    ("0", 0, "an interval must be longer than zero", "30s"),
    ("0s", 0, "an interval must be longer than zero", "30s"),
    (0, 0, "an interval must be longer than zero", "30s"),
    (-5, 0, "an interval cannot be negative", "6h"),
    ("-5m", 0, "an interval cannot be negative", "6h"),
    (True, 0, "not a schedule: True", "hourly"),
    (float("nan"), 0, "not a schedule: nan", "hourly"),
    (None, 0, "not a schedule: None", "hourly"),
    ("Mon @ 09:00", 4, "unexpected '@'", "a day"),
]


@pytest.mark.parametrize(("value", "offset", "problem", "expected"), EVERY_ERRORS)
def test_every_errors(value: object, offset: int, problem: str, expected: str) -> None:
    with pytest.raises(WindowError) as caught:
        parse_every(value)  # type: ignore[arg-type]
    err = caught.value
    assert (err.offset, err.index, err.problem) == (offset, None, problem)
    assert err.expected is not None
    assert expected in err.expected
    assert str(err) == f"{problem} — expected {err.expected}"
