"""Every fix is checked against what the doctor saw before it reaches the report.

Probes build fixes from templates; a template can be wrong for the case at hand (point at the very
setting that failed, or at a folder on the same read-only disk). `vet` runs on every failed or warned
result (engine.run) and replaces a fix that contradicts the evidence with one that says what the
doctor could not determine, instead of a guess.

Paths the doctor tried are kept in ctx.facts["paths"]: {path: "writable" | "<why not>"}.
"""

from __future__ import annotations

import os
import re
from typing import Any

from mlstack_doctor.record import Result, Status

# `export NAME=VALUE` (also `NAME=VALUE cmd`): VALUE up to whitespace, `;`, `)` or a closing quote.
_ASSIGN = re.compile(r"(?:export\s+)?\b([A-Z][A-Z0-9_]*)=([^\s;)'\"]+)")
# Variables whose value is a folder the program writes into.
_WRITE_DIR = re.compile(r"(_DIR|_HOME|^TMPDIR)$")


def note_path(facts: dict[str, Any], path: str, why_not: str | None) -> None:
    """Record that `path` was tried: writable when `why_not` is None."""
    facts.setdefault("paths", {})[os.path.abspath(path)] = why_not or "writable"


def _expand(value: str) -> str:
    return os.path.abspath(os.path.expanduser(os.path.expandvars(value)))


def _verdict(facts: dict[str, Any], path: str) -> str | None:
    """What the doctor knows of `path`: 'writable', a reason it is not, or None (never tried).

    A path below a tried folder inherits the folder's verdict (a file under a read-only folder is
    not writable either; under a writable one it can be created).
    """
    paths: dict[str, str] = facts.get("paths") or {}
    best: tuple[int, str] | None = None
    for tried, verdict in paths.items():
        if path == tried or path.startswith(tried.rstrip("/") + "/"):
            if best is None or len(tried) > best[0]:
                best = (len(tried), verdict)
    return best[1] if best else None


def problems(fix: str, facts: dict[str, Any]) -> list[str]:
    """Why `fix` must not be printed (empty when it may): it sets a variable to the value it already
    has (the failing one), or points a write folder at a path the doctor did not find writable."""
    found: list[str] = []
    for name, value in _ASSIGN.findall(fix):
        if "<" in value or value.startswith("$("):  # a placeholder or a command: nothing to check
            continue
        target = _expand(value) if _WRITE_DIR.search(name) else value
        if name in os.environ and (
            os.environ[name] == value or (_WRITE_DIR.search(name) and _expand(os.environ[name]) == target)
        ):
            found.append(f"{name} already is {os.environ[name]}")
        if _WRITE_DIR.search(name):
            verdict = _verdict(facts, target)
            if verdict is None:
                found.append(f"the doctor did not try {target}")
            elif verdict != "writable":
                found.append(f"{target} is not usable: {verdict}")
    return found


def vet(result: Result, facts: dict[str, Any]) -> Result:
    """`result` with its fix replaced when the evidence contradicts it; the old fix kept as evidence."""
    if result.status not in (Status.FAIL, Status.WARN) or not result.fix:
        return result
    why = problems(result.fix, facts)
    if not why:
        return result
    result.evidence["rejected_fix"] = {"fix": result.fix, "why": why}
    tried = {p: v for p, v in (facts.get("paths") or {}).items() if v != "writable"}
    seen = "; ".join(f"{p}: {v}" for p, v in tried.items()) or "none tried"
    result.fix = (
        f"the doctor could not determine a working fix ({'; '.join(why)}); unusable paths found: {seen}. "
        "Point the failing setting at a folder you can write to and rerun the doctor"
    )
    return result
