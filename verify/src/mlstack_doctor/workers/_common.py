"""Shared by the worker scripts: run one check, print ONE result line the doctor parses.

Workers run with the interpreter under test, in their own process, so that a missing package, a
crash or a hang of the stack never takes the doctor down. This is the workers' only exception
boundary: whatever the stack raises is reported with its type and text, never swallowed.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from typing import Any

RESULT_MARKER = "@@MLSTACK_DOCTOR_RESULT@@"


def emit(data: dict[str, Any]) -> None:
    sys.stdout.flush()
    sys.stdout.write("\n" + RESULT_MARKER + json.dumps(data, default=str) + "\n")
    sys.stdout.flush()


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def main(fn: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    args = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    try:
        data = fn(args)
        data.setdefault("ok", True)
    except BaseException as exc:
        data = {"ok": False, "error": error_text(exc), "traceback": traceback.format_exc()[-6000:]}
    emit(data)
