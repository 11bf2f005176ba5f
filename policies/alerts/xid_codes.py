"""What the common XID codes mean, after NVIDIA's XID catalog (docs.nvidia.com, "XID Errors"),
in a few words each for alert summaries. A code not listed is named by its number alone."""

from __future__ import annotations

from types import MappingProxyType

XID_MEANINGS = MappingProxyType(
    {
        8: "GPU stopped processing (channel timeout)",
        13: "graphics engine exception",
        31: "GPU memory page fault",
        32: "invalid or corrupted push buffer stream",
        38: "driver firmware error",
        43: "GPU stopped processing",
        45: "preemptive cleanup after previous errors",
        46: "GPU stopped processing",
        48: "double-bit ECC error",
        61: "internal micro-controller breakpoint or warning",
        62: "internal micro-controller halt",
        63: "ECC page retirement or row remapping recorded",
        64: "ECC page retirement or row remapping failed",
        68: "video decoder exception",
        69: "graphics engine class error",
        74: "NVLink error",
        79: "GPU has fallen off the bus",
        92: "high single-bit ECC error rate",
        94: "contained ECC error",
        95: "uncontained ECC error",
        119: "GSP RPC timeout",
        120: "GSP error",
    }
)


def describe_xid(code: int | None) -> str:
    """``XID 79 (GPU has fallen off the bus)``; ``an XID error`` without a code."""
    if code is None:
        return "an XID error"
    meaning = XID_MEANINGS.get(code)
    return f"XID {code} ({meaning})" if meaning else f"XID {code}"
