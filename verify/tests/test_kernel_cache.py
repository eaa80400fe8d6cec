"""Kernel caches checked, not trusted: what makes an entry unloadable, the folder named, --repair moving
it aside inside the cache only, and the warm step refusing to warm on top of a bad cache."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from doctor_testlib import doctor_env, run_doctor
from mlstack_doctor import engine
from mlstack_doctor.cache import kernel_cache


def entry(cache: Path, name: str = "k1") -> Path:
    """A Triton 3.x cache entry: group file, metadata, a complete ELF binary."""
    e = cache / f"H35EW22PQ25OHHVRS7SC5WXSYCGYAT5DONP5QNVPQSIDZUMG{name.upper()}"
    e.mkdir(parents=True)
    shutil.copy("/bin/true", e / f"{name}.cubin")
    (e / f"{name}.json").write_text(json.dumps({"name": name, "target": {"backend": "cuda", "arch": 0}}))
    children = {f"{name}.cubin": str(e / f"{name}.cubin"), f"{name}.json": str(e / f"{name}.json")}
    (e / f"__grp__{name}.json").write_text(json.dumps({"child_paths": children}))
    return e


def _truncate(p: Path, n: int) -> None:
    p.write_bytes(p.read_bytes()[:n])


@pytest.mark.parametrize(
    "damage,why",
    [
        (lambda e: (e / "k1.cubin").write_bytes(b""), "empty"),
        (lambda e: _truncate(e / "k1.cubin", 200), "truncated"),
        (lambda e: _truncate(e / "k1.cubin", 5000), "truncated"),
        (lambda e: (e / "k1.cubin").write_bytes(b"\x00" * 4096), "not an ELF"),
        (lambda e: (e / "k1.cubin").unlink(), "metadata without its files: k1.cubin"),
        (lambda e: _truncate(e / "k1.json", 10), "metadata does not parse"),
    ],
    ids=["empty", "cut_in_header", "cut_in_sections", "zeros", "binary_gone", "metadata_cut"],
)
def test_an_unloadable_entry_is_named_with_its_folder(tmp_path: Path, damage, why: str) -> None:
    good, bad = entry(tmp_path, "k0"), entry(tmp_path, "k1")
    damage(bad)
    found = kernel_cache.scan(str(tmp_path))
    assert list(found["bad"]) == [str(bad)], found
    assert why in " ".join(found["bad"][str(bad)])
    assert str(good) not in found["bad"]


def test_a_healthy_cache_and_a_truncated_generated_module(tmp_path: Path) -> None:
    entry(tmp_path)
    assert kernel_cache.scan(str(tmp_path))["bad"] == {}
    (tmp_path / "ab").mkdir()
    (tmp_path / "ab" / "cabc.py").write_text("def call(args:")
    assert "cut short" in kernel_cache.scan(str(tmp_path))["bad"][str(tmp_path / "ab")][0]


def test_quarantine_moves_inside_the_cache_and_never_outside(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    bad = entry(cache)
    outside = tmp_path / "precious"
    outside.mkdir()
    moved = kernel_cache.quarantine(str(cache), [str(bad), str(outside), str(cache)])
    assert list(moved) == [str(bad)] and not bad.exists() and outside.is_dir() and cache.is_dir()
    dest = Path(moved[str(bad)])
    assert dest.is_dir() and str(dest).startswith(str(cache / kernel_cache.QUARANTINE))
    assert kernel_cache.scan(str(cache))["bad"] == {}  # Triton (and the doctor) never look in there


def test_the_doctor_names_the_folder_and_repair_moves_it_aside(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    bad = entry(cache)
    (bad / "k1.cubin").write_bytes(b"")
    env = doctor_env({"TRITON_CACHE_DIR": str(cache), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "ind")})
    run = run_doctor("--no-gpu", "--only", "kernel_caches", env=env)
    assert run.rc == 1 and run.root["code"] == "KERNEL_CACHE_CORRUPT"
    assert f"rm -rf {bad}" in run.root["fix"] and bad.is_dir()
    fixed = run_doctor("--no-gpu", "--only", "kernel_caches", "--repair", env=env)
    p = fixed.probe("kernel_caches")
    assert fixed.rc == 0 and p["status"] == "warn" and not bad.exists()
    assert Path(p["evidence"]["moved_aside"][str(bad)]).is_dir()
    assert (
        run_doctor("--no-gpu", "--only", "kernel_caches", env=env).probe("kernel_caches")["status"] == "pass"
    )


def test_the_probes_that_load_kernels_wait_for_the_cache_check() -> None:
    table = {p.name: p for p in engine.PROBES}
    for name in ("fla_kernel", "torch_compile", "model_forward", "triton_warm", "autotune_stress"):
        assert "kernel_caches" in table[name].requires, name
    assert "kernel_caches" in engine.FAST_TIER and "kernel_caches" in engine.WARM_TIER
