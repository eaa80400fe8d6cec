"""The doctor's Prometheus metrics (--metrics): what a run, a skipped probe and a skipped run become,
escaping, the per-tier merge and the atomic write; the output read back by a strict parser of the text
exposition format written here (prometheus_client is not part of the test environment) and, where
installed, by promtool (`promtool check metrics`, Prometheus's own parser and linter)."""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from doctor_testlib import SRC
from mlstack_doctor.ops import metrics

NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class ExpositionError(AssertionError):
    pass


def _labels(body: str, line: str) -> tuple[tuple[str, str], ...]:
    """`a="x",b="y\\"z"`: every value quoted, only \\\\, \\" and \\n escapes, no duplicate name."""
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(body):
        m = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="').match(body, i)
        if not m:
            raise ExpositionError(f"bad label at {body[i:]!r}: {line!r}")
        i, value = m.end(), []
        while True:
            if i >= len(body):
                raise ExpositionError(f"unterminated label value: {line!r}")
            c = body[i]
            if c == "\\":
                esc = body[i + 1 : i + 2]
                if esc not in ("\\", '"', "n"):
                    raise ExpositionError(f"bad escape \\{esc} in {line!r}")
                value.append("\n" if esc == "n" else esc)
                i += 2
            elif c == '"':
                i += 1
                break
            elif c == "\n":
                raise ExpositionError(f"raw line feed in a label value: {line!r}")
            else:
                value.append(c)
                i += 1
        if m.group(1) in dict(out):
            raise ExpositionError(f"label {m.group(1)} twice: {line!r}")
        out.append((m.group(1), "".join(value)))
        if i < len(body):
            if body[i] != ",":
                raise ExpositionError(f"expected ',' at {body[i:]!r}: {line!r}")
            i += 1
    return tuple(out)


def parse_strict(text: str) -> tuple[Series, dict[str, str], dict[str, str]]:
    """Text format 0.0.4 as node_exporter's textfile collector takes it: HELP and TYPE at most once per
    family and before its samples, a family's samples together, no duplicate series, no timestamps.
    Returns the series, the TYPE and the HELP (unescaped) of each family."""
    if text and not text.endswith("\n"):
        raise ExpositionError("the last line has no line feed")
    series: Series = {}
    types: dict[str, str] = {}
    helps: dict[str, str] = {}
    closed: set[str] = set()
    current = ""
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                name = parts[2]
                if not NAME.match(name):
                    raise ExpositionError(f"bad metric name: {line!r}")
                if name in closed or any(n == name for n, _ in series):
                    raise ExpositionError(f"{parts[1]} after the samples of {name}: {line!r}")
                table = helps if parts[1] == "HELP" else types
                if name in table:
                    raise ExpositionError(f"second {parts[1]} of {name}")
                text_part = parts[3] if len(parts) > 3 else ""
                if parts[1] == "TYPE" and text_part not in TYPES:
                    raise ExpositionError(f"unknown type: {line!r}")
                if parts[1] == "HELP" and re.search(r"\\[^\\n]", text_part.replace("\\\\", "")):
                    raise ExpositionError(f"bad escape in HELP: {line!r}")
                table[name] = text_part.replace("\\n", "\n").replace("\\\\", "\\")
                if current and current != name:
                    closed.add(current)
                current = name
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?[ \t]+(\S+)([ \t]+(\S+))?$", line)
        if not m:
            raise ExpositionError(f"not a sample line: {line!r}")
        name = m.group(1)
        if m.group(6) is not None:
            raise ExpositionError(f"a timestamp (the textfile collector refuses them): {line!r}")
        if name in closed:
            raise ExpositionError(f"samples of {name} not together: {line!r}")
        if current and current != name:
            closed.add(current)
        current = name
        labels = _labels(m.group(3) or "", line)
        for k, _ in labels:
            if not LABEL_NAME.match(k) or k.startswith("__"):
                raise ExpositionError(f"bad label name {k}: {line!r}")
        raw = m.group(4)
        if raw not in ("NaN", "+Inf", "-Inf"):
            try:
                float(raw)
            except ValueError:
                raise ExpositionError(f"bad value: {line!r}") from None
        key = (name, tuple(sorted(labels)))
        if key in series:
            raise ExpositionError(f"duplicate series: {line!r}")
        series[key] = float(raw.replace("+Inf", "inf").replace("-Inf", "-inf"))
    return series, types, helps


def values(series: Series, name: str) -> list[tuple[dict[str, str], float]]:
    return [(dict(labels), v) for (n, labels), v in series.items() if n == name]


def one(series: Series, name: str, **match: str) -> tuple[dict[str, str], float]:
    found = [(lab, v) for lab, v in values(series, name) if all(lab.get(k) == x for k, x in match.items())]
    assert len(found) == 1, (name, match, values(series, name))
    return found[0]


