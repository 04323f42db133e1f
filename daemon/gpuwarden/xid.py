"""What the common XID numbers mean and what NVIDIA recommends doing about them (after NVIDIA's
XID catalogue), for people reading an event. The one table: ``status``, notifications and the
kernel-log source all look XIDs up here."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Xid:
    meaning: str
    action: str


_APP = "usually the application: restart it"
_RESET = "reset the GPU (nvidia-smi -r, or reboot); report to NVIDIA if it recurs"

XIDS: dict[int, Xid] = {
    13: Xid(
        "graphics engine exception",
        f"{_APP}; if other applications hit it on this GPU too, run diagnostics (dcgmi diag)",
    ),
    31: Xid(
        "GPU memory page fault",
        f"{_APP} (an illegal memory access); if it recurs with other applications, "
        "check the driver and run diagnostics",
    ),
    32: Xid(
        "invalid or corrupted push buffer stream",
        "check the PCIe link and the driver; reset the GPU if it recurs",
    ),
    43: Xid("GPU stopped processing", f"{_APP}; the GPU itself needs no reset"),
    45: Xid(
        "preemptive cleanup after an earlier error",
        "look at the XID before it; on its own nothing to do (an application was stopped)",
    ),
    48: Xid(
        "double-bit ECC error",
        "drain the GPU and reset it, then check remapped rows or retired pages; "
        "replace it if errors recur",
    ),
    61: Xid("internal micro-controller warning", _RESET),
    62: Xid("internal micro-controller halt", _RESET),
    63: Xid(
        "ECC page retirement or row remapping recorded",
        "reset the GPU when it is idle to apply the remapping",
    ),
    64: Xid(
        "ECC page retirement or row remapping failed",
        "drain the GPU and reset it; if it persists, the GPU needs replacing",
    ),
    68: Xid("video processor exception", f"{_APP}; update the driver if it recurs"),
    74: Xid(
        "NVLink error",
        "check the links (nvidia-smi nvlink -s) and reset the GPUs on them; "
        "have the hardware checked if it recurs",
    ),
    79: Xid(
        "GPU has fallen off the bus",
        "drain the node and reboot it; check PCIe seating, power and cooling; "
        "replace the GPU if it recurs",
    ),
    92: Xid("high single-bit ECC error rate", "watch it; reset the GPU at a convenient time"),
    94: Xid(
        "contained ECC error",
        "restart the applications on this GPU; reset it when convenient",
    ),
    95: Xid(
        "uncontained ECC error",
        "every application on this GPU is affected: drain it and reset it",
    ),
    109: Xid("context switch timeout", f"{_APP}; run diagnostics if it recurs"),
    119: Xid("GSP RPC timeout", _RESET + "; update the driver"),
    120: Xid("GSP error", _RESET + "; update the driver"),
    154: Xid(
        "GPU recovery action changed",
        "do what the message names (GPU reset required, node reboot required)",
    ),
}
XID_MEANINGS: dict[int, str] = {number: xid.meaning for number, xid in XIDS.items()}
UNKNOWN = "see NVIDIA's XID catalogue"


def describe_xid(xid: int) -> str:
    """What an XID means, in a few words."""
    known = XIDS.get(xid)
    return known.meaning if known else UNKNOWN


def xid_action(xid: int) -> str | None:
    """What NVIDIA recommends doing about an XID; ``None`` for one the table does not know."""
    known = XIDS.get(xid)
    return known.action if known else None
