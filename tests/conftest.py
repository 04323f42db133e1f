"""Shared test configuration: the ``gpu`` marker runs only where NVML really initializes, and
real unprivileged users (``system_users``) for the tests that play an attacker."""

from __future__ import annotations

import functools
from collections.abc import Iterator

import pytest

from tests.system_users import SystemUser, created_users, unavailable


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
def system_users() -> Iterator[dict[str, SystemUser]]:
    """Two real unprivileged users for the whole session: ``mallory`` (who tries to promote
    her own jobs) and ``bob`` (another user). Removed at the end; skipped without root."""
    why = unavailable()
    if why is not None:
        pytest.skip(why)
    with created_users("mallory", "bob") as users:
        yield users
