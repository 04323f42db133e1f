"""SVG by hand: escaping, scales, axis ticks, fill patterns and marker shapes.

Every string that reaches the page passes through ``esc``: process names and command lines are
chosen by the users whose jobs gpuwarden watches, so ``<script>`` in a cmdline must arrive as
the text ``<script>``. Control and format characters become ``?`` first (``text.safe_text``),
so a right-to-left override cannot reorder what a reader sees either.

Black and white first: each series is told apart by a dash pattern, a hatch or a shape, and
colour only helps (the Okabe-Ito palette, readable with the common colour-vision deficiencies).
"""

from __future__ import annotations

import datetime as dt
import html
import math
from collections.abc import Sequence

from gpuwarden.text import safe_text

PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#999999")
# dash pattern of a threshold line, by the condition it belongs to
DASHES = {"when": "9 4", "until": "2 3"}
TIME_STEPS = (
    1,
    2,
    5,
    10,
    15,
    30,
    60,
    120,
    300,
    600,
    900,
    1800,
    3600,
    7200,
    10800,
    21600,
    43200,
    86400,
    172800,
    604800,
)


def esc(value: object) -> str:
    """Text for HTML or SVG, element content or attribute value alike. Line breaks and tabs
    stay (HTML reads them as spaces, ``<pre>`` keeps them); other control and format
    characters become ``?``."""
    text = "" if value is None else str(value)
    lines = "\n".join(safe_text(line) for line in text.replace("\t", " ").split("\n"))
    return html.escape(lines, quote=True)


def num(value: float) -> str:
    """A coordinate: one decimal, no trailing zeros."""
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text


class Scale:
    """A linear map from a domain [d0, d1] to a range [r0, r1]."""

    def __init__(self, d0: float, d1: float, r0: float, r1: float) -> None:
        self.d0, self.d1, self.r0, self.r1 = d0, d1, r0, r1
        self._k = (r1 - r0) / (d1 - d0) if d1 != d0 else 0.0

    def __call__(self, value: float) -> float:
        return self.r0 + (value - self.d0) * self._k


def nice_step(span: float, target: int) -> float:
    """1, 2 or 5 times a power of ten, giving about ``target`` steps over ``span``."""
    if span <= 0 or not math.isfinite(span):
        return 1.0
    raw = span / max(1, target)
    power = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 5, 10):
        if factor * power >= raw:
            return float(factor * power)
    return float(10 * power)


def value_range(
    values: list[float] | Sequence[float],
    marks: list[float],
    floor: float | None,
    ceiling: float | None,
    *,
    zoom: bool = True,
) -> tuple[float, float]:
    """The y domain of a panel: the data and the threshold values with some air, never below
    ``floor`` or above ``ceiling`` when the data stay within them. ``zoom=False`` starts at
    the floor (a stacked area must)."""
    known = [v for v in values if math.isfinite(v)] + [m for m in marks if math.isfinite(m)]
    if not known:
        return (floor or 0.0), (ceiling or 1.0)
    low, high = min(known), max(known)
    pad = max(1.0, (high - low) * 0.08)
    lo = low - pad if zoom or floor is None else floor
    hi = high + pad
    step = nice_step(hi - lo, 4)
    lo, hi = float(math.floor(lo / step) * step), float(math.ceil(hi / step) * step)
    if floor is not None and low >= floor:
        lo = max(lo, floor)
    if ceiling is not None and high <= ceiling:
        hi = min(hi, ceiling)
    return (lo, hi) if hi > lo else (lo, lo + 1.0)


def value_ticks(lo: float, hi: float, target: int = 4) -> list[float]:
    step = nice_step(hi - lo, target)
    first = math.ceil(lo / step) * step
    ticks = []
    value = first
    while value <= hi + step * 1e-9:
        ticks.append(round(value, 10))
        value += step
    return ticks


def time_step(span: float, target: int = 8) -> float:
    for step in TIME_STEPS:
        if span / step <= target:
            return float(step)
    return float(TIME_STEPS[-1])


def time_ticks(start: float, end: float, origin: float, target: int = 8) -> list[float]:
    """Instants for the time axis: round multiples of a step, counted from ``origin``."""
    step = time_step(end - start, target)
    first = origin + math.ceil((start - origin) / step) * step
    ticks = []
    t = first
    while t <= end + 1e-6:
        ticks.append(t)
        t += step
    return ticks


def clock(t: float, *, origin: float | None = None, seconds: bool = True) -> str:
    """A time label: ``+1:02:03`` from ``origin``, or UTC ``03:00:25``."""
    if origin is not None:
        delta = round(t - origin)
        sign = "-" if delta < 0 else "+"
        delta = abs(delta)
        h, rest = divmod(delta, 3600)
        m, s = divmod(rest, 60)
        return f"{sign}{h}:{m:02d}:{s:02d}" if seconds else f"{sign}{h}:{m:02d}"
    stamp = dt.datetime.fromtimestamp(t, dt.UTC)
    return stamp.strftime("%H:%M:%S" if seconds else "%H:%M")


