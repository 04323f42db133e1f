"""The live kernel log: /dev/kmsg records (through a FIFO carrying the same records, so no test
writes into the machine's real kernel log), journalctl's JSON from a real child process, and
the daemon acting on an XID within the tick that reads it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwarden import config as config_mod
from gpuwarden.clock import SimClock
from gpuwarden.errors import SourceUnavailable
from gpuwarden.journal.journal import Journal
from gpuwarden.model import EventKind, Intent, RuleChange
from gpuwarden.playbook import loader
from gpuwarden.runtime import Runtime
from gpuwarden.sources.kernel_events import WithEvents
from gpuwarden.sources.kernel_log import Report
from gpuwarden.sources.kmsg import JournalFeed, KmsgFeed
from gpuwarden.sources.scenario import ScenarioSource

ROOT = Path(__file__).resolve().parent.parent
XID79 = (
    "NVRM: Xid (PCI:0000:68:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
)


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[tuple[Path, KmsgFeed, int]]:
    """A FIFO, the feed reading it, and a descriptor to write records into it."""
    path = tmp_path / "kmsg"
    os.mkfifo(path)
    feed = KmsgFeed(str(path))
    writer = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    try:
        yield path, feed, writer
    finally:
        os.close(writer)
        feed.close()


def test_kmsg_records_are_read_when_a_snapshot_asks(fifo):
    _path, feed, writer = fifo
    assert feed.take(100.0) == []
    os.write(
        writer,
        (
            f"3,1201,7207512349,-;{XID79}\n"
            " SUBSYSTEM=pci\n"
            " DEVICE=+pci:0000:68:00.0\n"
            "6,1202,7207512360,-;NVRM: GPU 0000:68:00.0: GPU has fallen off the bus.\n"
            f"12,1203,7207512361,-;{XID79}\n"  # facility user: a program wrote it, not the kernel
            "4,1204,7207600000,c;NVRM: Xid (PCI:0000:68:00): 4"  # the rest is not written yet
        ).encode(),
    )
    got = feed.take(200.0)
    assert got == [
        (
            200.0,
            Report(EventKind.XID, "0000:68:00", 79, None, None, "GPU has fallen off the bus."),
        ),
        (200.0, Report(EventKind.GPU_LOST, "0000:68:00.0", text="GPU has fallen off the bus")),
    ]
    os.write(writer, b"8, pid=5, name=cuda_app, oops\n")
    assert feed.take(300.0) == [
        (300.0, Report(EventKind.XID, "0000:68:00", 48, 5, "cuda_app", "oops")),
    ]
    assert feed.take(400.0) == []


def test_a_record_that_does_not_read_is_skipped_with_a_warning(fifo, caplog):
    _path, feed, writer = fifo
    os.write(writer, b"3,1,2,-;NVRM: Xid (PCI:0000:68:00): who knows\n")
    assert feed.take(1.0) == []
    assert "skipped a driver line: an XID report that does not read" in caplog.text


def test_a_kernel_log_that_cannot_be_opened_says_what_to_do(tmp_path):
    with pytest.raises(SourceUnavailable) as caught:
        KmsgFeed(str(tmp_path / "absent"))
    rendered = caught.value.render()
    assert f"cannot read the kernel log {tmp_path / 'absent'}" in rendered
    assert "--events kmsg:journal" in rendered


JOURNAL_SCRIPT = """
import json, sys, time
for transport, message in (("syslog", {xid!r}), ("kernel", {xid!r}), ("kernel", "NVRM: hi")):
    print(json.dumps({{"__REALTIME_TIMESTAMP": "1772546407512349", "_TRANSPORT": transport,
                       "MESSAGE": message}}), flush=True)
