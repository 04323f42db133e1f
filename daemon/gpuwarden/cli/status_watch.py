"""``gpuwarden status --watch``: the status table redrawn in place, made to fit the terminal.

Each refresh is one screen: never more lines than the terminal has (less one, so the header
never scrolls away) and no line wider than it. The full table is shown when it fits; when it
does not (eight GPUs in 80x24), or with ``--compact``, each GPU is one line, gpustat-style::

    gpu-node-21  2026-04-02T03:15:04Z  scenario:…
    [0] H100 80GB HBM3   62°C  540/700 W  95% │ 71700/81559 MiB  88% │ frank 71200M
    [5] H100 80GB HBM3   LOST: GPU has fallen off the bus

Events (XID errors, ECC, a lost GPU) stay on screen for ``events_for`` seconds after they
happened, by the snapshot's clock (a replay's own time), not for one refresh only.
"""

from __future__ import annotations

import dataclasses

from gpuwarden.cli.status_view import _level, _num, _Paint, render_table
from gpuwarden.model import Event, GpuState, Snapshot
from gpuwarden.text import fit, iso, safe_text
from gpuwarden.xid import describe_xid

DEFAULT_EVENTS_FOR = 600.0


class Watch:
    """What one ``--watch`` session remembers between refreshes: the events still shown."""

    def __init__(self, *, events_for: float = DEFAULT_EVENTS_FOR, compact: bool = False) -> None:
        self.events_for = events_for
        self.compact = compact
        self._events: dict[tuple[object, ...], Event] = {}

    def remember(self, snap: Snapshot) -> tuple[Event, ...]:
        """This snapshot's events and the earlier ones still inside the window, oldest first."""
        for event in snap.events:
            self._events[(event.time, event.kind, event.gpu, event.xid, event.detail)] = event
        horizon = snap.time - self.events_for
        self._events = {k: e for k, e in self._events.items() if e.time >= horizon}
        return tuple(sorted(self._events.values(), key=lambda e: e.time))

    def frame(
        self,
        snap: Snapshot,
        *,
        width: int,
        height: int,
        colour: bool = False,
        note: str | None = None,
        below: list[str] | None = None,
    ) -> str:
        """One screen for a terminal of ``width`` x ``height``; ``note`` (which sample of a log
        this is) goes under the header, ``below`` (the open incidents) under the GPUs, cut to
        the room the GPUs leave."""
        shown = dataclasses.replace(snap, events=self.remember(snap))
        room = max(1, height - 1)  # the cursor's line after the last one
        extra = [note] if note else []
        block = ["", *below] if below else []
        if not self.compact:
            full = _noted(render_table(shown, width=width, colour=colour).splitlines(), extra)
            if len(full) + len(block) <= room:
                return "\n".join(fit(line, width) for line in full + block)
        # The header and one line per GPU come first; the incidents get what is left.
        block = _cut(block, room - len(extra) - 1 - len(shown.gpus))
        height = max(1, room - len(extra) - len(block))
        lines = compact_lines(shown, width=width, height=height, colour=colour)
        return "\n".join(fit(line, width) for line in _noted(lines, extra) + block)


def _cut(block: list[str], room: int) -> list[str]:
    """``block`` (a blank line, a title, then lines) in at most ``room`` lines."""
    if len(block) <= room:
        return block
    if room < 3:
        return []
    return [*block[: room - 1], f"  … {len(block) - (room - 1)} more lines (a taller terminal)"]


def _noted(lines: list[str], extra: list[str]) -> list[str]:
    """``extra`` lines under the first one (the header)."""
    return lines[:1] + extra + lines[1:]


def compact_lines(snap: Snapshot, *, width: int, height: int, colour: bool = False) -> list[str]:
    """The header, one line per GPU, then the events that fit; at most ``height`` lines."""
    paint = _Paint(colour)
    head = f"{paint(safe_text(snap.host), 'bold')}  {iso(snap.time)}  "
    head += paint(safe_text(snap.source), "dim")
    gpus = [_gpu_line(g, snap, paint) for g in snap.gpus]
    events = [_event_line(e, paint) for e in snap.events]
    room = height - 1
    if len(gpus) > room:  # not even the GPUs fit: say how many are not shown
        more = len(gpus) - (room - 1)
        return [head, *gpus[: room - 1], paint(f"… {more} more GPUs (a taller terminal)", "dim")]
    lines = [head, *gpus]
    left = height - len(lines)
    if events and left >= 2:
        title = "events" if len(events) <= left - 1 else f"events (last {left - 1})"
        lines.append(paint(title, "bold"))
        lines.extend(events[-(left - 1) :])
    elif not snap.processes_visible and left >= 1:
        lines.append(paint("processes: not recorded by this source", "dim"))
    return lines


def _gpu_line(gpu: GpuState, snap: Snapshot, paint: _Paint) -> str:
    name = safe_text(gpu.name or "unknown GPU").removeprefix("NVIDIA ")
    head = f"[{gpu.index}] {name[:16]:<16}"
    if gpu.lost:
        return f"{paint(head, 'bold')} {paint('LOST', 'red')}: {safe_text(gpu.error or '?')}"
    temp = paint(f"{_num(gpu.temperature_c, '°C'):>4}", _level(gpu.temperature_c, 80, 88))
    power = f"{_num(gpu.power_w)}/{_num(gpu.power_limit_w)} W"
    util = f"{_num(gpu.utilization_pct, '%'):>4}"
    m = gpu.memory
    pct = m.used_pct
    memory = paint(
        f"{_num(m.used_mib)}/{_num(m.total_mib)} MiB {_num(pct, '%'):>4}", _level(pct, 80, 95)
    )
    line = f"{paint(head, 'bold')} {temp} {power:>11} {util} │ {memory}"
    if gpu.throttle and any(t != "gpu_idle" for t in gpu.throttle):
        line += " " + paint("!throttle", "yellow")
    procs = sorted(snap.processes_on(gpu.index), key=lambda p: -(p.gpu_memory_mib or 0))
    if procs:
        top = procs[0]
        who = safe_text(top.info.user or "?")[:10]
        line += f" │ {who} {_num(top.gpu_memory_mib)}M"
        if len(procs) > 1:
            line += f" +{len(procs) - 1}"
    elif snap.processes_visible:
        line += " │ " + paint("idle", "dim")
    return line


def _event_line(event: Event, paint: _Paint) -> str:
    where = f"GPU {event.gpu}" if event.gpu is not None else "host"
    what = str(event.kind).upper()
    if event.xid is not None:
        what = f"XID {event.xid} ({describe_xid(event.xid)})"
    detail = f": {safe_text(event.detail)}" if event.detail else ""
    return f"  {iso(event.time)[11:19]}  {where}  {paint(what, 'red')}{detail}"
