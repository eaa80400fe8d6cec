"""--reuse-passed: which earlier reports may stand for a rerun, what the stack fingerprint notices, and
how carried verdicts are marked. The real rerun (a provisioned container, torch installed) is in
tests/provision/test_lifecycle.py."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from doctor_testlib import validate
from mlstack_doctor import SCHEMA_VERSION, render, reuse
from mlstack_doctor.record import Result, Stage, Status

OPTIONS: dict[str, Any] = {"tier": "full", "model": "tiny", "expect_gpu": False, "profile": None}


def report(
    tmp_path: Path, fp: str, *, tier: str = "full", ok: bool = True, started: datetime | None = None
) -> str:
    when = (started or datetime.now(UTC)).isoformat(timespec="seconds")
    doc = {
        "tier": tier,
        "started": when,
        "fingerprint": fp,
        "summary": {"ok": ok},
        "probes": [
            {"name": "nvidia_device_nodes", "stage": "host", "status": "skip", "summary": "no GPU expected"},
            {
                "name": "torch_cuda",
                "stage": "torch",
                "status": "pass",
                "summary": "cuda ok",
                "evidence": {"n": 1},
            },
            {"name": "model_forward", "stage": "model", "status": "pass", "summary": "finite logits"},
        ],
    }
    path = tmp_path / "report.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_the_fingerprint_is_stable_and_sees_what_steers_the_probes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = tmp_path / "uv.lock"
    lock.write_text("version = 1\n")
    opts = {**OPTIONS, "profile": str(lock)}
    base = reuse.fingerprint(opts)
    assert reuse.fingerprint(dict(opts)) == base
    assert reuse.fingerprint({**opts, "tokens": 4096}) != base
    monkeypatch.setenv("CC", "/usr/bin/clang")
    assert reuse.fingerprint(opts) != base
    monkeypatch.delenv("CC")
    lock.write_text("version = 1\n# relocked\n")
    assert reuse.fingerprint(opts) != base


def test_the_fingerprint_sees_a_changed_doctor_of_the_same_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upgraded collection installs a doctor whose probes changed but whose version did not: its first
    run must not carry the older doctor's verdicts. Bytecode the imports leave is not the doctor."""
    doctor = tmp_path / "mlstack_doctor"
    shutil.copytree(reuse.DOCTOR_DIR, doctor, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(reuse, "DOCTOR_DIR", doctor)
    base = reuse.fingerprint(OPTIONS)
    (doctor / "probes" / "__pycache__").mkdir()
    (doctor / "probes" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"compiled")
    assert reuse.fingerprint(OPTIONS) == base
    probe = doctor / "probes" / "model.py"
    probe.write_text(probe.read_text() + "\n# a changed probe\n")
    assert reuse.fingerprint(OPTIONS) != base


def test_the_fingerprint_sees_the_model_files(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    opts = {**OPTIONS, "model": str(model)}
    before = reuse.fingerprint(opts)
    (model / "model-00001-of-00002.safetensors").write_bytes(b"x")
    assert reuse.fingerprint(opts) != before


def test_a_passed_report_of_the_same_tier_and_stack_is_reused(tmp_path: Path) -> None:
    assert reuse.reusable(report(tmp_path, "fp"), "full", "fp", 24) is not None


@pytest.mark.parametrize(
    ("kwargs", "tier", "fp", "why"),
    [
        ({"ok": False}, "full", "fp", "it failed"),
        ({"tier": "quick"}, "full", "fp", "another tier"),
        ({}, "full", "other", "another stack"),
        ({"started": datetime.now(UTC) - timedelta(hours=25)}, "full", "fp", "too old"),
        ({"tier": "stress"}, "stress", "fp", "stress always runs"),
    ],
)
def test_reports_that_cannot_stand_for_a_rerun(
    tmp_path: Path, kwargs: dict[str, Any], tier: str, fp: str, why: str
) -> None:
    assert reuse.reusable(report(tmp_path, "fp", **kwargs), tier, fp, 24) is None, why


def test_no_report_or_an_unreadable_one_means_a_full_run(tmp_path: Path) -> None:
    assert reuse.reusable(str(tmp_path / "absent.json"), "full", "fp", 24) is None
    (tmp_path / "torn.json").write_text('{"tier": "fu')
    assert reuse.reusable(str(tmp_path / "torn.json"), "full", "fp", 24) is None


def test_a_chain_of_reuses_ages_from_the_run_that_really_ran(tmp_path: Path) -> None:
    path = Path(report(tmp_path, "fp"))
    doc = json.loads(path.read_text())
    doc["reused"] = {"from": (datetime.now(UTC) - timedelta(hours=30)).isoformat(), "fast_tier_probes": []}
    path.write_text(json.dumps(doc))
    assert reuse.reusable(str(path), "full", "fp", 24) is None
    assert reuse.reusable(str(path), "full", "fp", 48) is not None


def test_merge_keeps_the_order_puts_fresh_verdicts_in_and_marks_the_carried(tmp_path: Path) -> None:
    prev = json.loads(Path(report(tmp_path, "fp")).read_text())
    fresh = [Result("nvidia_device_nodes", Stage.HOST, Status.SKIP, "no GPU expected", duration_s=0.01)]
    merged = reuse.merge(fresh, prev)
    assert [r.name for r in merged] == ["nvidia_device_nodes", "torch_cuda", "model_forward"]
    assert merged[0] is fresh[0] and "reused_from" not in merged[0].evidence
    assert merged[1].evidence == {"n": 1, "reused_from": prev["started"]}
    assert merged[2].status is Status.PASS and merged[2].stage is Stage.MODEL


def test_a_reused_report_validates_against_the_schema(tmp_path: Path) -> None:
    prev = json.loads(Path(report(tmp_path, "fp")).read_text())
    results = reuse.merge([], prev)
    summary = {"passed": 2, "failed": 0, "warned": 0, "skipped": 1, "ok": True, "root_cause": None}
    doc = render.report("full", OPTIONS, render.now(), results, {**summary, "root_causes": []})
    doc.update(
        fingerprint="fp", reused={"from": prev["started"], "fast_tier_probes": ["nvidia_device_nodes"]}
    )
    assert doc["schema_version"] == SCHEMA_VERSION == "1.4"
    validate(doc)
