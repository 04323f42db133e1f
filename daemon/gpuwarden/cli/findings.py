"""A self-check's result: ``Finding``, shared by ``selfcheck`` and ``hardening``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["ok", "warning", "error"]


@dataclass(frozen=True)
class Finding:
    check: str
    ok: bool
    severity: Severity
    detail: str
    fix: str | None = None  # always given when not ok


def ok(check: str, detail: str) -> Finding:
    return Finding(check, True, "ok", detail)


def warn(check: str, detail: str, fix: str) -> Finding:
    return Finding(check, False, "warning", detail, fix)


def fail(check: str, detail: str, fix: str) -> Finding:
    return Finding(check, False, "error", detail, fix)
