"""Readable numbers: FLOPs and bytes in engineering units (pure; the admins and the desk pages share it)."""

from __future__ import annotations

import math

PREFIXES = ["", "k", "M", "G", "T", "P", "E", "Z", "Y", "R", "Q"]
IEC = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"]


def engineering(value, unit: str = "") -> str:
    """1.0e25 -> '10 Y', 989.4e12 -> '989 T' (three significant digits)."""
    if value is None:
        return "-"
    value = float(value)
    if not math.isfinite(value):
        return f"{value} {unit}".strip()
    if value == 0:
        return f"0 {unit}".strip()
    power = min(max(math.floor(math.log10(abs(value)) / 3), 0), len(PREFIXES) - 1)
    scaled = value / 10 ** (3 * power)
    return f"{scaled:.3g} {PREFIXES[power]}{unit}".strip()


def flops(value) -> str:
    return engineering(value, "FLOP")


def flop_rate(value) -> str:
    return engineering(value, "FLOP/s")


def size_bytes(value) -> str:
    if value is None:
        return "-"
    value = float(value)
    power = 0
    while abs(value) >= 1024 and power < len(IEC) - 1:
        value /= 1024
        power += 1
    return f"{value:.3g} {IEC[power]}"