def probe(name: str, stage: str, status: str, code: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "stage": stage,
        "status": status,
        "summary": "",
        "evidence": extra.pop("evidence", {}),
        "code": code,
        "fix": None,
        "skipped_by": extra.pop("skipped_by", None),
        "duration_s": 0.1,
    }


def report(tier: str = "quick", ok: bool = False, profile_name: str = "torch211-triton37-fla06-b88c") -> dict:
    probes = [
        probe(
            "nvidia_driver",
            "host",
            "pass",
            evidence={
                "nvml_driver": "580.159.04",
                "kernel_module": "580.159.04",
                "nvml_gpus": [{"index": 0, "name": "NVIDIA H200"}, {"index": 1, "name": "NVIDIA H200"}],
            },
        ),
        probe(
            "package_versions",
            "packages",
            "pass",
            evidence={
                "profile": {"name": profile_name, "source": "/x/uv.lock", "expect": {}, "overrides": {}},
                "installed": {
                    "torch": "2.11.0",
                    "triton": "3.7.1",
                    "flash-linear-attention": "0.6.0",
                    "fla-core": "0.6.0",
                    "transformers": "5.17.0",
                },
            },
        ),
        probe("causal_conv1d", "packages", "warn", "CAUSAL_CONV1D_MISSING"),
        probe("torch_cuda", "torch", "pass" if ok else "fail", None if ok else "CUDA_UNAVAILABLE"),
        probe("fla_kernel", "fla", "pass" if ok else "skip", skipped_by=None if ok else "torch_cuda"),
        probe("model_forward", "model", "skip"),
    ]
    failed = sum(p["status"] == "fail" for p in probes)
    return {
        "schema_version": "1.2",
        "tool": {"name": "mlstack-doctor", "version": "0.1.0"},
        "started": "2026-12-01T10:00:00+00:00",
        "finished": "2026-12-01T10:01:30+00:00",
        "host": {"hostname": "t-150", "python": "3.11.2"},
        "tier": tier,
        "options": {},
        "probes": probes,
        "summary": {"passed": 0, "failed": failed, "warned": 1, "skipped": 2, "ok": failed == 0},
    }


def test_a_run_becomes_probe_verdicts_and_a_summary() -> None:
    series, types, helps = parse_strict(metrics.render(metrics.from_report(report(), duration_s=12.5)))
    assert one(series, "mlstack_doctor_ok", tier="quick")[1] == 0
    assert one(series, "mlstack_doctor_failed_probes", tier="quick")[1] == 1
    # pass and warn are 1 (the warning keeps its code), fail is 0 with its code.
    assert one(series, "mlstack_doctor_probe_ok", probe="package_versions")[1] == 1
    assert one(series, "mlstack_doctor_probe_ok", probe="causal_conv1d") == (
        {"tier": "quick", "probe": "causal_conv1d", "stage": "packages", "code": "CAUSAL_CONV1D_MISSING"},
        1,
    )
    assert one(series, "mlstack_doctor_probe_ok", probe="torch_cuda", code="CUDA_UNAVAILABLE")[1] == 0
    # A skip is neither: no probe_ok sample, listed with what skipped it.
    ok_probes = {lab["probe"] for lab, _ in values(series, "mlstack_doctor_probe_ok")}
    assert ok_probes == {"nvidia_driver", "package_versions", "causal_conv1d", "torch_cuda"}
    assert one(series, "mlstack_doctor_probe_skipped", probe="fla_kernel")[0]["skipped_by"] == "torch_cuda"
    assert one(series, "mlstack_doctor_probe_skipped", probe="model_forward")[0]["skipped_by"] == ""
    finished = datetime(2026, 12, 1, 10, 1, 30, tzinfo=UTC).timestamp()
    assert one(series, "mlstack_doctor_last_run_timestamp_seconds", tier="quick")[1] == finished
    assert one(series, "mlstack_doctor_run_duration_seconds", tier="quick")[1] == 12.5
    assert set(types.values()) == {"gauge"} and set(types) == set(helps)
    assert all(helps[n] for n in types)


def test_the_stack_info_names_the_versions_the_run_saw() -> None:
    series, _, _ = parse_strict(metrics.render(metrics.from_report(report(ok=True))))
    labels, value = one(series, "mlstack_doctor_stack_info")
    assert value == 1
    assert labels == {
        "tier": "quick",
        "doctor": "0.1.0",
        "profile": "torch211-triton37-fla06-b88c",
        "python": "3.11.2",
        "torch": "2.11.0",
        "triton": "3.7.1",
        "fla": "0.6.0",
        "fla_core": "0.6.0",
        "transformers": "5.17.0",
        "driver": "580.159.04",
        "gpu": "NVIDIA H200",
    }
    # Without the report's own duration, finished - started (whole seconds).
    assert one(series, "mlstack_doctor_run_duration_seconds")[1] == 90


