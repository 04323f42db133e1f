"""The text of a log file as people keep it: written on Linux or on Windows.

nvidia-smi and the kernel write UTF-8. A log captured on Windows differs only in how it was
stored: PowerShell 5's ``>`` writes UTF-16 LE with a byte order mark and CRLF line ends,
``Out-File -Encoding utf8`` UTF-8 with a byte order mark, ``cmd.exe`` plain bytes with CRLF.
``decode`` reads all of these; line ends are left to the reader (which drops the ``\\r``).
"""

from __future__ import annotations

import codecs
from pathlib import Path

from gpuwarden.errors import InputError

# Longest first: the UTF-32 LE mark begins with the UTF-16 LE one.
_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)
_CONVERT = (
    "save it as UTF-8 (for example: iconv -f WINDOWS-1252 -t UTF-8 FILE > FILE.utf8), "
    "or as UTF-16 with a byte order mark"
)


def encoding_of(data: bytes) -> tuple[str, int]:
    """The encoding of ``data`` and the length of its byte order mark. Without a mark, text
    whose every other byte is NUL is UTF-16 (of that byte order); anything else is UTF-8."""
    for bom, name in _BOMS:
        if data.startswith(bom):
            return name, len(bom)
    head = data[:256]
    if len(head) >= 4 and len(head) % 2 == 0:
        even, odd = head[0::2], head[1::2]
        if odd.count(0) == len(odd) and even.count(0) == 0:
            return "utf-16-le", 0
        if even.count(0) == len(even) and odd.count(0) == 0:
            return "utf-16-be", 0
    return "utf-8", 0


def decode(data: bytes, file: str, expected: str) -> str:
    """``data`` as text; text that is not what it claims to be is an ``InputError`` at the
    line and column of the first byte that cannot be read."""
    encoding, skip = encoding_of(data)
    body = data[skip:]
    try:
        return body.decode(encoding)
    except UnicodeDecodeError as exc:
        before = body[: exc.start].decode(encoding, errors="replace")
        line = before.count("\n") + 1
        col = len(before) - (before.rfind("\n") + 1) + 1
        what = "this is not UTF-8 text" if encoding == "utf-8" else f"this is not {encoding} text"
        raise InputError.at(file, line, col, what, expected, _CONVERT) from exc


def read(path: str | Path, expected: str) -> str:
    """The text of the file at ``path`` (see ``decode``); a file that cannot be read is an
    ``InputError`` naming it."""
    file = str(path)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise InputError.at(file, None, None, f"cannot read it ({exc.strerror})", expected) from exc
    return decode(data, file, expected)
