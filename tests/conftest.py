"""Shared test configuration: the ``gpu`` marker runs only where NVML really initializes."""

from __future__ import annotations

import functools
from collections.abc import Iterator

import pytest


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
def job_owner() -> Iterator[str]:
    """A real user (not root) to own spawned jobs (``run_as:`` in a scenario)."""
    from tests.real_users import CAN_CREATE, temporary_user

    if not CAN_CREATE:
        pytest.skip("needs root and useradd to create a user")
    with temporary_user() as name:
        yield name
