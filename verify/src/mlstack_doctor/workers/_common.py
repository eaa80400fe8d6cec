"""Shared by the worker scripts: run one check, print ONE result line the doctor parses.

Workers run with the interpreter under test, in their own process, so that a missing package, a
crash or a hang of the stack never takes the doctor down. This is the workers' only exception
boundary: whatever the stack raises is reported with its type and text, never swallowed.

A worker runs either once (`main`: the check's args in argv, one result line) or as the doctor's
long-lived session (w_session.py: one request per stdin line, one result line per request, each
carrying the request's id).
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from typing import Any

RESULT_MARKER = "@@MLSTACK_DOCTOR_RESULT@@"
PROGRESS_MARKER = "@@MLSTACK_DOCTOR_PROGRESS@@"

# What one check leaves for a later one in the same session (e.g. the warnings FLA printed at import).
STATE: dict[str, Any] = {}


def emit(data: dict[str, Any]) -> None:
    sys.stdout.flush()
    sys.stdout.write("\n" + RESULT_MARKER + json.dumps(data, default=str) + "\n")
    sys.stdout.flush()


def progress(text: str) -> None:
    """A progress line the doctor shows on its stderr (unless --quiet); never part of the result."""
    sys.stderr.write(PROGRESS_MARKER + text.replace("\n", " ") + "\n")
    sys.stderr.flush()


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def run_one(fn: Callable[[dict[str, Any]], dict[str, Any]], args: dict[str, Any]) -> dict[str, Any]:
    try:
        data = fn(args)
        data.setdefault("ok", True)
    except BaseException as exc:  # the worker's one boundary: report, never swallow
        data = {"ok": False, "error": error_text(exc), "traceback": traceback.format_exc()[-6000:]}
    return data


def main(fn: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    args = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    emit(run_one(fn, args))
