"""Hardware table: peak dense bf16 compute, HBM bandwidth, memory (docs/design.md)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Hardware:
    name: str
    peak_flops: float  # FLOP/s, dense bf16
    mem_bandwidth: float  # bytes/s
    mem_bytes: float  # device memory
    interconnect_bw: float = 300e9  # bytes/s per direction (NVLink); used for TP all-reduce


_TABLE: dict[str, Hardware] = {
    "a100": Hardware("a100", 312e12, 2.0e12, 80e9, 300e9),
    "h100": Hardware("h100", 989e12, 3.35e12, 80e9, 450e9),
    "h200": Hardware("h200", 989e12, 4.8e12, 141e9, 450e9),
}
_ALIASES = {"a100-80g": "a100", "a100-80gb": "a100", "h100-sxm": "h100", "h200-sxm": "h200"}


def register_hardware(hw: Hardware) -> None:
    """Add a measured entry (e.g. ``cpu``, filled in by ``sloserve profile``)."""
    _TABLE[hw.name] = hw


def hardware_names() -> list[str]:
    return sorted(_TABLE) + sorted(_ALIASES)


def get_hardware(name: str) -> Hardware:
    key = _ALIASES.get(name.lower(), name.lower())
    try:
        return _TABLE[key]
    except KeyError:
        raise ValueError(
            f"gpu: unknown hardware {name!r}; choose one of {hardware_names()}"
        ) from None
