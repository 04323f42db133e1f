"""Errors users see, and the exit codes they map to.

Every error a person can fix is an ``InputError`` (a file, a position, what is wrong, what was
expected, a hint) or a ``SourceUnavailable`` (the telemetry source cannot start). The CLI turns
them into one or a few lines on stderr and a fixed exit code; never a traceback.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class ExitCode(enum.IntEnum):
    """Documented in README.md and docs/operations.md ("Exit codes"); tests/test_exit_codes.py
    compares those tables and the systemd unit with this enum."""

    OK = 0
    FAILURE = 1  # an unexpected failure: a bug, report it
    BAD_INPUT = 2  # bad command line, or a malformed scenario / CSV / config file
    SOURCE_UNAVAILABLE = 3  # no NVML library, no driver, no permission to read the GPUs
    UNSAFE_SETUP = 4  # `run` refused to start: see its self-check findings (gpuwarden doctor)
    LOCKED = 5  # `run` refused to start: another daemon holds the state directory's lock
    INTERRUPTED = 130  # stopped with Ctrl-C


# The codes that mean "the configuration is wrong": no restart can fix them, so the unit's
# RestartPreventExitStatus= lists exactly these (systemd/gpuwarden.service; a test compares
# them, and the exit-code tables of README.md and docs/operations.md, with this enum).
# LOCKED is not one of them: another daemon holds the state directory, which is no fault of the
# configuration; a restarted daemon is refused again until that one stops.
CONFIGURATION_WRONG: frozenset[ExitCode] = frozenset({ExitCode.BAD_INPUT, ExitCode.UNSAFE_SETUP})


def restarted_by_systemd(code: ExitCode) -> bool:
    """Whether the unit (``Restart=on-failure``) starts the daemon again after ``code``."""
    return code != ExitCode.OK and code not in CONFIGURATION_WRONG


@dataclass(frozen=True)
class Problem:
    """One thing wrong in one input file."""

    file: str
    line: int | None
    col: int | None
    message: str
    expected: str | None = None
    hint: str | None = None

    def render(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
            if self.col is not None:
                where += f":{self.col}"
        text = f"{where}: {self.message}"
        if self.expected:
            text += f" — expected {self.expected}"
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text


def in_file_order(problems: list[Problem]) -> list[Problem]:
    """Problems sorted as they stand in their file (those without a position first); the
    order of files, and of problems at one position, is kept."""
    files = list(dict.fromkeys(p.file for p in problems))
    return sorted(problems, key=lambda p: (files.index(p.file), p.line or 0, p.col or 0))


class GpuwardenError(Exception):
    exit_code: ExitCode = ExitCode.FAILURE

    def render(self) -> str:
        return str(self)


class InputError(GpuwardenError):
    """One or more problems in an input file; nothing from it was used."""

    exit_code = ExitCode.BAD_INPUT

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__(self.render())

    @classmethod
    def at(
        cls,
        file: str,
        line: int | None,
        col: int | None,
        message: str,
        expected: str | None = None,
        hint: str | None = None,
    ) -> InputError:
        return cls([Problem(file, line, col, message, expected, hint)])

    def render(self) -> str:
        return "\n".join(p.render() for p in self.problems)


class HintedError(GpuwardenError):
    """One line saying what is wrong, and optionally one saying what to do."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(self.render())

    def render(self) -> str:
        return self.message + (f"\n  hint: {self.hint}" if self.hint else "")


class UsageError(HintedError):
    """The command line asks for something that cannot be done (an unknown source scheme...)."""

    exit_code = ExitCode.BAD_INPUT


class SourceUnavailable(HintedError):
    """The telemetry source cannot be read at all (no NVML library, no driver, no permission)."""

    exit_code = ExitCode.SOURCE_UNAVAILABLE
