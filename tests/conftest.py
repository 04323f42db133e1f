"""Shared test configuration: the ``gpu`` marker runs only where NVML really initializes."""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Iterator

import pytest

from tests.local_users import LocalUsers


@functools.cache
def nvml_works() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return False
    pynvml.nvmlShutdown()
    return True


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any("gpu" in item.keywords for item in items) and not nvml_works():
        skip = pytest.mark.skip(reason="needs a working NVML (NVIDIA driver and GPU)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def local_users() -> Iterator[LocalUsers]:
    """Two real users for the whole session, a job owner and an attacker, made with useradd
    and removed at the end (with whatever processes the tests left running as them)."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("needs root and useradd to create the users")
    users = LocalUsers.create(suffix=str(os.getpid() % 1_000_000))
    try:
        yield users
    finally:
        users.remove()
