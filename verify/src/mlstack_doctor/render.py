"""The report: one JSON object (schema/report.schema.json), and a table for people (rich when present)."""

from __future__ import annotations

import json
import platform
import socket
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from mlstack_doctor import SCHEMA_VERSION, __version__, hostenv
from mlstack_doctor.record import Result, Status

SCHEMA_PATH = Path(__file__).resolve().parent / "schema" / "report.schema.json"
MARK = {Status.PASS: "PASS", Status.FAIL: "FAIL", Status.WARN: "WARN", Status.SKIP: "skip"}
COLOR = {Status.PASS: "green", Status.FAIL: "bold red", Status.WARN: "yellow", Status.SKIP: "dim"}


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def host_info() -> dict[str, Any]:
    in_container, container_evidence = hostenv.container()
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "in_container": in_container,
        "container_evidence": container_evidence,
    }


def report(
    tier: str, options: dict[str, Any], started: str, results: list[Result], summary: dict[str, Any]
) -> dict:
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "mlstack-doctor", "version": __version__},
        "started": started,
        "finished": now(),
        "host": host_info(),
        "tier": tier,
        "options": options,
        "probes": [r.to_json() for r in results],
        "summary": summary,
    }


def _has_rich() -> bool:
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    return True


def _plain(results: list[Result], summary: dict[str, Any], out: TextIO) -> None:
    rows = [
        (
            MARK[r.status],
            r.stage.value,
            r.name,
            f"{r.duration_s:.1f}s" if r.duration_s >= 0.05 else "",
            (r.code or ""),
            r.summary,
        )
        for r in results
    ]
    widths = [
        max(len(str(row[i])) for row in [*rows, ("STATUS", "STAGE", "PROBE", "TIME", "CODE", "")])
        for i in range(5)
    ]
    head = ("STATUS", "STAGE", "PROBE", "TIME", "CODE", "DETAIL")
    out.write("  ".join(h.ljust(widths[i]) if i < 5 else h for i, h in enumerate(head)) + "\n")
    for row in rows:
        out.write("  ".join(str(c).ljust(widths[i]) if i < 5 else str(c) for i, c in enumerate(row)) + "\n")
    for r in results:
        if r.status in (Status.FAIL, Status.WARN) and r.fix:
            out.write(f"  {MARK[r.status]} {r.name}: fix: {r.fix}\n")
    bandwidth(results, out)
    _verdict(summary, out)


def bandwidth(results: list[Result], out: TextIO) -> None:
    """The NCCL tier's sweep, as nccl-tests prints it: size, time, algbw, busbw, and the floor."""
    r = next((r for r in results if r.name == "nccl_bandwidth" and r.evidence.get("busbw_table")), None)
    if r is None:
        return
    ev = r.evidence
    out.write(f"\nbus bandwidth ({ev['backend']}, {ev['ranks']} rank(s); floor for {ev['floor_for']}):\n")
    head = ("op", "size (B)", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "floor (GB/s)")
    rows = [
        (
            row["op"],
            str(row["bytes"]),
            f"{row['time_us']:.1f}",
            f"{row['algbw_gbs']:.3f}",
            f"{row['busbw_gbs']:.3f}",
            "-" if row["floor_gbs"] is None else f"{row['floor_gbs']:g}",
        )
        for row in ev["busbw_table"]
    ]
    widths = [max(len(x[i]) for x in [head, *rows]) for i in range(len(head))]
    for row in [head, *rows]:
        cells = (c.rjust(widths[i]) if i else c.ljust(widths[i]) for i, c in enumerate(row))
        out.write("  " + "  ".join(cells) + "\n")


def _consequences(cause: dict[str, Any], indent: str) -> str:
    """The failures that follow from `cause`, one line each (listed under it, not as causes)."""
    return "".join(
        f"{indent}  then {c['probe']} [{c['code']}]: {c['why']}\n" for c in cause.get("consequences") or []
    )


def _verdict(summary: dict[str, Any], out: TextIO) -> None:
    counts = (
        f"{summary['passed']} passed, {summary['failed']} failed, "
        f"{summary['warned']} warned, {summary['skipped']} skipped"
    )
    root = summary.get("root_cause")
    roots = summary.get("root_causes") or ([root] if root else [])
    if len(roots) > 1:  # failures that do not depend on each other: each with its own fix
        out.write(f"\n{len(roots)} INDEPENDENT ROOT CAUSES:\n")
        for i, r in enumerate(roots, 1):
            out.write(f"{i}. {r['probe']} [{r['code']}] {r['summary']}\n   FIX: {r['fix']}\n")
            out.write(_consequences(r, "   "))
        out.write(f"{counts}\n")
    elif root:
        out.write(
            f"\nROOT CAUSE: {root['probe']} [{root['code']}] {root['summary']}\n"
            f"FIX: {root['fix']}\n{_consequences(roots[0] if roots else root, '')}{counts}\n"
        )
    else:
        out.write(f"\nOK: the stack works ({counts})\n")


def table(results: list[Result], summary: dict[str, Any], out: TextIO, use_rich: bool | None = None) -> None:
    if use_rich is None:
        use_rich = _has_rich() and out.isatty()
    if not use_rich:
        _plain(results, summary, out)
        return
    from rich.console import Console
    from rich.table import Table

    console = Console(file=out)
    t = Table(show_lines=False)
    for col in ("status", "stage", "probe", "time", "code", "detail"):
        t.add_column(col, overflow="fold")
    for r in results:
        t.add_row(
            f"[{COLOR[r.status]}]{MARK[r.status]}[/]",
            r.stage.value,
            r.name,
            f"{r.duration_s:.1f}s" if r.duration_s >= 0.05 else "",
            r.code or "",
            r.summary,
        )
    console.print(t)
    for r in results:
        if r.status in (Status.FAIL, Status.WARN) and r.fix:
            console.print(f"  [{COLOR[r.status]}]{MARK[r.status]}[/] {r.name}: fix: {r.fix}", highlight=False)
    bandwidth(results, out)
    _verdict(summary, out)


def json_text(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, default=str) + "\n"


def write_json(doc: dict[str, Any], out: TextIO) -> None:
    out.write(json_text(doc))
