"""Replaying nvidia-smi --query-gpu CSV logs: formats, unknown values, lost GPUs, frames, errors."""

from __future__ import annotations

import itertools
import tracemalloc
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpuwarden.errors import ExitCode, InputError, UsageError
from gpuwarden.model import EventKind
from gpuwarden.sources.smi_csv import SmiCsvSource, load_smi_csv, parse_smi_csv

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "scenarios" / "nvidia-smi-oom-night.csv"
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "smi"

HEADER = "timestamp, name, index, utilization.gpu [%], memory.used [MiB], memory.total [MiB]"


def epoch(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def write(tmp_path: Path, text: str, name: str = "node-7.csv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def error_of(tmp_path: Path, text: str, **options: object) -> str:
    """The rendered error for a log; the file is called bad.csv."""
    with pytest.raises(InputError) as caught:
        load_smi_csv(write(tmp_path, text, "bad.csv"), **options)  # type: ignore[arg-type]
    assert caught.value.exit_code == ExitCode.BAD_INPUT
    return caught.value.render()


# --- the shipped example -----------------------------------------------------------------


def test_shipped_oom_night_log_parses_into_four_gpu_frames():
    source = SmiCsvSource(SHIPPED)
    assert source.name == f"smi-csv:{SHIPPED}"
    assert source.host == "nvidia-smi-oom-night"
    assert source.start_time == pytest.approx(epoch("2026-01-10T03:10:00.412"), abs=1e-6)
    assert 180 <= source.duration <= 300
    assert len(source.frames) == 265
    assert all([g.index for g in f.gpus] == [0, 1, 2, 3] for f in source.frames)
    first = source.frames[0].gpus[2]
    assert first.name == "NVIDIA A100-SXM4-80GB"
    assert first.pci_bus_id == "00000000:47:00.0"
    assert (first.uuid or "").startswith("GPU-")
    assert first.memory.total_mib == 81920
    assert first.memory.reserved_mib == 581
    assert 40 * 1024 <= (first.memory.used_mib or 0) <= 41 * 1024
    assert first.power_limit_w == 400.0
    assert first.pstate == 0
    assert first.mig_mode is False
    assert first.ecc is not None
    assert first.ecc.volatile_uncorrected == 0
    assert first.ecc.volatile_corrected is None  # not a column in this log
    assert first.throttle == ()


def test_shipped_log_tells_the_oom_story_on_gpu_2():
    source = SmiCsvSource(SHIPPED)
    used = [f.gpus[2].memory.used_pct or 0.0 for f in source.frames]
    full = next(i for i, pct in enumerate(used) if pct >= 99)
    assert used[0] < 52  # about 40 GiB of 80
    assert all(a <= b for a, b in itertools.pairwise(used[: full + 1]))
    assert 150 <= full <= 220
    assert used[-1] == 0.0  # the process died and its memory came back
    assert max(f.gpus[2].memory.used_pct or 0 for f in source.frames) < 100
    # the other GPUs carry on: training on 0 and 1, idle on 3
    assert all((f.gpus[0].utilization_pct or 0) > 0 for f in source.frames)
    assert all(f.gpus[3].throttle == ("gpu_idle",) for f in source.frames)
    assert any("sw_power_cap" in (f.gpus[1].throttle or ()) for f in source.frames)


def test_shipped_log_snapshot_has_no_processes_and_the_source_name():
    with SmiCsvSource(SHIPPED, host="dgx-a100-03") as source:
        snap = source.snapshot(source.start_time + 60)
    assert snap.host == "dgx-a100-03"
    assert snap.source == f"smi-csv:{SHIPPED}"
    assert snap.processes == ()
    assert snap.events == ()
    assert snap.time == source.start_time + 60


# --- formats -------------------------------------------------------------------------------


def test_units_in_values_and_nounits_read_the_same(tmp_path):
    with_units = (
        f"{HEADER}, power.draw [W], temperature.gpu\n"
        "2026/01/10 03:12:01.123, NVIDIA A100-SXM4-80GB, 0, 97 %, 52000 MiB, 81920 MiB, "
        "310.45 W, 61\n"
    )
    nounits = (
        f"{HEADER}, power.draw [W], temperature.gpu\n"
        "2026/01/10 03:12:01.123, NVIDIA A100-SXM4-80GB, 0, 97, 52000, 81920, 310.45, 61\n"
    )
    a = load_smi_csv(write(tmp_path, with_units, "a.csv"))
    b = load_smi_csv(write(tmp_path, nounits, "b.csv"))
    assert a == b
    gpu = a[0].gpus[0]
    assert (gpu.utilization_pct, gpu.memory.used_mib, gpu.memory.total_mib) == (97, 52000, 81920)
    assert gpu.power_w == 310.45
    assert gpu.temperature_c == 61
    assert a[0].time == epoch("2026-01-10T03:12:01.123")


def test_gib_and_kib_values_become_mib(tmp_path):
    text = (
        "timestamp, index, memory.used [GiB], memory.total, memory.free [KiB], memory.reserved\n"
        "2026-01-10T03:12:01, 0, 39.5, 80 GiB, 1048576 KiB, 1536 KiB\n"
    )
    memory = load_smi_csv(write(tmp_path, text))[0].gpus[0].memory
    assert (memory.used_mib, memory.total_mib, memory.free_mib) == (40448, 81920, 1024)
    assert memory.reserved_mib == 1  # whole MiB, rounded down like model.bytes_to_mib


def test_noheader_with_columns_argument(tmp_path):
    text = "2026/01/10 03:12:01.123, 3, 45, 1200\n2026/01/10 03:12:02.125, 3, 50, 1300\n"
    frames = load_smi_csv(
        write(tmp_path, text),
        columns=["timestamp", "index", "utilization.gpu", "memory.used [MiB]"],
    )
    assert [(f.gpus[0].utilization_pct, f.gpus[0].memory.used_mib) for f in frames] == [
        (45, 1200),
        (50, 1300),
    ]
    assert frames[0].gpus[0].index == 3


def test_noheader_with_columns_comment_line():
    path = FIXTURES / "noheader-nounits-columns-comment.csv"
    frames = load_smi_csv(path)
    assert len(frames) == 2
    assert [g.memory.used_mib for g in frames[1].gpus] == [40379, 3]
    assert frames[0].gpus[0].name == "NVIDIA H100 80GB HBM3"
    assert frames[0].gpus[0].power_w == 612.40
    assert frames[0].line == 3


def test_header_in_the_file_wins_over_the_columns_argument(tmp_path):
    text = f"{HEADER}\n2026/01/10 03:12:01.123, NVIDIA A100-SXM4-80GB, 1, 5 %, 10 MiB, 81920 MiB\n"
    frames = load_smi_csv(write(tmp_path, text), columns=["timestamp", "index"])
    assert frames[0].gpus[0].memory.used_mib == 10


def test_noheader_without_columns_says_how_to_fix_it(tmp_path):
    rendered = error_of(tmp_path, "2026/01/10 03:12:01.123, 0, 97 %\n")
    assert rendered.startswith(f"{tmp_path / 'bad.csv'}:1:1: a record before any column names")
    assert "# columns: timestamp,name,index" in rendered
    assert "--columns" in rendered


def test_repeated_header_from_an_appended_log_is_accepted(tmp_path):
    row = "2026/01/10 03:12:0{s}.100, NVIDIA A100-SXM4-80GB, 0, 9 %, 1 MiB, 81920 MiB\n"
    text = f"{HEADER}\n{row.format(s=1)}{HEADER}\n{row.format(s=2)}"
    assert len(load_smi_csv(write(tmp_path, text))) == 2


def test_windows_line_endings_and_a_byte_order_mark(tmp_path):
    text = (
        f"{HEADER}\r\n"
        "2026/01/10 03:12:01.123, NVIDIA A100-SXM4-80GB, 0, 97 %, 52000 MiB, 81920 MiB\r\n"
        "2026/01/10 03:12:02.125, NVIDIA A100-SXM4-80GB, 0, 98 %, 52100 MiB, 81920 MiB\r\n"
    )
    path = tmp_path / "windows.csv"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    frames = load_smi_csv(path)
    assert [f.gpus[0].memory.used_mib for f in frames] == [52000, 52100]
    assert frames[0].gpus[0].name == "NVIDIA A100-SXM4-80GB"


def test_query_aliases_and_unknown_columns(tmp_path):
    text = (
        "timestamp, gpu_name, index, gpu_bus_id, clocks.sm [MHz], fan.speed [%], driver_version\n"
        "2026/01/10 03:12:01.123, Tesla V100-SXM2-32GB, 0, 00000000:1A:00.0, 1530 MHz, [N/A], "
        "550.54.15\n"
    )
    gpu = load_smi_csv(write(tmp_path, text))[0].gpus[0]
    assert gpu.name == "Tesla V100-SXM2-32GB"
    assert gpu.pci_bus_id == "00000000:1A:00.0"


def test_quoted_fields_keep_their_commas_and_columns(tmp_path):
    text = (
        "timestamp, name, index, utilization.gpu [%]\n"
        '2026/01/10 03:12:01.123, "Lab card, rev 2", 0, lots\n'
    )
    line = text.splitlines()[1]
    rendered = error_of(tmp_path, text)
    assert rendered.startswith(f"{tmp_path / 'bad.csv'}:2:{line.index('lots') + 1}: ")


def test_power_prefers_draw_then_instant_and_enforced_limit(tmp_path):
    text = (
        "timestamp, index, power.draw.average [W], power.draw.instant [W], power.limit [W], "
        "enforced.power.limit [W]\n"
        "2026/01/10 03:12:01.123, 0, 300.00 W, 355.10 W, 400.00 W, 350.00 W\n"
        "2026/01/10 03:12:02.123, 0, 301.00 W, [N/A], [N/A], [N/A]\n"
    )
    first, second = (f.gpus[0] for f in load_smi_csv(write(tmp_path, text)))
    assert (first.power_w, first.power_limit_w) == (355.10, 350.0)
    assert (second.power_w, second.power_limit_w) == (301.0, None)


def test_pstate_mig_mode_and_ecc_counters(tmp_path):
    text = (
        "timestamp, index, pstate, mig.mode.current, ecc.errors.corrected.volatile.total, "
        "ecc.errors.uncorrected.volatile.total, ecc.errors.corrected.aggregate.total, "
        "ecc.errors.uncorrected.aggregate.total\n"
        "2026/01/10 03:12:01.123, 0, P2, Enabled, 12, 0, 340, 1\n"
    )
    gpu = load_smi_csv(write(tmp_path, text))[0].gpus[0]
    assert gpu.pstate == 2
    assert gpu.mig_mode is True
    assert gpu.ecc is not None
    assert (gpu.ecc.volatile_corrected, gpu.ecc.volatile_uncorrected) == (12, 0)
    assert (gpu.ecc.aggregate_corrected, gpu.ecc.aggregate_uncorrected) == (340, 1)


# --- unknown values are None, never 0 -------------------------------------------------------


def test_unsupported_and_unknown_values_are_none():
    gpu = load_smi_csv(FIXTURES / "unsupported-fields-geforce.csv")[0].gpus[0]
    assert gpu.name == "NVIDIA GeForce RTX 3070"
    assert gpu.uuid is None
    assert gpu.utilization_pct is None  # [Not Supported]
    assert gpu.memory_utilization_pct is None  # N/A
    assert gpu.temperature_c is None  # [Unknown Error]
    assert gpu.power_w is None
    assert gpu.power_limit_w is None
    assert gpu.memory.reserved_mib is None
    assert gpu.memory.used_mib == 1081
    assert gpu.ecc is None  # every counter [N/A]: the card has no ECC
    assert gpu.mig_mode is None
    assert gpu.throttle is None  # no reason columns at all
    assert gpu.pstate == 8
    assert not gpu.lost


# --- throttle reasons ------------------------------------------------------------------------


def test_throttle_reasons_from_old_driver_columns():
    frames = load_smi_csv(FIXTURES / "throttle-thermal-slowdown-old-driver.csv")
    cool, idle = frames[0].gpus
    hot, unknown = frames[1].gpus
    assert cool.throttle == ()
    assert idle.throttle == ("gpu_idle",)
    assert hot.throttle == (
        "sw_power_cap",
        "hw_slowdown",
        "sw_thermal_slowdown",
        "hw_thermal_slowdown",
    )
    assert unknown.throttle is None


def test_throttle_reasons_from_event_reason_columns_and_the_active_mask(tmp_path):
    text = (
        "timestamp, index, clocks_event_reasons.active, clocks_event_reasons.sync_boost, "
        "clocks_event_reasons.applications_clocks_setting, "
        "clocks_event_reasons.hw_power_brake_slowdown\n"
        "2026/01/10 03:12:01.123, 0, 0x0000000000000044, Active, Not Active, Active\n"
        "2026/01/10 03:12:01.131, 1, 0x0000000000000000, Not Active, Active, Not Active\n"
        "2026/01/10 03:12:01.139, 2, 0x0000000000000100, [N/A], [N/A], [N/A]\n"
    )
    a, b, c = load_smi_csv(write(tmp_path, text))[0].gpus
    assert a.throttle == (
        "sw_power_cap",
        "sync_boost",
        "hw_thermal_slowdown",
        "hw_power_brake_slowdown",
    )
    assert b.throttle == ("applications_clocks_setting",)
    assert c.throttle == ()  # 0x100 (display clock setting) has no gpuwarden name


# --- lost GPUs --------------------------------------------------------------------------------


def test_gpu_falling_off_the_bus_rows_and_messages():
    frames = load_smi_csv(FIXTURES / "xid79-gpu-falls-off-bus.csv")
    assert [f.line for f in frames] == [2, 5, 8, 11]
    assert [[g.index for g in f.gpus] for f in frames] == [[0, 1, 2]] * 4
    assert [[g.lost for g in f.gpus] for f in frames] == [
        [False, False, False],
        [False, True, False],
        [False, True, False],
        [True, True, False],
    ]
    row_lost = frames[1].gpus[1]
    assert row_lost.error == "GPU is lost"
    assert row_lost.name == "NVIDIA A100-SXM4-40GB"
    assert row_lost.pci_bus_id == "00000000:0F:00.0"  # remembered from its healthy rows
    assert row_lost.memory.used_mib is None
    assert row_lost.utilization_pct is None
    message_lost = frames[2].gpus[1]
    assert message_lost.error == (
        "Unable to determine the device handle for GPU0000:0F:00.0: Unknown Error"
    )
    assert message_lost.uuid == "GPU-00000000-1111-2222-3333-000000000001"
    # GPU 0's message came after GPU 0's row of that sample: it belongs to the next one
    assert frames[3].gpus[0].error is not None
    assert "GPU0000:07:00.0" in frames[3].gpus[0].error
    assert frames[3].time == pytest.approx(epoch("2026-03-02T14:00:03.111"), abs=1e-6)


def test_gpu_lost_event_once_when_a_gpu_turns_lost():
    source = SmiCsvSource(FIXTURES / "xid79-gpu-falls-off-bus.csv")
    events = [source.snapshot(source.start_time + s).events for s in (0, 1.5, 2.5, 3.5, 4.0)]
    assert events[0] == ()
    assert [(e.kind, e.gpu) for e in events[1]] == [(EventKind.GPU_LOST, 1)]
    assert events[1][0].detail == "GPU is lost"
    assert events[2] == ()
    assert [(e.kind, e.gpu) for e in events[3]] == [(EventKind.GPU_LOST, 0)]
    assert events[4] == ()


@pytest.mark.parametrize(
    ("message", "index"),
    [
        ("Unable to determine the device handle for GPU1: Unknown Error", 1),
        ("Unable to determine the device handle for GPU 1: Unknown Error", 1),
        ("Unable to determine the device handle for GPU1: 0000:34:00.0: Unknown Error", 1),
        ("Unable to determine the device handle for GPU0000:34:00.0: GPU is lost", 1),
        ("Unable to determine the device handle for GPU0000:99:00.0: Unknown Error", 1),
    ],
)
def test_device_handle_message_spellings(tmp_path, message, index):
    text = (
        "timestamp, index, pci.bus_id, utilization.gpu [%]\n"
        "2026/01/10 03:12:01.100, 0, 00000000:1A:00.0, 50 %\n"
        "2026/01/10 03:12:01.105, 1, 00000000:34:00.0, 50 %\n"
        "2026/01/10 03:12:02.100, 0, 00000000:1A:00.0, 51 %\n"
        f"{message}\n"
    )
    frames = load_smi_csv(write(tmp_path, text))
    assert len(frames) == 2
    lost = next(g for g in frames[1].gpus if g.index == index)
    assert lost.lost
    assert lost.error == message
    assert frames[1].gpus[0].lost is False


def test_messages_after_a_new_sample_began_stay_in_that_sample(tmp_path):
    text = (
        "timestamp, index, utilization.gpu [%]\n"
        "2026/01/10 03:12:01.100, 0, 50 %\n"
        "2026/01/10 03:12:01.105, 1, 50 %\n"
        "Unable to determine the device handle for GPU0: Unknown Error\n"
        "Unable to determine the device handle for GPU2: Unknown Error\n"
        "2026/01/10 03:12:02.105, 1, 51 %\n"
    )
    frames = load_smi_csv(write(tmp_path, text))
    assert [[(g.index, g.lost) for g in f.gpus] for f in frames] == [
        [(0, False), (1, False)],
        [(0, True), (1, False), (2, True)],
    ]
    assert [f.line for f in frames] == [2, 4]


def test_log_ending_with_unreachable_gpus_gets_one_more_frame(tmp_path):
    text = (
        "timestamp, index, utilization.gpu [%]\n"
        "2026/01/10 03:12:01.100, 0, 50 %\n"
        "2026/01/10 03:12:01.105, 1, 50 %\n"
        "2026/01/10 03:12:03.100, 0, 51 %\n"
        "2026/01/10 03:12:03.105, 1, 51 %\n"
        "Unable to determine the device handle for GPU0: Unknown Error\n"
        "Unable to determine the device handle for GPU1: Unknown Error\n"
    )
    frames = load_smi_csv(write(tmp_path, text))
    assert len(frames) == 3
    assert frames[2].time == pytest.approx(
        epoch("2026-01-10T03:12:05.100"), abs=1e-6
    )  # one step on
    assert frames[2].line == 6
    assert all(g.lost for g in frames[2].gpus)


# --- frames ------------------------------------------------------------------------------------


def test_frames_group_by_sample_across_a_second_boundary(tmp_path):
    text = (
        "timestamp, index, utilization.gpu [%]\n"
        "2026/01/10 03:12:01.996, 0, 10 %\n"
        "2026/01/10 03:12:02.003, 1, 11 %\n"  # same sample, the clock ticked over
        "2026/01/10 03:12:02.998, 0, 12 %\n"  # index 0 again: the next sample
        "2026/01/10 03:12:04.500, 1, 13 %\n"  # 1.5 s on: a sample without GPU 0's row
    )
    frames = load_smi_csv(write(tmp_path, text))
    assert [[g.utilization_pct for g in f.gpus] for f in frames] == [[10, 11], [12], [13]]
    assert [f.line for f in frames] == [2, 4, 5]
    assert frames[0].time == pytest.approx(epoch("2026-01-10T03:12:01.996"), abs=1e-6)


def test_same_second_timestamps_form_one_frame_sorted_by_index(tmp_path):
    text = (
        "timestamp, index, utilization.gpu [%]\n"
        "2026-01-10 03:12:01, 1, 11 %\n"
        "2026-01-10 03:12:01, 0, 10 %\n"
        "2026-01-10 03:12:02, 1, 21 %\n"
        "2026-01-10 03:12:02, 0, 20 %\n"
    )
    frames = load_smi_csv(write(tmp_path, text))
    assert [[(g.index, g.utilization_pct) for g in f.gpus] for f in frames] == [
        [(0, 10), (1, 11)],
        [(0, 20), (1, 21)],
    ]


# --- replay by offset ---------------------------------------------------------------------------


@pytest.fixture
def three_frames(tmp_path) -> SmiCsvSource:
    text = (
        "timestamp, index, utilization.gpu [%]\n"
        "2026/01/10 03:12:00.500, 0, 10 %\n"
        "2026/01/10 03:12:01.500, 0, 20 %\n"
        "2026/01/10 03:12:04.500, 0, 30 %\n"
    )
    return SmiCsvSource(write(tmp_path, text))


def util_at(source: SmiCsvSource, offset: float) -> int | None:
    snap = source.snapshot(source.start_time + offset)
    assert snap.time == source.start_time + offset
    return snap.gpus[0].utilization_pct


def test_replay_start_time_and_duration(three_frames):
    assert three_frames.start_time == pytest.approx(epoch("2026-01-10T03:12:00.500"), abs=1e-6)
    assert three_frames.duration == 4.0
    assert three_frames.host == "node-7"


@pytest.mark.parametrize(
    ("offset", "util"),
    [(-30.0, 10), (0.0, 10), (0.99, 10), (1.0, 20), (3.9, 20), (4.0, 30), (600.0, 30)],
)
def test_replay_by_offset(three_frames, offset, util):
    assert util_at(three_frames, offset) == util


def test_replay_from_now_when_start_time_is_moved(three_frames):
    three_frames.start_time = 1_900_000_000.0
    assert three_frames.snapshot(1_900_000_001.2).gpus[0].utilization_pct == 20
    assert three_frames.snapshot(1_899_999_000.0).gpus[0].utilization_pct == 10


def test_replay_back_and_forth_shows_the_same_frames(three_frames):
    """Playing forward reads on; going back reads the log again from its start."""
    offsets = [0.0, 4.0, 1.5, 600.0, -5.0, 1.0, 3.0, 0.5]
    seen = [util_at(three_frames, offset) for offset in offsets]
    assert seen == [10, 30, 20, 30, 10, 20, 20, 10]
    assert three_frames.position(three_frames.start_time + 1.5).startswith("sample 2 of 3 (line 3)")
    assert three_frames.sample_offset(3) == 4.0


def _long_log(path: Path, samples: int) -> Path:
    with path.open("w", encoding="utf-8") as out:
        out.write("timestamp, index, utilization.gpu [%], memory.used [MiB], memory.total [MiB]\n")
        for n in range(samples):
            minute, second = divmod(n, 60)
            hour, minute = divmod(minute, 60)
            for gpu in range(4):
                stamp = f"2026/01/{10 + hour // 24:02d} {hour % 24:02d}:{minute:02d}:{second:02d}"
                out.write(f"{stamp}.{gpu:03d}, {gpu}, {n % 100} %, {n % 50}000 MiB, 81920 MiB\n")
    return path


def _peak_playing(path: Path) -> int:
    """The most memory (bytes, as tracemalloc counts it) opening and playing a log takes."""
    tracemalloc.start()
    try:
        source = SmiCsvSource(path)
        last = None
        for second in range(int(source.duration) + 1):
            last = source.snapshot(source.start_time + second)
        assert last is not None
        assert last.gpus[3].memory.used_mib == int(source.duration) % 50 * 1000
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_long_log_plays_in_the_memory_of_a_short_one(tmp_path):
    """A log is read as it plays: ten times the samples takes no more memory (a log read
    whole would take about ten times as much)."""
    short = _peak_playing(_long_log(tmp_path / "short.csv", 400))
    long = _peak_playing(_long_log(tmp_path / "long.csv", 4_000))
    assert long < short * 1.5, (short, long)


# --- time zones -------------------------------------------------------------------------------


def test_naive_times_are_utc_unless_a_zone_is_named(tmp_path):
    text = "timestamp, index\n2026/07/01 12:00:00.000, 0\n"
    path = write(tmp_path, text)
    assert load_smi_csv(path)[0].time == epoch("2026-07-01T12:00:00")
    berlin = load_smi_csv(path, tz="Europe/Berlin")[0].time
    assert berlin == epoch("2026-07-01T10:00:00")  # CEST is UTC+2


def test_iso_times_with_an_offset_ignore_the_zone(tmp_path):
    text = "timestamp, index\n2026-07-01T12:00:00+05:30, 0\n2026-07-01T06:30:01Z, 0\n"
    frames = load_smi_csv(write(tmp_path, text), tz="America/New_York")
    assert [f.time for f in frames] == [epoch("2026-07-01T06:30:00"), epoch("2026-07-01T06:30:01")]


def test_the_hour_repeated_when_daylight_saving_time_ends(tmp_path):
    # New York, 2026-11-01: 01:59:59 EDT is followed by 01:00:00 EST
    text = (
        "timestamp, index\n"
        "2026/11/01 01:59:59.000, 0\n"
        "2026/11/01 01:00:00.000, 0\n"
        "2026/11/01 01:00:01.000, 0\n"
    )
    frames = load_smi_csv(write(tmp_path, text), tz="America/New_York")
    assert [f.time - frames[0].time for f in frames] == [0.0, 1.0, 2.0]


def test_unknown_time_zone_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="Mars/Olympus"):
        load_smi_csv(write(tmp_path, "timestamp, index\n"), tz="Mars/Olympus")


# --- malformed input: exact file:line:col -------------------------------------------------------

ROW = "2026/01/10 03:12:01.123, NVIDIA A100-SXM4-80GB, 0, 97 %, 52000 MiB, 81920 MiB"


@pytest.mark.parametrize(
    ("row", "bad", "message"),
    [
        (ROW.replace("97 %", "ninety %"), "ninety %", "utilization.gpu is not a number"),
        (ROW.replace("52000 MiB", "52000 W"), "52000 W", "memory.used has the unit 'W'"),
        (ROW.replace("2026/01/10 03", "2026/13/10 03"), "2026/13", "not a timestamp"),
        (ROW.replace("01.123", "01.123 yesterday"), "2026/01", "not a timestamp"),
        (ROW.replace(", 0, ", ", 0.5, "), "0.5", "index is not a whole number"),
        (ROW.replace(", 0, ", ", [N/A], "), "[N/A]", "this row has no index"),
        (ROW.replace("2026/01/10 03:12:01.123", "[N/A]"), "[N/A]", "this row has no timestamp"),
        (ROW + ", 7 W", "7 W", "7 fields in a row of 6 columns"),
    ],
)
def test_bad_values_are_reported_at_their_field(tmp_path, row, bad, message):
    rendered = error_of(tmp_path, f"{HEADER}\n{ROW}\n{row}\n")
    col = row.index(bad) + 1
    assert rendered.startswith(f"{tmp_path / 'bad.csv'}:3:{col}: {message}")
    assert " — expected " in rendered


def test_too_few_fields_points_past_the_end_of_the_row(tmp_path):
    short = "2026/01/10 03:12:01.123, NVIDIA A100-SXM4-80GB, 0, 97 %"
    rendered = error_of(tmp_path, f"{HEADER}\n{short}\n")
    assert rendered.startswith(f"{tmp_path / 'bad.csv'}:2:{len(short) + 1}: 4 fields in a row")
    assert "expected 6 values (timestamp, name, index, utilization.gpu, memory.used" in rendered


def test_exact_rendering_of_a_bad_number(tmp_path):
    rendered = error_of(tmp_path, f"{HEADER}\n{ROW.replace('97 %', 'x %')}\n")
    assert rendered == (
        f"{tmp_path / 'bad.csv'}:2:52: utilization.gpu is not a number: 'x %'"
        " — expected a percentage such as 97 %"
    )


@pytest.mark.parametrize(
    ("header", "bad", "message"),
    [
        ("name, index", "name", "no timestamp column"),
        ("name, uuid", "name", "no timestamp column"),
        ("timestamp, index, memory.used [W]", "memory.used", "unit [W] for memory.used"),
        ("timestamp, index, name, index", "index", "column index twice"),
    ],
)
def test_bad_headers(tmp_path, header, bad, message):
    rendered = error_of(tmp_path, f"{header}\n{ROW}\n")
    col = header.rindex(bad) + 1
    assert rendered.startswith(f"{tmp_path / 'bad.csv'}:1:{col}: {message}")


def test_missing_timestamp_names_the_required_column(tmp_path):
    rendered = error_of(tmp_path, "index, name\n0, x\n")
    assert rendered == (
        f"{tmp_path / 'bad.csv'}:1:1: no timestamp column — expected a timestamp column "
        "(nvidia-smi --query-gpu=timestamp,index,...)\n"
        "  hint: nvidia-smi writes the time of each row only when the query asks for it"
    )


def test_bad_columns_comment_points_into_the_comment(tmp_path):
    text = "# columns: timestamp, index, power.draw [MiB]\n"
    rendered = error_of(tmp_path, text)
    assert rendered.startswith(f"{tmp_path / 'bad.csv'}:1:{text.index('power') + 1}: unit [MiB]")


@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        ("pstate", "P16", "pstate is 'P16'"),
        ("pstate", "high", "pstate is 'high'"),
        ("mig.mode.current", "Maybe", "mig.mode.current is 'Maybe'"),
        ("clocks_event_reasons.hw_slowdown", "Yes", "clocks_event_reasons.hw_slowdown is 'Yes'"),
        ("clocks_event_reasons.active", "0xZZ", "clocks_event_reasons.active is '0xZZ'"),
        ("ecc.errors.corrected.volatile.total", "-1", "is not a number"),
    ],
)
def test_bad_words_in_word_columns(tmp_path, column, value, message):
    row = f"2026/01/10 03:12:01.123, 0, {value}"
    rendered = error_of(tmp_path, f"timestamp, index, {column}\n{row}\n")
    assert rendered.startswith(f"{tmp_path / 'bad.csv'}:2:{row.index(value) + 1}: ")
    assert message in rendered


