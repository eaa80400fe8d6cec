"""Running a command that writes a JSON report, and reading that report, in one round trip: the
doctor's runs (its table on stdout, its report in a file) cost one module run instead of two."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

Runner = Callable[[list[str]], tuple[int, str, str]]


def missing_command(argv: list[str]) -> str | None:
    """Why argv[0] cannot be started, where it is a path (a bare name is left to PATH)."""
    if not argv:
        return "no command given"
    if os.sep not in argv[0]:
        return None
    if not os.path.exists(argv[0]):
        return f"{argv[0]} is missing"
    if not os.access(argv[0], os.X_OK):
        return f"{argv[0]} is not executable"
    return None


def read_report(path: str) -> tuple[dict[str, Any] | None, str | None]:
    """The report as written, or None and why it cannot be used."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return None, f"{path} was not written"
    except (OSError, UnicodeDecodeError) as e:
        return None, f"{path} cannot be read: {getattr(e, 'strerror', None) or e}"
    try:
        report = json.loads(text)
    except ValueError as e:
        return None, f"{path} is not JSON: {e}"
    if not isinstance(report, dict):
        return None, f"{path} is not a report (a JSON object)"
    return report, None


def root_causes(report: dict[str, Any] | None) -> list[dict[str, Any]]:
    """A doctor report's root causes, one per independent failure: summary.root_causes, or the one
    summary.root_cause of a 1.0 report; [] where nothing failed (or no report)."""
    summary = (report or {}).get("summary") or {}
    causes = summary.get("root_causes") or ([summary["root_cause"]] if summary.get("root_cause") else [])
    return [c for c in causes if isinstance(c, dict)]


def not_run() -> dict[str, Any]:
    """run_and_read's fields for a command that was not run. No rc: Ansible fails a task whose rc is set and
    not 0."""
    return {
        "stdout": "",
        "stdout_lines": [],
        "stderr": "",
        "missing": None,
        "report": None,
        "report_error": "not run",
        "root_causes": [],
    }


def run_and_read(argv: list[str], report_path: str, run: Runner, read_on: tuple[int, ...]) -> dict[str, Any]:
    """rc, stdout and stderr as ansible.builtin.command returns them (one trailing newline dropped,
    stdout_lines), `missing` where the command cannot be started, and `report` (the parsed file) read
    when the command exited with one of `read_on` - else None, with `report_error` saying why; the
    report's `root_causes` (a doctor report's, [] for anything else)."""
    why = missing_command(argv)
    if why:
        return {**not_run(), "rc": 127, "stderr": why, "missing": why, "report_error": f"not run: {why}"}
    rc, out, err = run(argv)
    out, err = out.rstrip("\r\n"), err.rstrip("\r\n")
    result: dict[str, Any] = {
        "rc": rc,
        "stdout": out,
        "stdout_lines": out.splitlines(),
        "stderr": err,
        "stderr_lines": err.splitlines(),
        "missing": None,
    }
    if rc in read_on:
        result["report"], result["report_error"] = read_report(report_path)
    else:
        result["report"], result["report_error"] = None, f"not read: the command exited {rc}"
    result["root_causes"] = root_causes(result["report"])
    return result
