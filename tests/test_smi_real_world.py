"""nvidia-smi logs as people actually have them: any column subset with a timestamp, Windows
encodings, noheader logs with their column list, 40+ columns, decimal commas, @#N."""

from __future__ import annotations

import codecs
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpuwarden.errors import InputError
from gpuwarden.sources.smi_csv import SmiCsvSource, SmiFrame, load_smi_csv, parse_smi_csv
from gpuwarden.sources.smi_csv_records import split_columns

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "smi"


def epoch(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def table(
    frames: tuple[SmiFrame, ...], *fields: str
) -> list[tuple[float, list[tuple[object, ...]]]]:
    """Each frame's time and, per GPU, its index then the named GpuState fields."""
    out: list[tuple[float, list[tuple[object, ...]]]] = []
    for frame in frames:
        rows: list[tuple[object, ...]] = []
        for gpu in frame.gpus:
            values: list[object] = [gpu.index]
            for name in fields:
                value: object = gpu
                for part in name.split("."):
                    value = getattr(value, part)
                values.append(value)
            rows.append(tuple(values))
        out.append((round(frame.time, 3), rows))
    return out


# --- GPU identity without an index column ------------------------------------------------------


def test_no_identity_columns_numbers_gpus_by_place_in_each_round():
    frames = load_smi_csv(FIXTURES / "no-index-name-memory.csv")
    assert table(frames, "name", "memory.used_mib", "memory.total_mib", "utilization_pct") == [
        (
            epoch("2026-02-17T22:41:07.415"),
            [(0, "NVIDIA RTX A6000", 38211, 49140, 100), (1, "NVIDIA RTX A6000", 4, 49140, 0)],
        ),
        (
            epoch("2026-02-17T22:41:08.421"),
            [(0, "NVIDIA RTX A6000", 38211, 49140, 99), (1, "NVIDIA RTX A6000", 4, 49140, 0)],
        ),
        (
            epoch("2026-02-17T22:41:09.427"),
            [(0, "NVIDIA RTX A6000", 48931, 49140, 100), (1, "NVIDIA RTX A6000", 17, 49140, 3)],
        ),
        # this round straddles a second boundary (.998 and .002): still one round
        (
            epoch("2026-02-17T22:41:10.998"),
            [(0, "NVIDIA RTX A6000", 49136, 49140, 100), (1, "NVIDIA RTX A6000", 17, 49140, 0)],
        ),
    ]
    assert [f.line for f in frames] == [2, 4, 6, 8]


def test_bus_id_only_numbers_gpus_in_pci_order_and_keeps_lost_ones():
    frames = load_smi_csv(FIXTURES / "bus-id-only-nvidia-docs-query.csv")
    bus = "pci_bus_id"
    assert table(frames, bus, "lost", "temperature_c", "memory.used_mib", "utilization_pct") == [
        (
            epoch("2026-03-03T14:00:00.211"),
            [
                (0, "00000000:18:00.0", False, 52, 30727, 98),
                (1, "00000000:3B:00.0", False, 55, 30727, 97),
                (2, "00000000:86:00.0", False, 50, 28679, 100),
                (3, "00000000:AF:00.0", False, 47, 16391, 91),
            ],
        ),
        (
            epoch("2026-03-03T14:00:05.226"),
            [
                (0, "00000000:18:00.0", False, 53, 30727, 99),
                (1, "00000000:3B:00.0", False, 56, 30727, 98),
                (2, "00000000:86:00.0", False, 51, 28679, 100),
                (3, "00000000:AF:00.0", False, 48, 16391, 92),
            ],
        ),
        (
            epoch("2026-03-03T14:00:10.241"),
            [
                (0, "00000000:18:00.0", False, 53, 30727, 97),
                (1, "00000000:3B:00.0", True, None, None, None),  # a [GPU is lost] row
                (2, "00000000:86:00.0", False, 51, 28679, 100),
                (3, "00000000:AF:00.0", False, 48, 16391, 93),
            ],
        ),
        (
            epoch("2026-03-03T14:00:15.257"),
            [
                (0, "00000000:18:00.0", False, 53, 30727, 100),
                (1, "00000000:3B:00.0", True, None, None, None),  # "Unable to determine ..."
                (2, "00000000:86:00.0", False, 45, 271, 0),
                (3, "00000000:AF:00.0", False, 44, 271, 0),
            ],
        ),
        (
            epoch("2026-03-03T14:00:20.270"),
            [
                (0, "00000000:18:00.0", False, 52, 30727, 100),
                (1, "00000000:3B:00.0", True, None, None, None),
                (2, "00000000:86:00.0", False, 41, 271, 0),
                (3, "00000000:AF:00.0", False, 40, 271, 0),
            ],
        ),
    ]
    assert frames[2].gpus[1].error == "GPU is lost"
    assert frames[3].gpus[1].error == (
        "Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error"
    )
    assert {g.name for f in frames for g in f.gpus} == {"Tesla V100-SXM2-32GB"}


def test_bus_ids_out_of_pci_order_in_the_rows_still_number_by_pci_order(tmp_path):
    text = (
        "timestamp, pci.bus_id, utilization.gpu [%]\n"
        "2026/03/03 14:00:00.211, 00000000:AF:00.0, 3 %\n"
        "2026/03/03 14:00:00.215, 00000001:18:00.0, 4 %\n"
        "2026/03/03 14:00:00.219, 00000000:3B:00.0, 1 %\n"
    )
    path = tmp_path / "odd.csv"
    path.write_text(text)
    (frame,) = load_smi_csv(path)
    assert [(g.index, g.pci_bus_id, g.utilization_pct) for g in frame.gpus] == [
        (0, "00000000:3B:00.0", 1),
        (1, "00000000:AF:00.0", 3),
        (2, "00000001:18:00.0", 4),  # domain 1 comes after every bus of domain 0
    ]


def test_uuid_only_numbers_gpus_in_the_order_they_first_appear():
    text = (
        "timestamp, uuid, memory.used [MiB]\n"
        "2026/03/03 14:00:00.211, GPU-bbbbbbbb-0000-0000-0000-000000000000, 10 MiB\n"
        "2026/03/03 14:00:00.215, GPU-aaaaaaaa-0000-0000-0000-000000000000, 20 MiB\n"
        "2026/03/03 14:00:01.219, GPU-bbbbbbbb-0000-0000-0000-000000000000, 11 MiB\n"
        "2026/03/03 14:00:01.223, GPU-aaaaaaaa-0000-0000-0000-000000000000, 21 MiB\n"
    )
    frames = parse_smi_csv(text, file="uuids.csv")
    assert table(frames, "uuid", "memory.used_mib") == [
        (
            epoch("2026-03-03T14:00:00.211"),
            [
                (0, "GPU-bbbbbbbb-0000-0000-0000-000000000000", 10),
                (1, "GPU-aaaaaaaa-0000-0000-0000-000000000000", 20),
            ],
        ),
        (
            epoch("2026-03-03T14:00:01.219"),
            [
                (0, "GPU-bbbbbbbb-0000-0000-0000-000000000000", 11),
                (1, "GPU-aaaaaaaa-0000-0000-0000-000000000000", 21),
            ],
        ),
    ]


@pytest.mark.parametrize(
    ("interval", "gpus"),
    [
        (1.0, 1),  # one GPU, -l 1: every row is a round
        (0.1, 1),  # one GPU, -lms 100: half the interval still tells rounds apart
        (0.05, 2),  # two GPUs 4 ms apart, -lms 50
        (5.0, 8),  # eight GPUs, -l 5
    ],
)
def test_rounds_without_identity_follow_the_sampling_interval(interval, gpus):
    rows = [
        f"2026-03-03T14:00:{r * interval + g * 0.004:06.3f}Z, {g * 10} %"
        for r in range(4)
        for g in range(gpus)
    ]
    frames = parse_smi_csv("timestamp, utilization.gpu [%]\n" + "\n".join(rows), file="x.csv")
    expected = [(g, g * 10) for g in range(gpus)]
    assert [[(g.index, g.utilization_pct) for g in f.gpus] for f in frames] == [expected] * 4
    assert [round(f.time - frames[0].time, 3) for f in frames] == [
        round(r * interval, 3) for r in range(4)
    ]


# --- encodings and line ends ---------------------------------------------------------------------


def test_utf16_le_with_bom_and_crlf_from_powershell():
    path = FIXTURES / "windows-powershell-utf16le-bom-crlf.csv"
    assert path.read_bytes()[:4] == b"\xff\xfet\x00"
    frames = load_smi_csv(path)
    assert table(
        frames, "name", "temperature_c", "utilization_pct", "memory.used_mib", "power_w"
    ) == [
        (
            epoch("2026-01-22T09:15:31.804"),
            [
                (0, "NVIDIA RTX A5000", 71, 100, 21877, 226.71),
                (1, "NVIDIA RTX A5000", 38, 0, 1196, 19.84),
            ],
        ),
        (
            epoch("2026-01-22T09:15:32.817"),
            [
                (0, "NVIDIA RTX A5000", 72, 99, 22389, 229.03),
                (1, "NVIDIA RTX A5000", 38, 0, 1196, 19.91),
            ],
        ),
    ]


def test_windows_nvidia_smi_exe_output_from_cmd():
    path = FIXTURES / "windows-nvidia-smi-exe-cmd.csv"
    assert b"\r\n" in path.read_bytes()
    frames = load_smi_csv(path)
    fields = ("pci_bus_id", "pstate", "temperature_c", "utilization_pct", "memory.used_mib",
              "memory.total_mib", "power_w", "power_limit_w")  # fmt: skip
    assert table(frames, *fields) == [
        (
            epoch("2026-04-05T20:03:11.372"),
            [(0, "00000000:01:00.0", 2, 64, 97, 22853, 24564, 412.37, 450.0)],
        ),
        (
            epoch("2026-04-05T20:03:12.388"),
            [(0, "00000000:01:00.0", 2, 65, 98, 23941, 24564, 418.92, 450.0)],
        ),
        (
            epoch("2026-04-05T20:03:13.402"),
            [(0, "00000000:01:00.0", 8, 51, 0, 1432, 24564, 31.06, 450.0)],
        ),
    ]
    assert frames[0].gpus[0].name == "NVIDIA GeForce RTX 4090"


@pytest.mark.parametrize(
    ("bom", "encoding"),
    [
        (codecs.BOM_UTF8, "utf-8"),  # Out-File -Encoding utf8
        (codecs.BOM_UTF16_LE, "utf-16-le"),  # PowerShell 5 >
        (codecs.BOM_UTF16_BE, "utf-16-be"),
        (b"", "utf-16-le"),  # the mark lost in a copy: told by its NUL bytes
        (b"", "utf-8"),
    ],
)
def test_every_encoding_windows_writes_reads_the_same(tmp_path, bom, encoding):
    original = FIXTURES / "windows-nvidia-smi-exe-cmd.csv"
    text = original.read_bytes().decode("ascii")
    copy = tmp_path / "copy.csv"
    copy.write_bytes(bom + text.encode(encoding))
    assert load_smi_csv(copy) == load_smi_csv(original)


def test_utf16_that_breaks_off_names_its_line_and_column(tmp_path):
    path = tmp_path / "cut.csv"
    good = "timestamp, index\r\n2026/01/22 09:15:31.804, 0\r\n".encode("utf-16-le")
    path.write_bytes(codecs.BOM_UTF16_LE + good + b"\x00\xdc")  # a lone low surrogate
    with pytest.raises(InputError) as caught:
        load_smi_csv(path)
    rendered = caught.value.render()
    assert rendered.startswith(f"{path}:3:1: this is not utf-16-le text")
    assert "hint: save it as UTF-8" in rendered


# --- noheader, with the column list given --------------------------------------------------------


QUERY = (
    "nvidia-smi --query-gpu=timestamp,index,temperature.gpu,memory.used,memory.total,power.draw "
    "--format=csv,noheader,nounits -l 1"
)


@pytest.mark.parametrize(
    "given",
    [
        QUERY,  # the whole command line pasted
        "--query-gpu=timestamp,index,temperature.gpu,memory.used,memory.total,power.draw",
        "timestamp, index, temperature.gpu, memory.used [MiB], memory.total [MiB], power.draw [W]",
    ],
)
def test_noheader_log_with_its_columns_given(given):
    frames = load_smi_csv(
        FIXTURES / "noheader-nounits-query-pasted.csv", columns=split_columns(given)
    )
    fields = ("temperature_c", "memory.used_mib", "memory.total_mib", "power_w")
    assert table(frames, *fields) == [
        (
            epoch("2026-05-12T04:30:00.017"),
            [(0, 76, 41230, 81559, 688.21), (1, 68, 80901, 81559, 701.44)],
        ),
        (
            epoch("2026-05-12T04:30:01.031"),
            [(0, 77, 41230, 81559, 690.02), (1, 69, 81477, 81559, 699.87)],
        ),
    ]


def test_split_columns_reads_each_way_of_giving_them():
    assert split_columns("timestamp,index,memory.used [MiB]") == [
        "timestamp",
        "index",
        "memory.used [MiB]",
    ]
    assert split_columns("--query-gpu='timestamp,name' --format=csv") == ["timestamp", "name"]
    assert split_columns('nvidia-smi --query-gpu "timestamp,uuid" -l 5') == ["timestamp", "uuid"]


# --- many columns, markers -----------------------------------------------------------------------


def test_seventy_two_columns_with_markers_read_what_gpuwarden_knows():
    path = FIXTURES / "h100-seventy-two-columns.csv"
    assert path.read_text().splitlines()[0].count(",") == 71
    frames = load_smi_csv(path)
    fields = ("pci_bus_id", "memory.used_mib", "memory.reserved_mib", "memory.free_mib",
              "utilization_pct", "memory_utilization_pct", "temperature_c", "power_w",
              "power_limit_w", "throttle", "pstate", "mig_mode")  # fmt: skip
    assert table(frames, *fields) == [
        (
            epoch("2026-06-30T11:02:44.503"),
            [
                (
                    0,
                    "00000000:19:00.0",
                    67211,
                    580,
                    13768,
                    100,
                    43,
                    61,
                    671.38,
                    700.0,
                    (),
                    0,
                    False,
                ),
                (
                    1,
                    "00000000:3B:00.0",
                    0,
                    580,
                    80979,
                    0,
                    0,
                    31,
                    69.47,
                    700.0,
                    ("gpu_idle",),
                    0,
                    False,
                ),
            ],
        ),
        (
            epoch("2026-06-30T11:02:45.531"),
            [
                (
                    0,
                    "00000000:19:00.0",
                    67211,
                    580,
                    13768,
                    100,
                    45,
                    63,
                    699.91,
                    700.0,
                    ("sw_power_cap",),
                    0,
                    False,
                ),
                # [Unknown Error] and [N/A] read as None, never 0
                (
                    1,
                    "00000000:3B:00.0",
                    0,
                    580,
                    80979,
                    0,
                    0,
                    None,
                    None,
                    700.0,
                    ("gpu_idle",),
                    0,
                    False,
                ),
            ],
        ),
    ]
    first = frames[0].gpus[0]
    assert first.uuid == "GPU-7c1e5a0b-2d3f-4e61-9a8b-0c1d2e3f4a50"
    assert first.ecc is not None
    assert (first.ecc.volatile_corrected, first.ecc.aggregate_uncorrected) == (0, 0)


# --- decimal commas ------------------------------------------------------------------------------


def test_a_spreadsheet_resave_with_semicolons_and_decimal_commas():
    text = (
        "timestamp;index;power.draw [W];memory.used [GiB];utilization.gpu [%]\r\n"
        "2026/01/10 03:12:01.123;0;310,45 W;39,5 GiB;97 %\r\n"
        "2026/01/10 03:12:01.131;1;71,02 W;0,25 GiB;0 %\r\n"
    )
    (frame,) = parse_smi_csv(text, file="excel.csv")
    assert [(g.index, g.power_w, g.memory.used_mib, g.utilization_pct) for g in frame.gpus] == [
        (0, 310.45, 40448, 97),
        (1, 71.02, 256, 0),
    ]


def test_decimal_commas_between_nvidia_smi_separators():
    text = (
        "timestamp, index, power.draw [W], temperature.gpu\n"
        "2026/01/10 03:12:01.123, 0, 310,45 W, 61\n"
        '2026/01/10 03:12:02.123, 0, "311,5", 62\n'
    )
    frames = parse_smi_csv(text, file="locale.csv")
    assert [(f.gpus[0].power_w, f.gpus[0].temperature_c) for f in frames] == [
        (310.45, 61),
        (311.5, 62),
    ]


@pytest.mark.parametrize(
    ("value", "column"),
    [
        ("1,000 W", "power.draw [W]"),
        ("81,920 MiB", "memory.used [MiB]"),
        ("9,5 %", "utilization.gpu [%]"),
    ],
)
def test_a_comma_that_may_separate_thousands_is_an_error(value, column):
    row = f"2026/01/10 03:12:01.123;0;{value}"
    with pytest.raises(InputError) as caught:
        parse_smi_csv(f"timestamp;index;{column}\n{row}\n", file="bad.csv")
    rendered = caught.value.render()
    assert rendered.startswith(f"bad.csv:2:{row.index(value) + 1}: ")
    assert "may separate thousands" in rendered


# --- @TIME and @#N -------------------------------------------------------------------------------


@pytest.fixture
def late_rows(tmp_path) -> SmiCsvSource:
    """The example of docs/scenarios.md: each round's rows arrive a few ms after the second."""
    text = (
        "timestamp, index, utilization.gpu [%]\n"
        "2026/01/10 03:12:00.123, 0, 10 %\n"
        "2026/01/10 03:12:00.127, 1, 11 %\n"
        "2026/01/10 03:12:01.130, 0, 20 %\n"
        "2026/01/10 03:12:01.134, 1, 21 %\n"
        "2026/01/10 03:12:02.137, 0, 30 %\n"
        "2026/01/10 03:12:02.141, 1, 31 %\n"
    )
    path = tmp_path / "late.csv"
    path.write_text(text)
    return SmiCsvSource(path)


@pytest.mark.parametrize(
    ("at", "util", "shown"),
    [
        (0.0, 10, "sample 1 of 3 (line 2), taken 2026-01-10T03:12:00.123Z"),
        (1.0, 10, "sample 1 of 3 (line 2), taken 2026-01-10T03:12:00.123Z"),  # 1.130 is later
        (1.007, 20, "sample 2 of 3 (line 4), taken 2026-01-10T03:12:01.130Z"),
        (2.0, 20, "sample 2 of 3 (line 4), taken 2026-01-10T03:12:01.130Z"),
        (2.014, 30, "sample 3 of 3 (line 6), taken 2026-01-10T03:12:02.137Z"),
    ],
)
def test_at_time_shows_the_last_sample_taken_by_then(late_rows, at, util, shown):
    now = late_rows.start_time + at
    assert late_rows.snapshot(now).gpus[0].utilization_pct == util
    assert late_rows.position(now) == shown


def test_at_sample_offsets_are_the_rounds_own_times(late_rows):
    assert [late_rows.sample_offset(n) for n in (1, 2, 3)] == [0.0, 1.007, 2.014]
    assert late_rows.frame_at(late_rows.start_time + late_rows.sample_offset(2)).line == 4


def test_a_semicolon_in_a_quoted_name_does_not_change_the_files_delimiter():
    text = (
        "timestamp, index, name, utilization.gpu [%]\n"
        "2026/01/10 03:12:01.123, 0, NVIDIA A100-SXM4-80GB, 97 %\n"
        '2026/01/10 03:12:02.123, 0, "lab card; rev 2", 98 %\n'
    )
    frames = parse_smi_csv(text, file="quoted.csv")
    assert [(f.gpus[0].name, f.gpus[0].utilization_pct) for f in frames] == [
        ("NVIDIA A100-SXM4-80GB", 97),
        ("lab card; rev 2", 98),
    ]
