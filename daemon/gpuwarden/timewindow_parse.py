"""The syntax of ``active:`` windows and ``every:`` schedules: text in, spans and slots out.

Every malformed value raises ``WindowError`` with the offset of the problem and what was
expected. ``gpuwarden/timewindow.py`` builds ``ActiveWindows`` and ``Schedule`` from what this
module returns and decides, for an instant and a zone, whether a window holds it and when a
schedule next runs.

``active``: ``always``; whole days ``Sat,Sun``, ``Fri-Mon`` (ranges may wrap the week); days then
time ranges ``Mon-Fri 08:00-12:00, 13:00-18:00``; no days means every day. A range that ends before
it starts runs past midnight and belongs to its start day (``Mon 22:00-06:00``: Monday 22:00 to
Tuesday 06:00). ``;``, or a day after a time, starts another clause; a YAML list means any of its
windows. Days are ``Mon``..``Sun`` or full names, any case; times 24-hour ``HH:MM``, ``24:00`` only
as an end. A window becomes spans of minutes of the week (Monday 00:00 is 0).

``every``: ``hourly``, ``hourly :15``, ``hourly :00, :30`` (minutes past the hour); ``daily 03:00``,
``Mon 09:00``, ``Mon,Thu 09:00, 17:00``, ``Mon 09:00; Fri 17:00`` (weekday and minute-of-day
slots); or an interval (``6h``, ``30m``, ``90`` seconds).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from gpuwarden.units import DurationTooLong, parse_duration

DAY_NAMES = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_FULL = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_DAYS = {n.lower(): i for i, n in enumerate(DAY_NAMES)} | {n: i for i, n in enumerate(_FULL)}
DAY_MINUTES = 24 * 60  # ActiveWindows.spans count minutes from Monday 00:00
WEEK_MINUTES = 7 * DAY_MINUTES
ALWAYS_SPANS = ((0, WEEK_MINUTES),)
_EXPECT_DAY = ", ".join(DAY_NAMES)
_EXPECT_TIME = "a time HH:MM (24-hour, e.g. 08:00)"
_EXPECT_ITEM = "a day (Mon) or a time range (08:00-20:00)"
EXPECT_WINDOW = (
    'days and times such as "Mon-Fri 08:00-20:00", "Sat,Sun", "22:00-06:00", or "always"'
)
EXPECT_EVERY = "hourly, hourly :MM, daily HH:MM, a day and a time (Mon 09:00), or an interval (6h)"
_TOKEN = re.compile(
    r"(?P<space>\s+)|(?P<sep>[,;])|(?P<dash>[-\u2013])|(?P<word>[A-Za-z]+)"
    r"|(?P<clock>\d+(?::\d*)?)|(?P<minute>:\d*)|(?P<bad>.)"
)
_CLOCK = re.compile(r"(\d{1,2}):(\d{2})")
_NUMBER = r"\s*\d+(?:\.\d+)?\s*"
_DURATION_PREFIX = re.compile(rf"(?:{_NUMBER}(?:ms|s|m|h|d))*(?:{_NUMBER})?")


class WindowError(ValueError):
    """A malformed ``active`` or ``every`` value.

    ``offset`` is the 0-based character offset into ``text`` where the problem is; ``index`` is the
    0-based position of ``text`` in a list of windows, or None. ``problem`` says what is wrong and
    ``expected`` what was expected, for callers that render their own ``file:line:col``.
    """

    index: int | None = None

    def __init__(self, problem: str, text: str, offset: int, expected: str | None = None) -> None:
        super().__init__(problem)
        self.problem, self.text, self.offset, self.expected = problem, text, offset, expected

    def __str__(self) -> str:
        where = f" (window {self.index + 1} of the list)" if self.index is not None else ""
        return self.problem + where + (f" — expected {self.expected}" if self.expected else "")


@dataclass(frozen=True)
class _Token:
    kind: str
    text: str
    pos: int
    spaced: bool  # whitespace right before it


@dataclass(frozen=True)
class _Item:
    """A day or day range (``days``), or a time or time range (``start``, ``end``)."""

    pos: int
    raw: str
    sep: str  # separator before it: "" (none), " ", "," or ";"
    days: tuple[int, ...] = ()
    start: int | None = None  # minutes after midnight
    end: int | None = None


def _tokens(text: str) -> list[_Token]:
    out: list[_Token] = []
    for m in _TOKEN.finditer(text):
        kind, pos = m.lastgroup or "", m.start()
        if kind == "bad":
            raise WindowError(f"unexpected {m.group()!r}", text, pos, _EXPECT_ITEM)
        if kind != "space":
            out.append(_Token(kind, m.group(), pos, text[pos - 1 : pos].isspace()))
    return out


def _clock(tok: _Token, text: str, *, end: bool, ranges: bool) -> int:
    m = _CLOCK.fullmatch(tok.text)
    if tok.kind != "clock" or m is None:
        raise WindowError(f"not a time {tok.text!r}", text, tok.pos, _EXPECT_TIME)
    hour, minute = int(m.group(1)), int(m.group(2))
    if minute > 59:
        raise WindowError(f"minute {m.group(2)} out of range", text, m.start(2) + tok.pos, "00-59")
    if hour == 24 and minute == 0:
        if end:
            return DAY_MINUTES
        problem = "24:00 can only end a range" if ranges else "24:00 is not a time of day"
        raise WindowError(problem, text, tok.pos, "00:00-23:59 (midnight is 00:00)")
    if hour > 23:
        what = "00-23, or 24:00 to end a range" if end else "00-23"
        raise WindowError(f"hour {m.group(1)} out of range", text, tok.pos, what)
    return hour * 60 + minute


def _day(tok: _Token | None, text: str, after: str) -> int:
    if tok is None or tok.kind != "word":
        pos = len(text) if tok is None else tok.pos
        raise WindowError(f"expected a day after {after!r}", text, pos, _EXPECT_DAY)
    day = _DAYS.get(tok.text.lower())
    if day is None:
        raise WindowError(f"unknown day {tok.text!r}", text, tok.pos, _EXPECT_DAY)
    return day


def _items(text: str, toks: list[_Token], *, ranges: bool) -> list[_Item]:
    """Days, times and ``:MM`` in order, each with the separator written before it."""
    items: list[_Item] = []
    i, sep, prev = 0, "", None
    while i < len(toks):
        tok = toks[i]
        if tok.kind == "sep":
            if not items or sep in (",", ";"):
                raise WindowError(f"unexpected {tok.text!r}", text, tok.pos, _EXPECT_ITEM)
            sep, prev, i = tok.text, tok, i + 1
            continue
        if items and sep == "" and not tok.spaced:
            if tok.kind == "word" and prev is not None and prev.kind == "clock":
                what = "24-hour HH:MM (20:00 for 8 pm)"
                raise WindowError(f"unexpected {tok.text!r} after a time", text, tok.pos, what)
            raise WindowError(f"expected a space or ',' before {tok.text!r}", text, tok.pos)
        sep = sep or (" " if items else "")
        nxt = toks[i + 1] if i + 1 < len(toks) else None
        after = toks[i + 2] if i + 2 < len(toks) else None
        days: tuple[int, ...] = ()
        start = end = None
        if tok.kind == "word":
            first = last = _day(tok, text, "")
            if nxt is not None and nxt.kind == "dash":
                last, i = _day(after, text, nxt.text), i + 2
            days = tuple((first + k) % 7 for k in range((last - first) % 7 + 1))
        elif tok.kind == "clock":
            start = _clock(tok, text, end=False, ranges=ranges)
            if nxt is not None and nxt.kind == "dash":
                if not ranges:
                    what = "a single time such as 09:00"
                    raise WindowError("a schedule runs at a time, not a range", text, nxt.pos, what)
                if after is None or after.kind != "clock":
                    pos = len(text) if after is None else after.pos
                    raise WindowError("expected an end time after '-'", text, pos, _EXPECT_TIME)
                end, i = _clock(after, text, end=True, ranges=True), i + 2
        else:
            raise WindowError(f"unexpected {tok.text!r}", text, tok.pos, _EXPECT_ITEM)
        prev, i = toks[i], i + 1
        items.append(
            _Item(tok.pos, text[tok.pos : prev.pos + len(prev.text)], sep, days, start, end)
        )
        sep = ""
    if sep:
        raise WindowError(f"nothing after {sep!r}", text, prev.pos if prev else 0, _EXPECT_ITEM)
    return items


def _clauses(text: str, items: list[_Item]) -> list[tuple[tuple[int, ...], list[_Item]]]:
    """Group items into (days, times) clauses: days first, then times; ``;`` starts a new one."""
    out: list[tuple[tuple[int, ...], list[_Item]]] = []
    days: list[int] = []
    times: list[_Item] = []
    for item in items:
        if item.days and times and item.sep == " ":
            what = "days before times (Mon 08:00-10:00), or ',' / ';' before another clause"
            raise WindowError(f"day {item.raw!r} after a time", text, item.pos, what)
        if (item.sep == ";" or (item.days and times)) and (days or times):
            out.append((tuple(days), times))
            days, times = [], []
        if item.days:
            days.extend(item.days)
        else:
            times.append(item)
    if days or times:
        out.append((tuple(days), times))
    return out


def _merge(spans: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return tuple(merged)


def window_spans(text: str) -> tuple[tuple[int, int], ...]:
    """The week-minute spans ``[lo, hi)`` (Monday 00:00 is 0) that one window string covers."""
    toks = _tokens(text)
    if not toks:
        raise WindowError("empty time window", text, 0, EXPECT_WINDOW)
    for tok in toks:
        if tok.kind == "word" and tok.text.lower() == "always":
            if len(toks) == 1:
                return ALWAYS_SPANS
            what = '"always" alone, or days and times'
            raise WindowError("'always' cannot be combined with other windows", text, tok.pos, what)
    spans: list[tuple[int, int]] = []
    for days, times in _clauses(text, _items(text, toks, ranges=True)):
        ranges: list[tuple[int, int]] = []
        for item in times:
            assert item.start is not None
            if item.end is None:
                raise WindowError(
                    f"time {item.raw!r} has no end", text, item.pos, "a range such as 08:00-20:00"
                )
            if item.end == item.start:
                what = "an end that differs from the start (00:00-24:00 is the whole day)"
                raise WindowError(f"empty time range {item.raw!r}", text, item.pos, what)
            ranges.append(
                (item.start, item.end if item.end > item.start else item.end + DAY_MINUTES)
            )
        for day in days or range(7):
            for start, end in ranges or [(0, DAY_MINUTES)]:
                lo, hi = day * DAY_MINUTES + start, day * DAY_MINUTES + end
                spans.extend(
                    [(lo, WEEK_MINUTES), (0, hi - WEEK_MINUTES)]
                    if hi > WEEK_MINUTES
                    else [(lo, hi)]
                )
    return _merge(spans)


def _interval(text: str) -> float:
    try:
        seconds = parse_duration(text)
    except DurationTooLong as exc:
        raise WindowError(str(exc), text, 0, "e.g. 30s, 5m, 6h") from None
    except ValueError:
        at = _DURATION_PREFIX.match(text)
        if ":" in text:
            what = "a day first: daily 09:00 or Mon 09:00"
            raise WindowError("a time needs a day", text, 0, what) from None
        if text.strip().startswith("-"):
            raise WindowError("an interval cannot be negative", text, 0, EXPECT_EVERY) from None
        raise WindowError(
            f"not an interval {text.strip()!r}", text, at.end() if at else 0, EXPECT_EVERY
        ) from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise WindowError("an interval must be longer than zero", text, 0, "e.g. 30s, 5m, 6h")
    return seconds


def _hourly(text: str, toks: list[_Token]) -> tuple[int, ...]:
    minutes: list[int] = []
    for n, tok in enumerate(toks):
        if n % 2:
            if tok.kind != "sep":
                raise WindowError(f"unexpected {tok.text!r}", text, tok.pos, "',' between minutes")
            continue
        m = re.fullmatch(r":(\d{2})", tok.text)
        if tok.kind != "minute" or m is None:
            what = "minutes past the hour as :MM, e.g. hourly :15"
            raise WindowError(f"not a minute {tok.text!r}", text, tok.pos, what)
        if int(m.group(1)) > 59:
            raise WindowError(f"minute {m.group(1)} out of range", text, tok.pos + 1, "00-59")
        minutes.append(int(m.group(1)))
    if toks and toks[-1].kind == "sep":
        raise WindowError(f"nothing after {toks[-1].text!r}", text, toks[-1].pos, ":MM")
    return tuple(sorted(set(minutes))) or (0,)


def _slots(text: str, toks: list[_Token], *, daily: bool) -> tuple[tuple[int, int], ...]:
    """(weekday, minute of day) pairs of a calendar schedule."""
    slots: set[tuple[int, int]] = set()
    if not toks:
        raise WindowError("expected a time after 'daily'", text, len(text), "e.g. daily 03:00")
    for days, times in _clauses(text, _items(text, toks, ranges=False)):
        if daily and days:
            raise WindowError("'daily' takes times only", text, toks[0].pos, "daily HH:MM")
        if not times:
            after = "'daily'" if daily else "the days"
            pos = toks[-1].pos + len(toks[-1].text) if toks else len(text)
            raise WindowError(f"expected a time after {after}", text, pos, "e.g. Mon 09:00")
        if not days and not daily:
            raise WindowError(
                f"time {times[0].raw!r} needs a day",
                text,
                times[0].pos,
                "a day before it (Mon 09:00), or daily 09:00",
            )
        slots.update((d, t.start) for d in (days or range(7)) for t in times if t.start is not None)
    return tuple(sorted(slots))


ScheduleParts = tuple[float | None, tuple[int, ...], tuple[tuple[int, int], ...]]
"""(interval in seconds, minutes past each hour, (weekday, minute of day) slots): one is set."""


def schedule_parts(text: str) -> ScheduleParts:
    """What a schedule string says: an interval, minutes past every hour, or calendar slots."""
    if not text.strip():
        raise WindowError("empty schedule", text, 0, EXPECT_EVERY)
    head = text.lstrip()[0]
    if head.isdigit() or head in ".+-":
        return _interval(text), (), ()
    toks = _tokens(text)
    word = toks[0].text.lower() if toks[0].kind == "word" else ""
    if word == "hourly":
        return None, _hourly(text, toks[1:]), ()
    if word == "daily":
        return None, (), _slots(text, toks[1:], daily=True)
    if word in _DAYS:
        return None, (), _slots(text, toks, daily=False)
    what = f"unknown day or schedule {toks[0].text!r}"
    raise WindowError(what, text, toks[0].pos, EXPECT_EVERY)
