"""Printing a benchmark's ratios against its targets (shared by the bench scripts)."""
from __future__ import annotations


def print_ratios(speed: dict[str, float], pairs: list[tuple[str, str, float | None]], title: str = "ratios") -> None:
    """For each (a, b, target): speed[a] / speed[b] (higher is faster), and whether it meets the target."""
    print(f"\n{title} (speed, higher is faster):")
    for a, b, target in pairs:
        ratio = speed[a] / speed[b]
        goal = f"  (target >= {target}x: {'met' if ratio >= target else 'NOT met'})" if target else ""
        print(f"  {a} / {b}: {ratio:.2f}x{goal}")
