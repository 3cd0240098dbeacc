"""Sizes and rates as people read them, for every progress line and summary (the writer's bar and the commands
alike)."""
from __future__ import annotations


def decimal_size(n: float, unit: str = "B") -> str:
    """A size (or a size per second) in decimal units with three significant digits: 340 MB, 12.5 kB, 87 B
    (never "0 MB" for a small table)."""
    for prefix in ("", "k", "M", "G", "T"):
        if abs(n) < 999.5 or prefix == "T":
            return f"{n:.3g} {prefix}{unit}"
        n /= 1000
    raise AssertionError


def binary_size(n: float) -> str:
    """A size of memory in binary units with three significant digits: 1 B, 512 KiB, 1.5 GiB (whole MiB would
    say "0 MiB" of a budget of one byte, or of a few small chunks)."""
    for prefix in ("", "Ki", "Mi", "Gi", "Ti"):
        if abs(n) < 999.5:
            return f"{n:.3g} {prefix}B"
        n /= 1024
    return f"{n:,.0f} PiB"