def test_label_values_are_escaped_and_read_back_unchanged() -> None:
    nasty = 'a"quote\\back\nline}{,="'
    text = metrics.render(metrics.from_report(report(profile_name=nasty)))
    info = next(line for line in text.splitlines() if line.startswith("mlstack_doctor_stack_info{"))
    assert 'profile="a\\"quote\\\\back\\nline}{,=\\""' in info
    assert len(text.splitlines()) == len([x for x in text.split("\n") if x])  # no raw line feed leaked
    series, _, _ = parse_strict(text)
    assert one(series, "mlstack_doctor_stack_info")[0]["profile"] == nasty
    # And by the module's own reader, which keeps the other tiers' series.
    read = [s.label("profile") for s in metrics.parse(text) if s.name == "mlstack_doctor_stack_info"]
    assert read == [nasty]


def test_the_strict_parser_refuses_what_the_collector_would() -> None:
    good = '# HELP m x\n# TYPE m gauge\nm{a="1"} 1\n'
    parse_strict(good)
    for bad in (
        'm{a="1"} 1\n# TYPE m gauge\n',  # TYPE after the samples
        '# TYPE m gauge\nm{a="1"} 1\nm{a="1"} 2\n',  # duplicate series
        '# TYPE m gauge\nm{a="x"y"} 1\n',  # unescaped quote
        '# TYPE m gauge\nm{a="x\\t"} 1\n',  # unknown escape
        '# TYPE m gauge\nm{a="1"} 1 1700000000000\n',  # a timestamp
        '# TYPE m gauge\n# TYPE n gauge\nm 1\nn 1\nm{a="2"} 1\n',  # m's samples not together
        "# TYPE m gauge\nm 1",  # no final line feed
    ):
        with pytest.raises(ExpositionError):
            parse_strict(bad)


def test_each_tier_keeps_its_last_run(tmp_path: Path) -> None:
    prom = tmp_path / "doctor.prom"
    metrics.write(prom, report(tier="quick", ok=False), duration_s=80)
    metrics.write(prom, report(tier="fast", ok=True), duration_s=0.5)
    series, _, _ = parse_strict(prom.read_text())
    # The daily quick run's failure is still there beside the fast run that passed after it.
    assert one(series, "mlstack_doctor_ok", tier="quick")[1] == 0
    assert one(series, "mlstack_doctor_ok", tier="fast")[1] == 1
    assert one(series, "mlstack_doctor_probe_ok", tier="quick", probe="torch_cuda")[1] == 0
    metrics.write(prom, report(tier="quick", ok=True), duration_s=70)
    series, _, _ = parse_strict(prom.read_text())
    assert one(series, "mlstack_doctor_ok", tier="quick")[1] == 1
    assert one(series, "mlstack_doctor_run_duration_seconds", tier="quick")[1] == 70
    assert one(series, "mlstack_doctor_probe_ok", tier="quick", probe="torch_cuda")[1] == 1
    assert len(values(series, "mlstack_doctor_stack_info")) == 2


def test_a_skipped_run_keeps_the_verdict_and_says_since_when(tmp_path: Path) -> None:
    prom = tmp_path / "doctor.prom"
    metrics.write(prom, report(tier="fast", ok=True), duration_s=0.5)
    metrics.write_run_skipped(prom, "fast", "gpu_busy", now=1000.0)
    metrics.write_run_skipped(prom, "fast", "gpu_busy", now=1300.0)
    series, _, _ = parse_strict(prom.read_text())
    assert one(series, "mlstack_doctor_run_skipped", tier="fast", reason="gpu_busy")[1] == 1
    # The streak began at the first skip; the last verdict is still the last run's.
    assert one(series, "mlstack_doctor_run_skipped_since_timestamp_seconds", tier="fast")[1] == 1000.0
    assert one(series, "mlstack_doctor_ok", tier="fast")[1] == 1
    metrics.write(prom, report(tier="fast", ok=True), duration_s=0.5)
    series, _, _ = parse_strict(prom.read_text())
    assert values(series, "mlstack_doctor_run_skipped") == []
    assert values(series, "mlstack_doctor_run_skipped_since_timestamp_seconds") == []
    with pytest.raises(ValueError, match="lower-case word"):
        metrics.write_run_skipped(prom, "fast", 'busy"}')


def test_the_skip_command_line(tmp_path: Path) -> None:
    prom = tmp_path / "m" / "doctor.prom"
    env = dict(os.environ, PYTHONPATH=str(SRC))

    def skip(reason: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "mlstack_doctor.ops.metrics", "--run-skipped", reason]
        argv += ["--tier", "quick", str(prom)]
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)

    r = skip("gpu_busy")
    assert r.returncode == 0, r.stderr
    series, _, _ = parse_strict(prom.read_text())
    assert one(series, "mlstack_doctor_run_skipped", tier="quick")[0]["reason"] == "gpu_busy"
    r = skip("GPU busy")
    assert r.returncode == 2 and "cannot record the skipped run" in r.stderr


