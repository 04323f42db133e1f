"""Step kind → executor module. The YAML key, the registry key and the module name agree."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from gpuwarden.actions.base import Context
from gpuwarden.model import Intent, Outcome, TargetResult, Undo

MODULES = {
    "notify": "notify",
    "checkpoint": "checkpoint",
    "suspend": "suspend",
    "resume": "resume",
    "renice": "renice",
    "kill": "kill",
    "requeue": "requeue",
    "power_cap": "power_cap",
    "exec": "exec_",
    "provision": "provision",
}
# What puts an Undo back, by its kind.
UNDO_MODULES = {
    "resume": "resume",
    "slurm_resume": "resume",
    "renice": "renice",
    "power_limit": "power_cap",
}


def executor(kind: str) -> Callable[[Intent, Context], Outcome]:
    module = importlib.import_module(f"gpuwarden.actions.{MODULES[kind]}")
    run: Callable[[Intent, Context], Outcome] = module.execute
    return run


def undoer(kind: str) -> Callable[[Undo, Context], TargetResult]:
    module = importlib.import_module(f"gpuwarden.actions.{UNDO_MODULES[kind]}")
    run: Callable[[Undo, Context], TargetResult] = module.undo
    return run
