"""Rewrite the golden drill timelines after an intended change: ``make golden``.

Review the diff of tests/golden/ before committing it: it is the behaviour change.
"""

from __future__ import annotations

from tests.golden_pairs import PAIRS, golden_path, timeline


def main() -> int:
    for playbook in sorted(PAIRS):
        lines = timeline(playbook)
        golden_path(playbook).write_text("".join(line + "\n" for line in lines))
        print(f"{golden_path(playbook)}: {len(lines)} records")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
