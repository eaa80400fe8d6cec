"""The shipped schema: in step with the code, and every report ever produced on the H200 validates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import SCHEMA, validate
from mlstack_doctor.diagnosis import CODES
from mlstack_doctor.engine import PROBES

H200 = sorted((Path(__file__).parent / "data" / "h200").glob("*.json"))


def test_schema_knows_every_code_and_probe() -> None:
    probe = SCHEMA["$defs"]["probe"]["properties"]
    assert probe["code"]["anyOf"][1]["enum"] == sorted(CODES)
    assert set(probe["name"]["enum"]) == {p.name for p in PROBES}


@pytest.mark.parametrize("path", H200, ids=[p.stem for p in H200])
def test_h200_reports_validate(path: Path) -> None:
    validate(json.loads(path.read_text()))


@pytest.mark.parametrize(
    "report,probe,code",
    [
        ("full_tiny_cold", "gdn_backward", "FLA_BACKWARD_NEEDS_TILELANG"),
        ("no_python_h", "python_headers", "NO_PYTHON_H"),
        ("no_python_h_triton", "triton_target", "NO_PYTHON_H"),
        ("stress_tiny", "autotune_stress", "AUTOTUNER_RACE"),
        ("cuda_hidden", "cuda_visible_devices", "CUDA_HIDDEN"),
        ("cache_ro", "triton_cache_dir", "TRITON_CACHE_UNWRITABLE"),
        ("no_cc", "c_compiler", "NO_C_COMPILER"),
    ],
)
def test_h200_fault_reports_name_the_cause(report: str, probe: str, code: str) -> None:
    doc = json.loads((Path(__file__).parent / "data" / "h200" / f"{report}.json").read_text())
    assert doc["summary"]["root_cause"]["code"] == code and doc["summary"]["root_cause"]["probe"] == probe
