"""``gpuwarden`` on fake GPUs that follow a breach schedule: the daemon side of bench/alerting.py.

    python bench/fake_gpus.py SCHEDULE.json run --config gpuwarden.yaml

Installs the fake NVML library of ``tests/fake_nvml.py`` (pynvml's real wrappers over fake C
functions: the seam the tests use) with the schedule's GPUs, then runs the gpuwarden command
line in this process. GPU 0's memory is a function of the wall clock: ``low_pct`` outside the
schedule's episodes, ``high_pct`` inside ``[start, end)``; its one compute process is the real
victim process of the current episode (from the end of the one before to its own end), so a
kill step signals a real process. The Prometheus exporter in bench/alerting.py computes the
same function of the same clock.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, ClassVar

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "daemon"), str(ROOT)]

from tests.fake_nvml import FakeGpu, FakeNvml, FakeProcess, installed  # noqa: E402

MIB = 1024 * 1024


def memory_pct(schedule: dict[str, Any], at: float) -> float:
    """GPU 0's memory use at wall time ``at``, in percent (the breach schedule)."""
    for episode in schedule["episodes"]:
        if episode["start"] <= at < episode["end"]:
            return float(schedule["high_pct"])
    return float(schedule["low_pct"])


def victim_at(schedule: dict[str, Any], at: float) -> int | None:
    before = float("-inf")
    for episode in schedule["episodes"]:
        if before <= at < episode["end"]:
            return int(episode["pid"])
        before = episode["end"]
    return None


class ScheduledGpu(FakeGpu):
    """A fake GPU whose memory and process follow the schedule (set in ``schedule``)."""

    schedule: ClassVar[dict[str, Any]] = {}

    @property
    def used_mib(self) -> int:
        return int(self.total_mib * memory_pct(self.schedule, time.time()) / 100)

    @used_mib.setter
    def used_mib(self, value: int) -> None:
        pass  # the schedule decides

    @property
    def processes(self) -> list[FakeProcess]:
        pid = victim_at(self.schedule, time.time())
        if pid is None:
            return []
        return [FakeProcess(pid=pid, used_bytes=self.used_mib * MIB)]

    @processes.setter
    def processes(self, value: list[FakeProcess]) -> None:
        pass


def main(argv: list[str]) -> int:
    schedule = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    ScheduledGpu.schedule = schedule
    total = int(schedule["total_mib"])
    low = int(total * float(schedule["low_pct"]) / 100)
    gpus: list[FakeGpu] = [ScheduledGpu(index=0, total_mib=total)]
    gpus += [FakeGpu(index=i, total_mib=total, used_mib=low) for i in range(1, schedule["gpus"])]
    fake = FakeNvml(gpus)
    fake.max_wait_s = 1.0  # an event wait times out after a second, as the driver's does
    from gpuwarden.cli.main import main as gpuwarden

    with installed(fake):
        return gpuwarden(argv[1:])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
