"""The testbed reads what its nodes and containers state (the kernel module's version, libcuda in the
linker cache) with the doctor's own parsers, mlstack_doctor.facts, and takes nothing else of the doctor
but the probe list gpu-passthrough-check passes to it: the stand-in node and the passthrough proof stay
as small as the standard library and these facts. Imports are read from the source (ast)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[3] / "testbed" / "mlstack_testbed"
# Beyond the facts: gpucheck's run reads the doctor's probe table for `--only`.
OTHER_DOCTOR_IMPORTS = {("gpucheck/run.py", "mlstack_doctor")}


def doctor_imports() -> set[tuple[str, str]]:
    """(testbed module, doctor module it imports) for every import of the doctor in the package."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        where = str(path.relative_to(PACKAGE))
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom) and node.module and not node.level
                else []
            )
            found |= {(where, n) for n in names if n == "mlstack_doctor" or n.startswith("mlstack_doctor.")}
    return found


def test_the_testbed_takes_the_doctors_facts_only() -> None:
    found = doctor_imports()
    assert {
        ("node/nvdriver.py", "mlstack_doctor.facts"),
        ("gpucheck/host.py", "mlstack_doctor.facts"),
    } <= found
    other = {f for f in found if not f[1].startswith("mlstack_doctor.facts")}
    assert other == OTHER_DOCTOR_IMPORTS, sorted(other)
