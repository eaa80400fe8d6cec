"""The fast tier: never imports torch, Triton, FLA or transformers, and still reads their versions and
torch's triton pin from package metadata.

The proof runs the real doctor as a subprocess with a PYTHONPATH whose `torch`, `triton`, `fla` and
`transformers` packages write a marker and abort the process when imported (the workers and the
extension-import subprocess inherit that path too), beside dist-info metadata that says what is
"installed".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from doctor_testlib import SRC, validate
from mlstack_doctor import engine

TRAPPED = ("torch", "triton", "fla", "transformers")
# distribution -> (version, Requires-Dist lines)
STACK = {
    "torch": ("2.11.0", ['triton==3.6.0; platform_system == "Linux"']),
    "triton": ("3.6.0", []),
    "flash-linear-attention": ("0.5.1", []),
    "fla-core": ("0.5.1", []),
    "transformers": ("5.17.0", []),
}


def trap_site(root: Path, marker: Path, stack: dict[str, tuple[str, list[str]]]) -> Path:
    site = root / "site"
    for mod in TRAPPED:
        (site / mod).mkdir(parents=True)
        (site / mod / "__init__.py").write_text(
            f"import os\nwith open({str(marker)!r}, 'a') as f:\n    f.write({mod!r} + '\\n')\nos._exit(97)\n"
        )
    for dist, (version, requires) in stack.items():
        info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        lines = ["Metadata-Version: 2.1", f"Name: {dist}", f"Version: {version}"]
        lines += [f"Requires-Dist: {r}" for r in requires]
        (info / "METADATA").write_text("\n".join(lines) + "\n")
    return site


def run_fast(tmp_path: Path, stack: dict[str, tuple[str, list[str]]], *args: str) -> tuple[int, dict, Path]:
    marker = tmp_path / "imported.txt"
    site = trap_site(tmp_path, marker, stack)
    env = dict(
        os.environ,
        PYTHONPATH=f"{site}{os.pathsep}{SRC}",
        TRITON_CACHE_DIR=str(tmp_path / "cache"),
        MLSTACK_DOCTOR_SETTINGS="",
    )
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "mlstack_doctor", "--tier", "fast", "--quiet", "--output", str(out), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.is_file(), proc.stderr[-2000:]
    return proc.returncode, json.loads(out.read_text()), marker


def by_name(report: dict) -> dict[str, dict]:
    return {p["name"]: p for p in report["probes"]}


def test_fast_tier_never_imports_the_stack_and_reads_metadata(tmp_path: Path) -> None:
    rc, report, marker = run_fast(tmp_path, STACK, "--no-gpu")
    assert not marker.exists(), f"imported: {marker.read_text()}"
    validate(report)
    assert report["tier"] == "fast"
    probes = by_name(report)
    assert set(probes) == set(engine.FAST_TIER)
    assert probes["package_versions"]["status"] == "pass", probes["package_versions"]
    assert probes["package_versions"]["evidence"]["installed"]["torch"] == "2.11.0"
    pin = probes["torch_triton_pin"]
    assert pin["status"] == "pass" and pin["evidence"]["torch_pins_triton"] == "3.6.0", pin
    assert probes["c_extension_build"]["status"] == "pass", probes["c_extension_build"]
    # Its speed is bench/bench_tiers.py's to print (fast against quick, one run), not a timed assertion here.
    assert rc == 0, report["summary"]


def test_fast_tier_sees_an_undeclared_pin_override_from_metadata(tmp_path: Path) -> None:
    # transformers 5.16: a stack no shipped profile holds (torch211-triton37 declares triton 3.7.1).
    stack = dict(STACK, triton=("3.7.1", []), transformers=("5.16.0", []))
    _, report, marker = run_fast(tmp_path, stack, "--no-gpu")
    assert not marker.exists(), f"imported: {marker.read_text()}"
    pin = by_name(report)["torch_triton_pin"]
    assert pin["code"] == "TRITON_PIN_OVERRIDDEN", pin


def test_fast_tier_expecting_a_gpu_asks_nvml_without_the_stack(tmp_path: Path) -> None:
    # The driver probe runs its NVML worker (ctypes) under the same trap; on a machine without a GPU it
    # fails with a driver code, never by importing torch.
    _, report, marker = run_fast(tmp_path, STACK)
    assert not marker.exists(), f"imported: {marker.read_text()}"
    driver = by_name(report)["nvidia_driver"]
    assert driver["status"] != "skip" or driver.get("skipped_by") == "nvidia_device_nodes", driver
    assert "torch_cuda" not in by_name(report)


def test_fast_tier_holds_no_gpu_session_probe_nor_a_stack_import() -> None:
    fast = engine.selected("fast")
    names = [p.name for p in fast]
    assert names == [p.name for p in engine.PROBES if p.name in engine.FAST_TIER]  # dependency order
    assert len(names) == len(engine.FAST_TIER), set(engine.FAST_TIER) - set(names)
    assert not [p.name for p in fast if p.session or p.needs_packages]
    for heavy in ("torch_cuda", "triton_target", "torch_compile", "model_config", "fla_device"):
        assert heavy not in names
    quick = {p.name for p in engine.selected("quick")}
    assert set(names) <= quick


def test_the_doctor_role_offers_every_tier() -> None:
    yaml = pytest.importorskip("yaml")
    spec = yaml.safe_load((SRC.parents[1] / "roles/doctor/meta/argument_specs.yml").read_text())
    choices = spec["argument_specs"]["main"]["options"]["doctor_tier"]["choices"]
    assert sorted(choices) == sorted(engine.TIERS)