def test_empty_file(tmp_path):
    rendered = error_of(tmp_path, "")
    assert rendered.startswith(f"{tmp_path / 'bad.csv'}:1:1: the file is empty — expected ")


def test_header_without_rows(tmp_path):
    rendered = error_of(tmp_path, f"\n{HEADER}\n\n")
    assert rendered.startswith(f"{tmp_path / 'bad.csv'}:2:1: no GPU records")


def test_time_going_back_is_an_error_with_a_hint(tmp_path):
    text = f"{HEADER}\n{ROW}\n{ROW.replace('03:12:01', '02:12:01').replace(', 0,', ', 1,')}\n"
    rendered = error_of(tmp_path, text)
    assert rendered.startswith(f"{tmp_path / 'bad.csv'}:3:1: the time goes back to 2026/01/10")
    assert "hint: two logs may have been joined" in rendered


def test_a_small_clock_step_back_is_smoothed_over(tmp_path):
    text = (
        "timestamp, index\n"
        "2026/01/10 03:12:01.500, 0\n"
        "2026/01/10 03:12:02.500, 0\n"
        "2026/01/10 03:12:02.200, 0\n"  # NTP stepped the clock back 0.3 s
    )
    times = [f.time for f in load_smi_csv(write(tmp_path, text))]
    assert times == sorted(times)
    assert len(times) == 3


def test_not_utf8_points_at_the_byte(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_bytes(f"{HEADER}\n".encode() + b"2026/01/10 03:12:01.123, caf\xe9, 0\n")
    with pytest.raises(InputError) as caught:
        load_smi_csv(path)
    assert caught.value.render().startswith(f"{path}:2:29: this is not UTF-8 text")


def test_missing_file(tmp_path):
    with pytest.raises(InputError, match="cannot read it"):
        SmiCsvSource(tmp_path / "nope.csv")


def test_columns_argument_without_timestamp_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError) as caught:
        load_smi_csv(write(tmp_path, "x\n"), columns=["index", "name"])
    assert "no timestamp column" in caught.value.render()
    assert "a timestamp column" in caught.value.render()


def test_parse_text_directly_names_the_file_in_errors():
    frames = parse_smi_csv(f"{HEADER}\n{ROW}\n", file="pasted")
    assert frames[0].gpus[0].utilization_pct == 97
    with pytest.raises(InputError, match=r"^pasted:2:"):
        parse_smi_csv(f"{HEADER}\n{ROW.replace('97 %', '?')}\n", file="pasted")
