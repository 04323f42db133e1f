"""Benchmarks, run by hand or with ``make bench``; results go to docs/performance.md.

    python bench/run.py                 # everything (telemetry, then engine and drill)
    python bench/run.py telemetry       # one group: telemetry | engine | drill | daemon | report
    python bench/run.py peer            # ansible-rulebook beside the drill (PyPI, Java 17+)

Each benchmark repeats its operation, reports the median and the spread of several rounds,
and never asserts a time: machines are noisy, so compare medians and ratios, and always with
the machine and the date they were measured on (the header this prints).

This module only chooses the groups; the timing helpers every group shares are in
``harness.py``.
"""

from __future__ import annotations

import sys
import time

from harness import banner, load

DEFAULT = ("telemetry", "engine", "drill", "daemon", "report")
GROUPS = (*DEFAULT, "peer")  # peer installs ansible-rulebook: only when named


def main(argv: list[str]) -> int:
    wanted = argv or list(DEFAULT)
    unknown = [g for g in wanted if g not in GROUPS]
    if unknown:
        known = ", ".join(GROUPS)
        print(f"unknown benchmark group(s): {', '.join(unknown)}; known: {known}", file=sys.stderr)
        return 2
    print(banner(), flush=True)
    began = time.perf_counter()
    if "telemetry" in wanted:
        import telemetry

        telemetry.main()
    if "engine" in wanted:
        import engine

        engine.main()
    if "drill" in wanted:
        import throughput

        throughput.main()
    if "daemon" in wanted:
        import daemon

        daemon.main()
    if "report" in wanted:
        import report

        report.main()
    if "peer" in wanted:
        import peer

        peer.main()
    print(f"\nall benchmarks: {time.perf_counter() - began:.0f} s wall · {load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
