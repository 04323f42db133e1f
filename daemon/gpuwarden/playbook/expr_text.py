"""Expression text before parsing: duration literals, line breaks, and the way back to columns.

People write ``avg(gpu.power_w, 5m)``; Python cannot parse ``5m``. ``prepare`` rewrites every
duration literal outside string literals into its seconds (``300.0``) and line breaks outside
strings into spaces (YAML block scalars), and keeps a map so that an error found in the
rewritten text points at the column of the text the person wrote.
"""

from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass

from gpuwarden.units import parse_duration

MAX_LENGTH = 4000

# One or more number+unit parts (``1h30m``, ``500ms``, ``2.5h``), not glued to a name or number.
_DURATION = re.compile(r"(?<![\w.])(?:\d+(?:\.\d+)?(?:ms|s|m|h|d))+(?![\w.])")
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


class ExprError(Exception):
    """An expression that cannot be compiled. ``offset``: 0-based character offset into the
    original expression text; ``hint``: what to write instead, where that is known."""

    def __init__(self, message: str, offset: int, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.offset = offset
        self.hint = hint

    def __str__(self) -> str:
        return self.message if self.hint is None else f"{self.message} (hint: {self.hint})"


@dataclass(frozen=True)
class Prepared:
    """The rewritten text and how its offsets map back to the original."""

    original: str
    text: str
    # Each replaced span: (start in text, end in text, start in original, end in original).
    spans: tuple[tuple[int, int, int, int], ...]

    def to_original(self, offset: int) -> int:
        """The original offset of character ``offset`` of the rewritten text."""
        starts = [s[0] for s in self.spans]
        i = bisect.bisect_right(starts, offset) - 1
        if i < 0:
            result = offset
        else:
            _, end, orig_start, orig_end = self.spans[i]
            result = orig_start if offset < end else orig_end + (offset - end)
        return max(0, min(result, len(self.original)))

    def char(self, lineno: int | None, col: int | None, *, col_in_bytes: bool = True) -> int:
        """The offset in the rewritten text of a (1-based line, 0-based column) position;
        ``ast`` columns count UTF-8 bytes, ``SyntaxError`` columns count characters."""
        lineno = lineno or 1
        col = max(col or 0, 0)
        starts = [0] + [m.end() for m in _LINE_BREAK.finditer(self.text)]
        line_start = starts[min(max(lineno, 1), len(starts)) - 1]
        if col_in_bytes:
            line = self.text[line_start:]
            col = len(line.encode("utf-8")[:col].decode("utf-8", errors="ignore"))
        return min(line_start + col, len(self.text))

    def at(self, lineno: int | None, col: int | None, *, col_in_bytes: bool = True) -> int:
        """The original offset of a (line, column) position in the rewritten text."""
        return self.to_original(self.char(lineno, col, col_in_bytes=col_in_bytes))


def prepare(text: str) -> Prepared:
    """Rewrite durations and line breaks outside string literals; raises ``ExprError`` for a
    text too long to be an expression or a duration too large to be one."""
    if len(text) > MAX_LENGTH:
        raise ExprError(
            f"expression too long ({len(text)} characters; at most {MAX_LENGTH})", MAX_LENGTH
        )
    out: list[str] = []
    spans: list[tuple[int, int, int, int]] = []
    written = 0  # length of the rewritten text so far
    for start, end, quoted in _segments(text):
        chunk = text[start:end]
        if quoted:
            out.append(chunk)
            written += len(chunk)
            continue
        pos = start
        for match in _DURATION.finditer(chunk):
            before = _flatten(text[pos : start + match.start()])
            out.append(before)
            written += len(before)
            try:
                seconds = parse_duration(match.group())
            except ValueError as exc:  # longer than MAX_DURATION
                raise ExprError(str(exc), start + match.start()) from None
            if not math.isfinite(seconds):
                raise ExprError(f"duration too large: {match.group()}", start + match.start())
            literal = repr(seconds)
            spans.append(
                (written, written + len(literal), start + match.start(), start + match.end())
            )
            out.append(literal)
            written += len(literal)
            pos = start + match.end()
        rest = _flatten(text[pos:end])
        out.append(rest)
        written += len(rest)
    return Prepared(text, "".join(out), tuple(spans))


def _flatten(chunk: str) -> str:
    """Line breaks outside strings become spaces (same length, so offsets do not move)."""
    return chunk.replace("\r", " ").replace("\n", " ")


def _segments(text: str) -> list[tuple[int, int, bool]]:
    """Split ``text`` into (start, end, is_string_literal) pieces. Handles ' and " strings,
    triple quotes and backslash escapes. An unterminated string, or one with a raw line break,
    is kept as written: the parser reports it."""
    pieces: list[tuple[int, int, bool]] = []
    i = plain_start = 0
    n = len(text)
    while i < n:
        ch = text[i]
        if ch not in "'\"":
            i += 1
            continue
        if plain_start < i:
            pieces.append((plain_start, i, False))
        quote = ch * 3 if text.startswith(ch * 3, i) else ch
        j = i + len(quote)
        while j < n and not text.startswith(quote, j):
            j += 2 if text[j] == "\\" else 1
        j = min(n, j + len(quote)) if j < n and text.startswith(quote, j) else min(j, n)
        pieces.append((i, j, True))
        i = plain_start = j
    if plain_start < n:
        pieces.append((plain_start, n, False))
    return pieces