time.sleep(60)
"""


def test_the_journal_feed_reads_kernel_entries_from_journalctl_json():
    argv = (sys.executable, "-c", JOURNAL_SCRIPT.format(xid=XID79))
    feed = JournalFeed(argv)
    try:
        deadline = time.monotonic() + 30
        got = feed.take(500.0)
        while not got and time.monotonic() < deadline:
            time.sleep(0.02)
            got = feed.take(500.0)
        assert got == [
            (
                500.0,
                Report(EventKind.XID, "0000:68:00", 79, None, None, "GPU has fallen off the bus."),
            )
        ]
        assert feed.take(501.0) == []
    finally:
        feed.close()
    assert feed._process.poll() is not None  # the child is gone with the feed


def test_a_missing_journalctl_is_a_clear_error():
    with pytest.raises(SourceUnavailable, match="no-such-journalctl is not installed"):
        JournalFeed(("no-such-journalctl", "-k"))


# --- in the daemon: the tick that reads the record acts on it -------------------------------------

SCENARIO = """\
version: 1
name: eight-gpus-quiet
host: gpu-node-09
gpus:
{gpus}
timeline:
  - at: 0s
  - at: {end}
    end: true
"""
PLAYBOOK = """\
rules:
  - name: gpu-fell-off-the-bus
    for_each: event
    when: event.kind == "xid" and event.xid == 79
    severity: critical
    steps:
      - notify: oncall
"""


def eight_gpus(tmp_path: Path, end: str = "10m") -> Path:
    gpus = "\n".join(
        f"  - {{index: {i}, memory_total_mib: 81920, pci_bus_id: '00000000:{bus:02X}:00.0'}}"
        for i, bus in enumerate(range(0x18, 0x98, 0x10))
    )
    path = tmp_path / "eight.yaml"
    path.write_text(SCENARIO.format(gpus=gpus, end=end))
    return path


def test_an_xid_in_the_kernel_log_reaches_an_event_rule_in_the_same_tick(tmp_path, fifo):
    _path, feed, writer = fifo
    cfg = config_mod.load(ROOT / "config" / "demo.yaml")
    playbook = tmp_path / "xid.yaml"
    playbook.write_text(PLAYBOOK)
    clock = SimClock(start=1_800_000_000.0)
    source = ScenarioSource.open(eight_gpus(tmp_path), spawn=False, start_time=clock.now())
    runtime = Runtime(
        cfg,
        WithEvents(source, [feed]),
        loader.load([playbook], cfg),
        Journal(tmp_path / "journal.db"),
        clock=clock,
        dry_run=True,
        host="gpu-node-09",
    )
    try:
        quiet = runtime.tick()
        assert [r for r in quiet.records if isinstance(r, RuleChange)] == []
        clock.advance(2.0)
        os.write(writer, f"3,1201,7207512349,-;{XID79}\n".encode())  # GPU at 68 is GPU 5
        result = runtime.tick()
        fired = [r for r in result.records if isinstance(r, RuleChange) and r.kind == "firing"]
        assert [(r.rule, r.where) for r in fired] == [("gpu-fell-off-the-bus", "GPU 5")]
        steps = [r for r in result.records if isinstance(r, Intent)]
        assert [(i.kind, i.gpu) for i in steps] == [("notify", 5)]
    finally:
        runtime.shutdown()


def test_gpuwarden_run_with_events_from_a_fifo_records_the_incident(tmp_path):
    fifo_path = tmp_path / "kmsg"
    os.mkfifo(fifo_path)
    playbook = tmp_path / "xid.yaml"
    playbook.write_text(PLAYBOOK)
    state = tmp_path / "state"
    daemon = subprocess.Popen(
        [sys.executable, "-m", "gpuwarden", "run", "--config", "config/demo.yaml",
         "--source", f"scenario:{eight_gpus(tmp_path, '30s')}", "--events", f"kmsg:{fifo_path}",
         "--playbooks", str(playbook), "--state-dir", str(state), "--dry-run", "--speed", "60"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        writer = os.open(fifo_path, os.O_WRONLY)  # returns once the daemon reads the FIFO
        os.write(writer, f"3,1201,7207512349,-;{XID79}\n".encode())
        os.close(writer)
        _out, err = daemon.communicate(timeout=120)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    assert daemon.returncode == 0, err
    assert "rule gpu-fell-off-the-bus fired for GPU 5" in err
    listing = subprocess.run(
        [sys.executable, "-m", "gpuwarden", "incidents", "--state-dir", str(state), "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    (incident,) = json.loads(listing.stdout)["incidents"]
    assert (incident["rule"], incident["where"]) == ("gpu-fell-off-the-bus", "GPU 5")
