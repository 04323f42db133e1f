"""``gpuwarden status``: a Snapshot as a table for people or as one JSON object for programs.

Process names and command lines are attacker-controlled: every string from a process goes
through ``text.safe_text`` before it reaches a terminal.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gpuwarden.model import Event, GpuProcess, GpuState, Snapshot
from gpuwarden.text import iso, safe_text
from gpuwarden.units import format_duration
from gpuwarden.xid import describe_xid, xid_action

JSON_VERSION = 1


# -- JSON ---------------------------------------------------------------------------------------


def _fields(value: Any) -> dict[str, Any] | None:
    """A sub-record (ECC counters, remapped rows, retired pages) as JSON, or null."""
    return None if value is None else dataclasses.asdict(value)


def gpu_dict(gpu: GpuState) -> dict[str, Any]:
    m = gpu.memory
    return {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "name": gpu.name,
        "pci_bus_id": gpu.pci_bus_id,
        "lost": gpu.lost,
        "error": gpu.error,
        "memory": {
            "used_mib": m.used_mib,
            "total_mib": m.total_mib,
            "free_mib": m.free_mib,
            "reserved_mib": m.reserved_mib,
            "used_pct": None if m.used_pct is None else round(m.used_pct, 2),
        },
        "utilization_pct": gpu.utilization_pct,
        "memory_utilization_pct": gpu.memory_utilization_pct,
        "temperature_c": gpu.temperature_c,
        "power_w": gpu.power_w,
        "power_limit_w": gpu.power_limit_w,
        "throttle": None if gpu.throttle is None else list(gpu.throttle),
        "ecc": _fields(gpu.ecc),
        "remapped_rows": _fields(gpu.remapped_rows),
        "retired_pages": _fields(gpu.retired_pages),
        "pstate": gpu.pstate,
        "mig_mode": gpu.mig_mode,
        "sm_clock_mhz": gpu.sm_clock_mhz,
        "memory_clock_mhz": gpu.memory_clock_mhz,
        "energy_mj": gpu.energy_mj,
    }


def process_dict(proc: GpuProcess, now: float) -> dict[str, Any]:
    info = proc.info
    age = proc.age_s(now)
    return {
        "pid": proc.pid,
        "gpu": proc.gpu,
        "gpu_memory_mib": proc.gpu_memory_mib,
        "sm_util_pct": proc.sm_util_pct,
        "user": info.user,
        "uid": info.uid,
        "name": info.name,
        "cmdline": None if info.cmdline is None else list(info.cmdline),
        "exe": info.exe,
        "priority": info.priority,
        "declared_priority": info.declared_priority,
        "checkpoint_signal": info.checkpoint_signal,
        "status": info.status,
        "zombie": info.zombie,
        "orphaned": info.orphaned,
        "nice": info.nice,
        "cpu_pct": info.cpu_pct,
        "rss_mib": info.rss_mib,
        "age_s": None if age is None else round(age, 1),
        "container": info.container,
        "pod": info.pod,
        "slurm_job": info.slurm_job,
        "systemd_unit": info.systemd_unit,
        "cgroup_trusted": info.cgroup_trusted,
        "kind": proc.kind,
        "access_denied": list(info.access_denied),
    }


def event_dict(event: Event) -> dict[str, Any]:
    return {
        "time": iso(event.time),
        "kind": str(event.kind),
        "gpu": event.gpu,
        "xid": event.xid,
        "detail": event.detail or (describe_xid(event.xid) if event.xid is not None else ""),
        "action": None if event.xid is None else xid_action(event.xid),
    }


def snapshot_dict(snap: Snapshot) -> dict[str, Any]:
    """The documented ``status --json`` shape (README, "status --json")."""
    return {
        "version": JSON_VERSION,
        "host": snap.host,
        "time": iso(snap.time),
        "source": snap.source,
        "processes_visible": snap.processes_visible,
        "gpus": [gpu_dict(g) for g in snap.gpus],
        "processes": [process_dict(p, snap.time) for p in snap.processes],
        "events": [event_dict(e) for e in snap.events],
    }


# -- table --------------------------------------------------------------------------------------

_COLOURS = {"red": "31", "yellow": "33", "green": "32", "cyan": "36", "dim": "2", "bold": "1"}


class _Paint:
    def __init__(self, colour: bool) -> None:
        self.colour = colour

    def __call__(self, text: str, style: str) -> str:
        if not self.colour or not text:
            return text
        return f"\x1b[{_COLOURS[style]}m{text}\x1b[0m"


def _bar(fraction: float, width: int) -> str:
    filled = max(0, min(width, round(fraction * width)))
    return "█" * filled + "░" * (width - filled)


def _num(value: float | int | None, unit: str = "", fmt: str = "{:.0f}") -> str:
    return "n/a" if value is None else fmt.format(value) + unit


def _level(pct: float | None, warn: float, crit: float) -> str:
    if pct is None:
        return "dim"
    return "red" if pct >= crit else "yellow" if pct >= warn else "green"


def _gpu_lines(gpu: GpuState, paint: _Paint, width: int) -> list[str]:
    name = safe_text(gpu.name or "unknown GPU").removeprefix("NVIDIA ")
    head = f"[{gpu.index}] {name}"
    if gpu.lost:
        return [
            f"{paint(head, 'bold')}  {paint('LOST', 'red')}: {safe_text(gpu.error or 'unreadable')}"
        ]
    temp = _num(gpu.temperature_c, "°C")
    power = f"{_num(gpu.power_w)}/{_num(gpu.power_limit_w)} W"
    util = f"util {_num(gpu.utilization_pct, '%'):>4}"
    pstate = "" if gpu.pstate is None else f"  P{gpu.pstate}"
    first = (
        f"{paint(head, 'bold'):<{len(head)}}  "
        f"{paint(temp, _level(gpu.temperature_c, 80, 88))}  {power}  "
        f"{paint(util, _level(gpu.utilization_pct, 101, 101))}{pstate}"
    )
    m = gpu.memory
    pct = m.used_pct
    bar_width = max(10, min(30, width - 46))
    bar = _bar((pct or 0.0) / 100, bar_width) if pct is not None else "?" * bar_width
    used = f"{_num(m.used_mib)} / {_num(m.total_mib)} MiB"
    second = (
        f"    mem {paint(bar, _level(pct, 80, 95))}  {used}  "
        f"{paint(_num(pct, '%'), _level(pct, 80, 95))}"
    )
    lines = [first, second]
    alerts: list[str] = []
    if gpu.throttle:
        relevant = [t for t in gpu.throttle if t != "gpu_idle"]
        if relevant:
            alerts.append("throttle: " + ", ".join(relevant))
    if gpu.ecc and (gpu.ecc.volatile_uncorrected or 0) > 0:
        alerts.append(f"ecc: {gpu.ecc.volatile_uncorrected} uncorrected")
    rr = gpu.remapped_rows
    if rr and (rr.uncorrectable or rr.pending or rr.failure):
        alerts.append(
            f"remapped rows: {rr.uncorrectable} uncorrectable"
            + (", pending" if rr.pending else "")
            + (", FAILED" if rr.failure else "")
        )
    rp = gpu.retired_pages
    if rp and (rp.double_bit or rp.pending):
        alerts.append(
            f"retired pages: {rp.double_bit} double-bit" + (", pending" if rp.pending else "")
        )
    if alerts:
        lines.append("    " + paint("! " + "  ! ".join(alerts), "yellow"))
    return lines


def _job_labels(proc: GpuProcess) -> list[str]:
    info = proc.info
    labels = []
    if info.slurm_job:
        labels.append(f"slurm job {info.slurm_job}")
    if info.pod:
        labels.append(f"pod {info.pod}")
    if info.container:
        labels.append(f"container {info.container[:12]}")
    if info.systemd_unit:
        own = "" if info.cgroup_trusted else " (a cgroup its owner made)"
        labels.append(f"unit {info.systemd_unit}{own}")
    if info.checkpoint_signal:
        labels.append(f"checkpoints on {info.checkpoint_signal}")
    return labels


_HEADER = f"  {'PID':<7} {'USER':<8} {'PRIORITY':<9} {'GPU MiB':>7} {'SM':>4} {'AGE':>6}  COMMAND"


def _fit(text: str, room: int) -> str:
    return text if len(text) <= room else text[: max(1, room - 1)] + "…"


def _process_lines(proc: GpuProcess, now: float, paint: _Paint, width: int) -> list[str]:
    info = proc.info
    markers: list[str] = []
    if info.orphaned:
        markers.append(paint("[orphaned: no such process]", "red"))
    if info.zombie:
        markers.append(paint("[zombie]", "red"))
    if info.status == "stopped":
        markers.append(paint("[stopped]", "yellow"))
    if proc.sm_util_pct == 0:
        markers.append(paint("[idle]", "yellow"))
    user = _fit(safe_text(info.user or "?"), 8)
    age = proc.age_s(now)
    age_text = "?" if age is None else format_duration(age)
    prefix = (
        f"  {proc.pid:<7} {user:<8} {info.priority[:9]:<9} "
        f"{_num(proc.gpu_memory_mib):>7} {_num(proc.sm_util_pct, '%'):>4} {age_text:>6}  "
    )
    command = "" if info.orphaned else safe_text(info.command)
    line = (prefix + " ".join(markers) + (" " if markers else "")).rstrip(" ") + " "
    visible = len(prefix) + sum(len(m) for m in markers) + len(markers)
    if not paint.colour:
        visible = len(line)
    lines = [(line + _fit(command, max(10, width - visible))).rstrip()]
    labels = _job_labels(proc)
    if labels:
        lines.append(
            paint(_fit("  " + " " * 8 + "↳ " + safe_text(" · ".join(labels)), width), "dim")
        )
    return lines


def render_table(snap: Snapshot, *, width: int = 80, colour: bool = False) -> str:
    paint = _Paint(colour)
    host = _fit(safe_text(snap.host), 30)
    source = _fit(safe_text(snap.source), max(10, width - len(host) - 24))
    lines = [f"{paint(host, 'bold')}  {iso(snap.time)}  {paint(source, 'dim')}"]
    for gpu in snap.gpus:
        lines.append("")
        lines.extend(_gpu_lines(gpu, paint, width))
        procs = snap.processes_on(gpu.index)
        if procs:
            lines.append(paint(_HEADER, "dim"))
            for proc in sorted(procs, key=lambda p: -(p.gpu_memory_mib or 0)):
                lines.extend(_process_lines(proc, snap.time, paint, width))
        elif not gpu.lost and snap.processes_visible:
            lines.append(paint("  no processes", "dim"))
    if not snap.processes_visible:
        lines.append("")
        lines.append(paint("processes: not recorded by this source", "dim"))
    if snap.events:
        lines.append("")
        lines.append(paint("events", "bold"))
        for event in snap.events:
            where = f"GPU {event.gpu}" if event.gpu is not None else "host"
            what = str(event.kind).upper()
            if event.xid is not None:
                what = f"XID {event.xid} ({describe_xid(event.xid)})"
            detail = f": {safe_text(event.detail)}" if event.detail else ""
            lines.append(f"  {iso(event.time)}  {where}  {paint(what, 'red')}{detail}")
            action = None if event.xid is None else xid_action(event.xid)
            if action:
                lines.append(paint(f"      → {action}", "dim"))
    return "\n".join(lines)
