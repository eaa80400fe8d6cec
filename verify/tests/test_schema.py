"""The shipped schema: in step with the code, and every report ever produced on the H200 validates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from doctor_testlib import SCHEMA, validate
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
        ("stress_tiny_cold_shared", "autotune_stress", "AUTOTUNER_RACE"),
        ("cuda_hidden", "cuda_visible_devices", "CUDA_HIDDEN"),
        ("cache_ro", "triton_cache_dir", "TRITON_CACHE_UNWRITABLE"),
        ("no_cc", "c_compiler", "NO_C_COMPILER"),
    ],
)
def test_h200_fault_reports_name_the_cause(report: str, probe: str, code: str) -> None:
    doc = json.loads((Path(__file__).parent / "data" / "h200" / f"{report}.json").read_text())
    assert doc["summary"]["root_cause"]["code"] == code and doc["summary"]["root_cause"]["probe"] == probe


def _h200(name: str) -> dict:
    return json.loads((Path(__file__).parent / "data" / "h200" / f"{name}.json").read_text())


def _probe(doc: dict, name: str) -> dict:
    return next(p for p in doc["probes"] if p["name"] == name)


def test_h200_warm_step_cures_the_race() -> None:
    """On the H200, in this order: the stress tier on a cold cache races; the warm tier warms (forward;
    FLA refuses the backward); the stress tier on that cache passes; the warm tier again is skipped."""
    cold = _probe(_h200("stress_tiny_cold_shared"), "autotune_stress")
    assert cold["code"] == "AUTOTUNER_RACE" and cold["evidence"]["cache"]["state"] == "cold"
    assert len({e["thread"] for e in cold["evidence"]["cold"]["errors"]}) == 3
    assert "--tier warm" in cold["fix"] and cold["evidence"]["warm_cache_mitigation"] == "works"
    warm = _probe(_h200("warm_tiny"), "triton_warm")
    assert warm["evidence"]["action"] == "warmed" and warm["code"] == "FLA_BACKWARD_NEEDS_TILELANG"
    assert warm["status"] == "warn" and warm["evidence"]["autotune_files_new"] > 0
    warmed = _probe(_h200("stress_tiny_warmed"), "autotune_stress")
    assert warmed["evidence"]["cache"]["state"] == "warmed" and warmed["evidence"]["cold"]["errors"] == []
    assert warmed["status"] == "warn" and warmed["code"] == "FLA_BACKWARD_NEEDS_TILELANG"
    again = _probe(_h200("warm_tiny_again"), "triton_warm")
    assert again["evidence"]["action"] == "skipped" and again["evidence"]["key"] == warm["evidence"]["key"]