def quantity(value: float, unit: str) -> str:
    """A value with its unit for people: ``97.3 %``, ``79,700 MiB``, ``355 W``."""
    if not math.isfinite(value):
        return "unknown"
    if unit == "MiB" or abs(value) >= 1000:
        text = f"{value:,.0f}"
    elif value == int(value):
        text = f"{value:.0f}"
    else:
        text = f"{value:.1f}"
    return f"{text} {unit}" if unit else text


# -- fills and shapes -------------------------------------------------------------------------


def patterns(prefix: str, processes: int) -> str:
    """The hatches of one figure: pending, firing, and one per process band (ids are
    prefixed: several figures share the page)."""
    parts = [
        f'<pattern id="{prefix}-pending" width="8" height="8" patternUnits="userSpaceOnUse"'
        ' patternTransform="rotate(45)"><rect width="8" height="8" fill="#fff3cd"/>'
        '<line x1="0" y1="0" x2="0" y2="8" stroke="#b8860b" stroke-width="1.2"/></pattern>',
        f'<pattern id="{prefix}-firing" width="6" height="6" patternUnits="userSpaceOnUse"'
        ' patternTransform="rotate(-45)"><rect width="6" height="6" fill="#f8d7da"/>'
        '<line x1="0" y1="0" x2="0" y2="6" stroke="#b02a37" stroke-width="1.6"/></pattern>',
    ]
    for k in range(processes):
        colour = PALETTE[k % len(PALETTE)]
        mark = _HATCHES[k % len(_HATCHES)]
        parts.append(
            f'<pattern id="{prefix}-proc{k}" width="8" height="8" patternUnits="userSpaceOnUse">'
            f'<rect width="8" height="8" fill="{colour}" fill-opacity="0.45"/>{mark}</pattern>'
        )
    return "<defs>" + "".join(parts) + "</defs>"


_INK = 'stroke="#222" stroke-opacity="0.55"'
_HATCHES = (
    "",
    f'<line x1="0" y1="8" x2="8" y2="0" {_INK} stroke-width="1"/>',
    '<circle cx="4" cy="4" r="1.2" fill="#222" fill-opacity="0.6"/>',
    f'<line x1="0" y1="4" x2="8" y2="4" {_INK} stroke-width="1"/>',
    f'<line x1="4" y1="0" x2="4" y2="8" {_INK} stroke-width="1"/>',
    f'<path d="M0 0L8 8M8 0L0 8" {_INK} stroke-width="0.8"/>',
)


def shape(kind: str, x: float, y: float) -> str:
    """The marker of a step kind at (x, y): a distinct shape per kind, so print tells them
    apart."""
    X, Y = num(x), num(y)
    r = 6.0

    def pts(*points: tuple[float, float]) -> str:
        return " ".join(f"{num(x + dx)},{num(y + dy)}" for dx, dy in points)

    if kind == "notify":
        return f'<circle cx="{X}" cy="{Y}" r="5.5"/>'
    if kind == "checkpoint":
        return f'<polygon points="{pts((0, -r), (r, 0), (0, r), (-r, 0))}"/>'
    if kind in ("suspend", "resume"):
        hollow = ' fill="#fff"' if kind == "resume" else ""
        return f'<rect x="{num(x - 5)}" y="{num(y - 5)}" width="10" height="10"{hollow}/>'
    if kind == "renice":
        return f'<polygon points="{pts((0, -r), (r, r * 0.8), (-r, r * 0.8))}"/>'
    if kind == "kill":
        return (
            f'<path d="M{num(x - 5)} {num(y - 5)}L{num(x + 5)} {num(y + 5)}M{num(x + 5)} '
            f'{num(y - 5)}L{num(x - 5)} {num(y + 5)}" stroke-width="3.2" fill="none"/>'
        )
    if kind == "power_cap":
        return f'<polygon points="{pts((0, r), (r, -r * 0.8), (-r, -r * 0.8))}"/>'
    if kind == "exec":
        return (
            f'<path d="M{X} {num(y - 6)}V{num(y + 6)}M{num(x - 6)} {Y}H{num(x + 6)}"'
            ' stroke-width="3.2" fill="none"/>'
        )
    if kind == "requeue":  # back into the queue: a triangle pointing back
        return f'<polygon points="{pts((-r, 0), (r, -r), (r, r))}"/>'
    if kind == "provision":
        arrow = pts((0, -7), (6, -1), (3, -1), (3, 6), (-3, 6), (-3, -1), (-6, -1))
        return f'<polygon points="{arrow}"/>'
    return f'<circle cx="{X}" cy="{Y}" r="4" fill="#fff"/>'


SHAPE_NAMES = {
    "notify": "circle",
    "checkpoint": "diamond",
    "suspend": "square",
    "resume": "hollow square",
    "renice": "triangle",
    "kill": "cross",
    "power_cap": "downward triangle",
    "exec": "plus",
    "provision": "arrow",
    "requeue": "leftward triangle",
}