def test_the_write_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prom = tmp_path / "doctor.prom"
    metrics.write(prom, report(tier="fast", ok=True), duration_s=1)
    before, inode = prom.read_text(), prom.stat().st_ino
    metrics.write(prom, report(tier="quick"), duration_s=1)
    assert prom.stat().st_ino != inode, "rewritten in place, not renamed over"
    assert oct(prom.stat().st_mode & 0o777) == "0o644"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["doctor.prom"]

    def fail(*_: object) -> None:
        raise OSError(28, "No space left on device")

    now = prom.read_text()
    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError):
        metrics.write(prom, report(tier="fast", ok=False), duration_s=1)
    assert prom.read_text() == now != before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["doctor.prom"], "temporary file left behind"


def _fake_site(root: Path) -> Path:
    """Installed-package metadata only (the fast tier reads versions, never imports)."""
    for dist, version in {
        "torch": "2.11.0",
        "triton": "3.7.1",
        "flash_linear_attention": "0.6.0",
        "fla_core": "0.6.0",
        "transformers": "5.17.0",
    }.items():
        info = root / f"{dist}-{version}.dist-info"
        info.mkdir(parents=True)
        name = dist.replace("_", "-")
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return root


@pytest.mark.parametrize("installed", [True, False], ids=["stack-installed", "stack-missing"])
def test_the_doctor_writes_them_with_metrics(tmp_path: Path, installed: bool) -> None:
    site = _fake_site(tmp_path / "site") if installed else tmp_path / "empty"
    site.mkdir(exist_ok=True)
    prom = tmp_path / "textfile" / "doctor.prom"
    env = dict(
        os.environ, PYTHONPATH=f"{site}{os.pathsep}{SRC}", TRITON_CACHE_DIR=str(tmp_path / "triton-cache")
    )
    argv = [sys.executable, "-m", "mlstack_doctor", "--tier", "fast", "--no-gpu", "--quiet"]
    t0 = time.time()
    r = subprocess.run([*argv, "--metrics", str(prom)], capture_output=True, text=True, env=env, timeout=120)
    t1 = time.time()
    assert r.returncode in (0, 1), r.stderr
    series, _, _ = parse_strict(prom.read_text())
    ok = one(series, "mlstack_doctor_ok", tier="fast")[1]
    assert ok == (1 if r.returncode == 0 else 0)
    failed = [lab["probe"] for lab, v in values(series, "mlstack_doctor_probe_ok") if v == 0]
    assert one(series, "mlstack_doctor_failed_probes")[1] == len(failed)
    info = one(series, "mlstack_doctor_stack_info")[0]
    if installed:
        assert (info["torch"], info["triton"], info["fla"], info["transformers"]) == (
            "2.11.0",
            "3.7.1",
            "0.6.0",
            "5.17.0",
        )
    else:
        assert "package_versions" in failed and info["torch"] == ""
        versions = one(series, "mlstack_doctor_probe_ok", probe="package_versions")[0]
        assert versions["code"] == "PACKAGE_MISSING"
    # The run's own wall time and end, not the report's whole seconds.
    duration = one(series, "mlstack_doctor_run_duration_seconds")[1]
    assert 0 < duration <= t1 - t0 and not math.isnan(duration)
    assert int(t0) - 1 <= one(series, "mlstack_doctor_last_run_timestamp_seconds")[1] <= t1


def test_an_unwritable_metrics_file_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    env = dict(os.environ, PYTHONPATH=str(SRC), TRITON_CACHE_DIR=str(tmp_path / "cache"))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlstack_doctor",
            "--tier",
            "fast",
            "--no-gpu",
            "--metrics",
            str(blocker / "x"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 2
    assert f"cannot write {blocker / 'x'}" in r.stderr


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool not installed (apt-get install prometheus)"
)
def test_promtool_reads_the_file(tmp_path: Path) -> None:
    prom = tmp_path / "doctor.prom"
    metrics.write(prom, report(tier="quick", profile_name='we"ird\\name'), duration_s=3)
    metrics.write(prom, report(tier="fast", ok=True), duration_s=0.4)
    metrics.write_run_skipped(prom, "quick", "gpu_busy")
    r = subprocess.run(
        ["promtool", "check", "metrics"], input=prom.read_text(), capture_output=True, text=True, timeout=60
    )
    # Exit 0: parsed and no lint problem (names, HELP, units); it prints the problems otherwise.
    assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), r.stdout + r.stderr
