"""What the common NVIDIA Xid codes mean (from NVIDIA's Xid catalogue).

The meaning becomes the ``meaning`` label of ``gpu_xid_errors_total`` so an
alert or a person reading a dashboard does not need the catalogue at hand.
"""

from __future__ import annotations

__all__ = ["XID_MEANINGS", "xid_meaning"]

XID_MEANINGS: dict[int, str] = {
    8: "GPU stopped processing",
    13: "Graphics engine exception",
    31: "GPU memory page fault",
    32: "Invalid or corrupted push buffer stream",
    38: "Driver firmware error",
    43: "GPU stopped processing (channel reset)",
    45: "Preemptive cleanup, due to previous errors",
    48: "Double bit ECC error",
    61: "Internal micro-controller breakpoint/warning",
    62: "Internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failure",
    68: "NVDEC0 exception",
    69: "Graphics engine class error",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    109: "Context switch timeout",
    119: "GSP RPC timeout",
    120: "GSP error",
    121: "C2C link corrected error",
}


def xid_meaning(code: int) -> str:
    """The meaning of an Xid code, or ``unknown`` for codes outside the table."""
    return XID_MEANINGS.get(code, "unknown")
