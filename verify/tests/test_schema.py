"""The shipped schema: in step with the code, and every report ever produced on the H200 validates.

The recorded reports are only validated here: no doctor code runs on them, so the verdicts they hold are no
test of today's doctor. The verdicts are asserted from live runs (test_doctor_real.py, test_host_verdicts.py,
test_verdict_rules.py, test_gpu.py on a GPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import schema_enums
from doctor_testlib import SCHEMA, validate
from mlstack_doctor.diagnosis import CODES
from mlstack_doctor.engine import PROBES

H200 = sorted((Path(__file__).parent / "data" / "h200").glob("*.json"))


def test_schema_enums_are_the_tables() -> None:
    """Every enumeration of a code, probe, stage, status or tier is written from its one table (CODES,
    PROBES, Stage, Status, TIERS) by schema_enums.py; a copy kept by hand fails here."""
    generated, filled = schema_enums.generate(SCHEMA)
    assert filled == {"code": 4, "stage": 3, "status": 1, "tier": 1, "probe": 1}
    assert generated == SCHEMA, "run: PYTHONPATH=verify/src python3 verify/tests/schema_enums.py"
    probe = SCHEMA["$defs"]["probe"]["properties"]
    assert probe["code"]["anyOf"][1]["enum"] == sorted(CODES)
    assert probe["name"]["enum"] == [p.name for p in PROBES]


@pytest.mark.parametrize("path", H200, ids=[p.stem for p in H200])
def test_h200_reports_validate(path: Path) -> None:
    validate(json.loads(path.read_text()))
