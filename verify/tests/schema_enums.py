"""The report schema's enumerations, generated from the tables that define them.

diagnosis.CODES (every `code`), engine.PROBES (a probe's `name`), record.Stage, record.Status and
engine.TIERS: the schema's copies of them are written from these, never by hand. test_schema.py fails
when the shipped schema differs from what this writes; after adding a code, a probe or a stage, run

  PYTHONPATH=verify/src python3 verify/tests/schema_enums.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))

from mlstack_doctor.diagnosis import CODES  # noqa: E402
from mlstack_doctor.engine import PROBES, TIERS  # noqa: E402
from mlstack_doctor.record import Stage, Status  # noqa: E402

SCHEMA = SRC / "mlstack_doctor" / "schema" / "report.schema.json"


def tables() -> dict[str, list[str]]:
    """A schema property's name -> the values its enum must hold, in the order the schema keeps."""
    return {
        "code": sorted(CODES),
        "stage": [s.value for s in Stage],
        "status": [s.value for s in Status],
        "tier": list(TIERS),
        "probe": [p.name for p in PROBES],
    }


def _table_of(path: list[str | int]) -> str | None:
    """The table an enum at `path` copies: the property it constrains (a probe's `name`: the probe table)."""
    props = [i for i, key in enumerate(path) if key == "properties" and i + 1 < len(path)]
    if not props:
        return None
    prop = path[props[-1] + 1]
    if prop == "name" and path[:2] == ["$defs", "probe"]:
        return "probe"
    return prop if isinstance(prop, str) and prop in tables() else None


def generate(schema: dict[str, Any]) -> tuple[dict[str, Any], dict[str, int]]:
    """(the schema with every enum of a table rewritten from it, how many enums each table filled)."""
    values, filled = tables(), dict.fromkeys(tables(), 0)

    def walk(node: Any, path: list[str | int]) -> Any:
        if isinstance(node, list):
            return [walk(v, [*path, i]) for i, v in enumerate(node)]
        if not isinstance(node, dict):
            return node
        out = {k: walk(v, [*path, k]) for k, v in node.items()}
        if "enum" in out and (table := _table_of(path)) is not None:
            out["enum"] = list(values[table])
            filled[table] += 1
        return out

    return walk(schema, []), filled


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def main() -> int:
    schema, filled = generate(json.loads(SCHEMA.read_text(encoding="utf-8")))
    SCHEMA.write_text(render(schema), encoding="utf-8")
    print(f"{SCHEMA}: " + ", ".join(f"{t} x{n}" for t, n in filled.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
