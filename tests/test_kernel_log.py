"""Kernel logs as incident archives keep them: NVRM XID lines of drivers 470 to 580, in every
time-stamp form, replayed beside an nvidia-smi log with exact events per GPU and time."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from gpuwarden.errors import InputError, UsageError
from gpuwarden.model import EventKind
from gpuwarden.sources import kernel_log
from gpuwarden.sources.kernel_events import ReplayFeed, WithEvents
from gpuwarden.sources.kernel_log import Report, Uuid, pci_key, read_line, read_message
from gpuwarden.sources.smi_csv import SmiCsvSource
from gpuwarden.xid import XIDS, describe_xid, xid_action

FIXTURES = Path(__file__).resolve().parent / "fixtures"
KERNEL = FIXTURES / "kernel"
BUS_LOG = FIXTURES / "smi" / "bus-id-only-nvidia-docs-query.csv"
BOOT = datetime(2026, 3, 3, 12, 0, tzinfo=UTC).timestamp()


def epoch(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def us(seconds: float) -> int:
    """Whole microseconds: times compared exactly, to the precision logs keep."""
    return round(seconds * 1e6)


# What happened on gpu-node-21 (GPUs by bus id: 18 → 0, 3B → 1, 86 → 2, AF → 3), to the
# microsecond where the log keeps microseconds.
PRECISE = [
    ("2026-03-03T14:00:07.512349", EventKind.XID, 1, 79),
    ("2026-03-03T14:00:07.512351", EventKind.GPU_LOST, 1, None),
    ("2026-03-03T14:00:12.104220", EventKind.XID, 2, 48),
    ("2026-03-03T14:00:13.402117", EventKind.XID, 3, 13),
    ("2026-03-03T14:00:13.402121", EventKind.XID, 3, 13),
    ("2026-03-03T14:00:13.409870", EventKind.XID, 3, 31),
]
SECONDS = [
    ("2026-03-03T14:00:07", EventKind.XID, 1, 79),
    ("2026-03-03T14:00:07", EventKind.GPU_LOST, 1, None),
    ("2026-03-03T14:00:12", EventKind.XID, 2, 48),
    ("2026-03-03T14:00:13", EventKind.XID, 3, 13),
    ("2026-03-03T14:00:13", EventKind.XID, 3, 13),
    ("2026-03-03T14:00:13", EventKind.XID, 3, 31),
]
WITHOUT_SECOND_13 = [e for i, e in enumerate(SECONDS) if i != 4]
Expected = list[tuple[str, EventKind, int, int | None]]
LOGS: dict[str, tuple[dict[str, Any], Expected]] = {
    # file, options, expected events
    "dmesg-driver-470.txt": ({"boot_time": BOOT}, PRECISE),
    "dmesg-T-driver-535.txt": ({}, SECONDS),
    "journalctl-k-driver-550.txt": ({}, WITHOUT_SECOND_13),
    "journalctl-k-json-driver-570.jsonl": ({}, [e for i, e in enumerate(PRECISE) if i != 4]),
    "kern-log-without-pid.txt": ({}, WITHOUT_SECOND_13),
    "rsyslog-rfc3339-driver-580.txt": ({}, [e for i, e in enumerate(PRECISE) if i != 4]),
}


def replay(name: str, **options: Any) -> tuple[SmiCsvSource, WithEvents]:
    source = SmiCsvSource(BUS_LOG)
    feed = ReplayFeed(KERNEL / name, **options)
    return source, WithEvents(source, [feed])


Seen = list[tuple[int, EventKind, int | None, int | None]]


def every_event(source: SmiCsvSource, wrapped: WithEvents) -> Seen:
    """The events of one snapshot per second over the whole log, in order; times in µs."""
    seen: Seen = []
    for second in range(int(source.duration) + 2):
        snap = wrapped.snapshot(source.start_time + second)
        seen.extend((us(e.time), e.kind, e.gpu, e.xid) for e in snap.events)
    return seen


@pytest.mark.parametrize("name", sorted(LOGS))
def test_each_kernel_log_gives_the_same_events_per_gpu_and_time(name):
    options, expected = LOGS[name]
    source, wrapped = replay(name, **options)
    got = every_event(source, wrapped)
    # the nvidia-smi log itself sees GPU 1 turn lost in its third sample (14:00:10.241)
    from_csv = (us(source.start_time + 11), EventKind.GPU_LOST, 1, None)
    assert from_csv in got
    got.remove(from_csv)
    assert got == [(us(epoch(t)), k, g, x) for t, k, g, x in expected]


def test_event_details_name_the_driver_words_the_bus_and_the_process():
    source, wrapped = replay("dmesg-T-driver-535.txt")
    snap = wrapped.snapshot(source.start_time + 20)
    details = [(e.xid, e.detail) for e in snap.events if e.kind is EventKind.XID]
    assert details == [
        (79, "GPU has fallen off the bus. [kernel: PCI:0000:3b:00]"),
        (
            48,
            "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer "
            "at partition 6, subpartition 0. [kernel: PCI:0000:86:00]",
        ),
        (
            13,
            "Graphics SM Warp Exception on (GPC 1, TPC 0, SM 0): Out Of Range Address "
            "[kernel: PCI:0000:af:00, pid 28145 (python3)]",
        ),
        (
            13,
            "Graphics Exception: ESR 0x50c648=0x102000e 0x50c650=0x20 0x50c644=0xd3eff2 "
            "0x50c64c=0x17f [kernel: PCI:0000:af:00, pid 28145 (python3)]",
        ),
        (
            31,
            "Ch 00000010, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ "
            "0x7f3a_5c000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ "
            "[kernel: PCI:0000:af:00, pid 28145 (python3)]",
        ),
    ]
    lost = [e for e in snap.events if e.kind is EventKind.GPU_LOST]
    assert [(e.gpu, e.detail) for e in lost] == [
        (1, "GPU has fallen off the bus [kernel: PCI:0000:3b:00.0]")
    ]


def test_local_times_are_read_in_the_zone_given(tmp_path):
    berlin = tmp_path / "dmesg-T-berlin.txt"  # the same log, written on a machine in Berlin
    text = (KERNEL / "dmesg-T-driver-535.txt").read_text()
    berlin.write_text(text.replace("Mar  3 14:00:", "Mar  3 15:00:"))
    feed = ReplayFeed(berlin, tz="Europe/Berlin")  # CET, UTC+1, in March before the 29th
    assert [us(t) for t in feed.times] == [
        us(epoch(s)) for s in [SECONDS[0][0], *[t for t, *_ in SECONDS]]
    ]


def test_a_snapshot_reports_each_event_once_and_everything_due_at_its_first_look():
    source, wrapped = replay("journalctl-k-json-driver-570.jsonl")
    first = wrapped.snapshot(source.start_time + 12.5)  # a first look, 12.5 s in
    assert [(e.kind, e.gpu, e.xid) for e in first.events] == [
        (EventKind.XID, 1, 79),
        (EventKind.GPU_LOST, 1, None),  # the log's own says nothing: it saw no change yet
        (EventKind.XID, 2, 48),
    ]
    again = wrapped.snapshot(source.start_time + 12.6)
    assert again.events == ()


def test_events_before_the_recording_are_left_out():
    # the plain dmesg counted from the replay's start: its lines from boot to 7207 s are
    # all after the start, but a boot two hours after 14:00 puts them outside the log
    source, wrapped = replay("dmesg-driver-470.txt", boot_time=BOOT - 7200)
    assert every_event(source, wrapped) == [
        (us(source.start_time + 11), EventKind.GPU_LOST, 1, None)
    ]


def test_replaying_in_real_time_moves_the_events_with_the_recording():
    source, wrapped = replay("rsyslog-rfc3339-driver-580.txt")
    wrapped.start_time = 2_000_000_000.0  # status --watch: the log plays from now
    assert source.start_time == 2_000_000_000.0
    snap = wrapped.snapshot(2_000_000_000.0 + 8)
    shift = 2_000_000_000.0 - epoch("2026-03-03T14:00:00.211")
    assert [(us(e.time), e.xid) for e in snap.events if e.kind is EventKind.XID] == [
        (us(epoch("2026-03-03T14:00:07.512349") + shift), 79)
    ]


def test_a_plain_dmesg_without_a_boot_time_counts_from_the_replay_start():
    feed = ReplayFeed(KERNEL / "dmesg-driver-470.txt")
    feed.bind(1_000.0)
    assert feed.times[0] == pytest.approx(1_000.0 + 7207.512345)


def test_a_bus_id_no_gpu_has_keeps_gpu_empty_and_says_so(tmp_path):
    log = tmp_path / "other.txt"
    log.write_text("[ 3.000000] NVRM: Xid (PCI:0000:c1:00): 94, pid=77, name=a.out, Contained\n")
    source = SmiCsvSource(BUS_LOG)
    wrapped = WithEvents(source, [ReplayFeed(log)])
    (event,) = wrapped.snapshot(source.start_time + 4).events
    assert (event.gpu, event.xid) == (None, 94)
    assert event.detail == (
        "Contained [kernel: PCI:0000:c1:00, pid 77 (a.out)] (no GPU of this source has that bus id)"
    )


def test_the_uuid_line_maps_a_bus_id_the_source_does_not_report(tmp_path):
    csv = tmp_path / "uuids.csv"
    csv.write_text(
        "timestamp, index, uuid\n"
        "2026/03/03 14:00:00.211, 0, GPU-00000000-0000-0000-0000-000000000000\n"
        "2026/03/03 14:00:00.215, 1, GPU-1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901\n"
    )
    source = SmiCsvSource(csv)
    wrapped = WithEvents(source, [ReplayFeed(KERNEL / "rsyslog-rfc3339-driver-580.txt")])
    snap = wrapped.snapshot(source.start_time + 8)
    assert [(e.kind, e.gpu) for e in snap.events] == [
        (EventKind.XID, 1),
        (EventKind.GPU_LOST, 1),
    ]


# --- one line at a time ------------------------------------------------------------------------

MESSAGE = (
    "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
)


@pytest.mark.parametrize(
    ("line", "kind", "seconds"),
    [
        (f"[ 7207.512349] {MESSAGE}", "boot", 7207.512349),
        (f"<3>[ 7207.512349] {MESSAGE}", "boot", 7207.512349),  # dmesg -r
        (f"3,1234,7207512349,-;{MESSAGE}", "boot", 7207.512349),  # /dev/kmsg
        (
            f"2026-03-03T14:00:07,512349+00:00 {MESSAGE}",
            "epoch",
            epoch("2026-03-03T14:00:07.512349"),
        ),
        (
            f"2026-03-03T15:00:07+0100 gpu-node-21 kernel: {MESSAGE}",
            "epoch",
            epoch("2026-03-03T14:00:07"),
        ),
        (f"1772546407.512349 gpu-node-21 kernel: {MESSAGE}", "epoch", 1772546407.512349),
    ],
)
def test_time_stamp_forms(line, kind, seconds):
    read = read_line(line)
    assert read is not None
    stamp, message = read
    assert (stamp.kind, us(stamp.seconds)) == (kind, us(seconds))
    assert message == MESSAGE


def test_local_time_forms_keep_their_wall_clock():
    read = read_line(f"Mar 03 14:00:07.512349 gpu-node-21 kernel: {MESSAGE}")  # short-precise
    assert read is not None
    assert (read[0].kind, read[0].local) == ("month-day", datetime(2000, 3, 3, 14, 0, 7, 512349))
    read = read_line(f"[Tue Mar  3 14:00:07 2026] {MESSAGE}")
    assert read is not None
    assert (read[0].kind, read[0].local) == ("local", datetime(2026, 3, 3, 14, 0, 7))


@pytest.mark.parametrize(
    "line",
    [
        f"14,1234,7207512349,-;{MESSAGE}",  # facility user: written to /dev/kmsg by a program
        f"<14>[ 7207.512349] {MESSAGE}",
        f"Mar 03 14:00:07 gpu-node-21 logger: {MESSAGE}",
        json.dumps(
            {"__REALTIME_TIMESTAMP": "1772546407512349", "_TRANSPORT": "stdout", "MESSAGE": MESSAGE}
        ),
        '[ 7196.004117] audit: type=1400 apparmor="DENIED" name="/tmp/' + MESSAGE + '"',
        f"[ 7207.512349] nvidia-modeset: {MESSAGE}",
    ],
)
def test_text_a_user_controls_never_passes_for_a_driver_report(line):
    read = read_line(line)
    assert read is None or read_message(read[1]) is None


def test_the_new_year_in_a_log_without_years():
    read = read_line(f"Dec 31 23:59:59 gpu-node-21 kernel: {MESSAGE}")
    assert read is not None
    reference = epoch("2027-01-01T00:00:30")
    resolved = kernel_log.resolve(read[0], zone=ZoneInfo("UTC"), boot=0.0, reference=reference)
    assert resolved == epoch("2026-12-31T23:59:59")


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (
            "NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.",
            Report(EventKind.XID, "0000:3b:00", 79, None, None, "GPU has fallen off the bus."),
        ),
        (
            "NVRM: Xid (0000:3b:00): 79, GPU has fallen off the bus.",  # very old: no PCI:
            Report(EventKind.XID, "0000:3b:00", 79, None, None, "GPU has fallen off the bus."),
        ),
        (
            "NVRM: Xid (PCI:0000:3b:00): 63, pid=1201, name=train, Row Remapper: marked",
            Report(EventKind.XID, "0000:3b:00", 63, 1201, "train", "Row Remapper: marked"),
        ),
        (
            "NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to "
            "0x1 (GPU Reset Required)",
            Report(
                EventKind.XID,
                "0000:3b:00",
                154,
                None,
                None,
                "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
            ),
        ),
        (
            "NVRM: GPU at 0000:3b:00.0 has fallen off the bus.",
            Report(EventKind.GPU_LOST, "0000:3b:00.0", text="GPU has fallen off the bus"),
        ),
        (
            "NVRM: GPU at PCI:0000:3b:00: GPU-1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901",
            Uuid("0000:3b:00", "GPU-1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901"),
        ),
        ("NVRM: GPU Board Serial Number: 0323618042671", None),
        ("NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.90.07", None),
    ],
)
def test_driver_message_formats(message, expected):
    assert read_message(message) == expected


def test_a_long_process_name_is_cut():
    said = read_message(f"NVRM: Xid (PCI:0000:3b:00): 13, pid=5, name={'x' * 500}, boom")
    assert isinstance(said, Report)
    assert said.name is not None
    assert len(said.name) == kernel_log.NAME_MAX


@pytest.mark.parametrize(
    ("bus", "key"),
    [
        ("00000000:3B:00.0", (0, 0x3B, 0)),
        ("0000:3b:00", (0, 0x3B, 0)),
        ("0001:af:1f.7", (1, 0xAF, 0x1F)),
        ("3b:00.0", (0, 0x3B, 0)),
        ("[N/A]", None),
        (None, None),
    ],
)
def test_pci_keys(bus, key):
    assert pci_key(bus) == key


# --- what cannot be used: file:line:col -----------------------------------------------------------


def test_an_xid_line_that_does_not_read_names_its_place(tmp_path):
    log = tmp_path / "bad.txt"
    line = "[ 7207.512349] NVRM: Xid (PCI:0000:3b:00): seventy-nine"
    log.write_text(f"[ 1.000000] Linux version 6.8\n{line}\n")
    with pytest.raises(InputError) as caught:
        kernel_log.load(log)
    rendered = caught.value.render()
    assert rendered.startswith(f"{log}:2:{line.index('(') + 1}: an XID report that does not read")
    assert "expected NVRM: Xid (PCI:0000:3b:00): 79, ..." in rendered


def test_an_xid_line_without_a_time_stamp(tmp_path):
    log = tmp_path / "grepped.txt"
    log.write_text(f"[ 1.000000] Linux version 6.8\n{MESSAGE}\n")
    with pytest.raises(InputError) as caught:
        kernel_log.load(log)
    rendered = caught.value.render()
    assert rendered.startswith(f"{log}:2:1: a driver message without a time stamp")
    assert "hint: keep the whole lines" in rendered


@pytest.mark.parametrize(
    ("text", "what"), [("", "the file is empty"), ("a,b\n1,2\n", "no kernel log lines")]
)
def test_not_a_kernel_log(tmp_path, text, what):
    log = tmp_path / "wrong.txt"
    log.write_text(text)
    with pytest.raises(InputError) as caught:
        kernel_log.load(log)
    assert caught.value.render().startswith(f"{log}:1:1: {what} — expected a kernel log")


def test_an_unknown_time_zone_is_a_usage_error():
    with pytest.raises(UsageError, match="Mars/Olympus"):
        ReplayFeed(KERNEL / "dmesg-T-driver-535.txt", tz="Mars/Olympus")


# --- the one XID table ----------------------------------------------------------------------------


def test_every_xid_the_issue_names_has_a_meaning_and_an_action():
    for number in (13, 31, 43, 48, 63, 64, 79, 94, 95):
        assert number in XIDS
        assert describe_xid(number) == XIDS[number].meaning
        assert xid_action(number) == XIDS[number].action
    assert describe_xid(79) == "GPU has fallen off the bus"
    assert "drain the node" in (xid_action(79) or "")
    assert xid_action(9999) is None
    assert describe_xid(9999) == "see NVIDIA's XID catalogue"
