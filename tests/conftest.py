"""Shared test configuration: the ``gpu`` marker runs only where NVML really initializes."""

from __future__ import annotations

import functools

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
