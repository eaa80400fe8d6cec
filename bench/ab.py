"""What the one-run A/B benchmarks share: their arguments (--rounds, --json), the CPU of finished child
processes, sides measured in turn (the order alternating each round) with each side's median, and the
figures written as JSON."""

from __future__ import annotations

import argparse
import json
import resource
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

# (CPU seconds, wall seconds) of one measurement.
Figure = tuple[float, float]


def arguments(doc: str, rounds: int) -> argparse.Namespace:
    """--rounds N (default `rounds`) and --json FILE; the description is the docstring's first paragraph."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--json", type=Path, help="every round's figures and the medians, per side")
    return ap.parse_args()


def children_cpu() -> float:
    """CPU seconds, user and kernel, of the finished child processes so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def alternate(
    sides: Sequence[str], rounds: int, measure: Callable[[str], Figure]
) -> tuple[dict[str, list[Figure]], dict[str, Figure]]:
    """Each round measures every side, the order reversed every other round; prints each figure and each
    side's medians. Returns every round's figures and the medians, per side."""
    results: dict[str, list[Figure]] = {s: [] for s in sides}
    width = max(len(s) for s in sides)
    for i in range(rounds):
        for side in list(sides) if i % 2 == 0 else list(reversed(sides)):
            cpu, wall = measure(side)
            results[side].append((cpu, wall))
            print(f"round {i + 1} {side:{width}s} {cpu:6.2f} CPU-s, {wall:6.2f} s", flush=True)
    med = {
        s: (statistics.median(c for c, _ in r), statistics.median(w for _, w in r))
        for s, r in results.items()
    }
    for side, (cpu, wall) in med.items():
        print(f"median  {side:{width}s} {cpu:6.2f} CPU-s, {wall:6.2f} s")
    return results, med


def save(path: Path | None, results: dict[str, list[Figure]], med: dict[str, Figure]) -> None:
    """Every round's figures and the medians as JSON, where --json names a file."""
    if path:
        path.write_text(json.dumps({"rounds": results, "median": med}, indent=2) + "\n")
