"""End to end, for real: the doctor as a subprocess in environments with real faults. No mocks.

Each case checks the diagnosis code, the fix, the gating of dependants, the exit code, and (in
run_doctor) that the JSON validates against the shipped schema.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from doctor_testlib import (
    PY_VER,
    SRC,
    TEST_TORCH,
    TEST_TRANSFORMERS,
    doctor_env,
    run_doctor,
    write_lock,
)

pytestmark = pytest.mark.slow

GPU_PROBES = (
    "nvidia_driver",
    "cuda_visible_devices",
    "torch_cuda",
    "triton_target",
    "fla_device",
    "fla_kernel",
    "gdn_backward",
)


def test_no_gpu_is_an_honest_pass(torch_venv: Path, matching_lock: Path, tmp_path: Path) -> None:
    # A cache of its own: no stamp of an earlier build stands in for the build (config_stamp).
    env = doctor_env({"TRITON_CACHE_DIR": str(tmp_path / "triton")})
    run = run_doctor("--no-gpu", "--profile", str(matching_lock), python=str(torch_venv), env=env)
    assert run.rc == 0, run.stdout
    for name in GPU_PROBES:
        p = run.probe(name)
        assert p["status"] == "skip" and p["summary"] == "no GPU expected (--no-gpu)"
    for name in ("c_compiler", "python_headers", "c_extension_build", "triton_cache_dir", "package_versions"):
        assert run.probe(name)["status"] == "pass", run.probe(name)
    # transformers really builds the shipped config
    built = run.probe("model_config")
    assert built["status"] == "pass" and "built_at" not in built["evidence"], built
    assert run.report["summary"]["root_cause"] is None


def test_no_c_compiler(tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python3").symlink_to(sys.executable)
    env = doctor_env({"PATH": str(bindir)}, unset=("CC",))
    run = run_doctor("--no-gpu", env=env)
    assert run.rc == 1
    p = run.probe("c_compiler")
    assert p["code"] == "NO_C_COMPILER" and p["fix"] == "apt-get install -y gcc g++"
    assert run.root["code"] == "NO_C_COMPILER"
    assert run.probe("c_extension_build")["skipped_by"] == "c_compiler"


def test_cc_names_a_missing_binary(tmp_path: Path) -> None:
    run = run_doctor("--no-gpu", env=doctor_env({"CC": str(tmp_path / "no-such-gcc")}))
    p = run.probe("c_compiler")
    assert run.rc == 1 and p["code"] == "CC_INVALID" and "unset CC" in p["fix"]


def test_no_python_h_in_the_base_interpreter(headerless_python: Path) -> None:
    run = run_doctor(
        "--no-gpu", "--only", "c_compiler,python_headers,c_extension_build", python=str(headerless_python)
    )
    p = run.probe("python_headers")
    assert run.rc == 1 and p["code"] == "NO_PYTHON_H"
    ev = p["evidence"]
    assert ev["in_venv"] is True
    # inside a venv the include dir is the BASE interpreter's, as Triton (sysconfig) sees it
    assert ev["include_dir"].startswith(ev["base_prefix"]) and not ev["include_dir"].startswith(ev["prefix"])
    assert run.probe("c_extension_build")["skipped_by"] == "python_headers"


def test_compiling_against_a_headerless_include_dir_is_classified(headerless_python: Path) -> None:
    """The compile itself (what Triton runs), on its own: gcc's 'Python.h: No such file' -> NO_PYTHON_H."""
    # Asked of the machine, not of the doctor's c_compiler verdict (the thing under test).
    if shutil.which("gcc") is None:
        pytest.skip("no C compiler on this machine (gcc)")
    run = run_doctor("--no-gpu", "--only", "c_compiler,c_extension_build", python=str(headerless_python))
    p = run.probe("c_extension_build")
    assert run.probe("c_compiler")["status"] == "pass", run.probe("c_compiler")
    assert p["code"] == "NO_PYTHON_H" and "Python.h" in p["evidence"]["compiler_output"]


def _ro_tmpfs(tmp_path: Path) -> Path:
    target = tmp_path / "ro"
    target.mkdir()
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(target)], capture_output=True
    )
    if res.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here: {res.stderr.decode()[-200:]}")
    return target


def _under_a_file(tmp_path: Path) -> Path:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a dir")
    return blocker / "cache"


def _chmod_500(tmp_path: Path) -> Path:
    if os.geteuid() == 0:
        pytest.skip("root ignores permission bits")
    d = tmp_path / "locked"
    d.mkdir(mode=0o500)
    return d


@pytest.mark.parametrize(
    "make", [_under_a_file, _ro_tmpfs, _chmod_500], ids=["under-a-file", "ro-tmpfs", "chmod-500"]
)
def test_unwritable_triton_cache(tmp_path: Path, make) -> None:
    cache = make(tmp_path)
    try:
        run = run_doctor(
            "--no-gpu", "--only", "triton_cache_dir", env=doctor_env({"TRITON_CACHE_DIR": str(cache)})
        )
    finally:
        if make is _ro_tmpfs:
            subprocess.run(["umount", str(cache)], check=False)
    p = run.probe("triton_cache_dir")
    assert run.rc == 1 and p["code"] == "TRITON_CACHE_UNWRITABLE"
    assert "TRITON_CACHE_DIR" in p["fix"] and str(cache) in p["fix"]


def test_model_path_missing(tmp_path: Path) -> None:
    run = run_doctor("--no-gpu", "--only", "model_config", "--model", str(tmp_path / "nope"))
    assert run.rc == 1 and run.probe("model_config")["code"] == "MODEL_PATH_MISSING"


@pytest.mark.parametrize(
    "content",
    [
        '{"model_type": "qwen3_5_text", "hidden_size": 25',
        '{"model_type": "qwen3_5_text", "vocab_size": 10}',
        "[1, 2]",
    ],
    ids=["truncated-json", "missing-fields", "not-an-object"],
)
def test_model_config_corrupt(tmp_path: Path, content: str) -> None:
    (tmp_path / "config.json").write_text(content)
    run = run_doctor("--no-gpu", "--only", "model_config", "--model", str(tmp_path))
    p = run.probe("model_config")
    assert run.rc == 1 and p["code"] == "MODEL_CONFIG_CORRUPT" and p["fix"]


def test_model_weights_incomplete(tmp_path: Path) -> None:
    cfg = (Path(__file__).parents[1] / "src/mlstack_doctor/configs/qwen3_5_tiny.json").read_text()
    (tmp_path / "config.json").write_text(cfg)
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(b"")
    (tmp_path / "model.safetensors.index.json").write_text(
        '{"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}'
    )
    run = run_doctor("--no-gpu", "--only", "model_config", "--model", str(tmp_path))
    p = run.probe("model_config")
    assert p["code"] == "MODEL_WEIGHTS_INCOMPLETE" and p["evidence"]["missing_shards"] == [
        "model-00002-of-00002.safetensors"
    ]


def test_model_type_unknown(torch_venv: Path, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        '{"model_type": "qwen9_next_hybrid", "hidden_size": 8, '
        '"num_hidden_layers": 1, "vocab_size": 8, "num_attention_heads": 1}'
    )
    run = run_doctor("--no-gpu", "--only", "model_config", "--model", str(tmp_path), python=str(torch_venv))
    p = run.probe("model_config")
    assert run.rc == 1 and p["code"] == "MODEL_TYPE_UNKNOWN", p
    assert "transformers" in p["fix"]


def test_model_config_worker_death_is_not_a_corrupt_config(tmp_path: Path) -> None:
    # A transformers whose import kills the process: the config is fine, the worker crashed.
    fake = tmp_path / "site" / "transformers"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("import os\nos.abort()\n")
    meta = tmp_path / "site" / f"transformers-{TEST_TRANSFORMERS}.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: transformers\nVersion: {TEST_TRANSFORMERS}\n"
    )
    env = doctor_env({"PYTHONPATH": f"{SRC}{os.pathsep}{tmp_path / 'site'}"})
    run = run_doctor("--no-gpu", "--only", "model_config", "--model", "tiny", env=env)
    p = run.probe("model_config")
    assert run.rc == 1 and p["code"] == "PROBE_CRASHED", p


@pytest.mark.parametrize("model,params_b", [("tiny", 0.02), ("27b", 25.38)])
def test_shipped_configs_build_in_transformers(
    torch_venv: Path, model: str, params_b: float, tmp_path: Path
) -> None:
    env = doctor_env({"TRITON_CACHE_DIR": str(tmp_path / "triton")})
    run = run_doctor("--no-gpu", "--only", "model_config", "--model", model, python=str(torch_venv), env=env)
    ev = run.probe("model_config")["evidence"]
    assert run.rc == 0 and ev["model_type"] == "qwen3_5_text" and "built_at" not in ev
    assert round(ev["params"] / 1e9, 2) == params_b
    assert set(ev["layer_types"]) == {"linear_attention", "full_attention"}


def test_versions_off_profile(torch_venv: Path, tmp_path: Path) -> None:
    lock = write_lock(
        tmp_path / "p", {"torch": "2.11.0", "transformers": TEST_TRANSFORMERS, "numpy": "2.0.0"}
    )
    run = run_doctor("--no-gpu", "--profile", str(lock.parent), python=str(torch_venv))
    p = run.probe("package_versions")
    assert run.rc == 1 and p["code"] == "VERSION_OFF_PROFILE"
    assert p["evidence"]["off_profile"]["torch"] == {"installed": TEST_TORCH + "+cpu", "expected": "2.11.0"}
    assert "'torch==2.11.0'" in p["fix"] and f"cd {lock.parent} && uv sync --frozen" in p["fix"]


def test_default_profile_missing_packages_named() -> None:
    run = run_doctor("--no-gpu", "--only", "package_versions")
    p = run.probe("package_versions")
    if p["status"] == "pass":
        pytest.skip("this interpreter has the whole default stack")
    assert (
        p["code"] in ("PACKAGE_MISSING", "VERSION_OFF_PROFILE") and sys.executable in p["fix"]
    ) or "pip" in p["fix"]


@pytest.mark.parametrize(
    "args", [("--profile", "/nonexistent/profile"), ("--only", "no_such_probe"), ("--tier", "bogus")]
)
def test_exit_2_when_the_doctor_cannot_run(args: tuple[str, ...]) -> None:
    run = run_doctor(*args)
    assert run.rc == 2 and run.stdout == ""


def test_output_file_and_table(tmp_path: Path) -> None:
    out = tmp_path / "r" / "report.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlstack_doctor",
            "--no-gpu",
            "--only",
            "c_compiler,triton_cache_dir",
            "--output",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=doctor_env(),
    )
    import json

    from doctor_testlib import validate

    validate(json.loads(out.read_text()))
    assert "STATUS" in proc.stdout and "c_compiler" in proc.stdout
    assert "[1/2]" in proc.stderr  # progress goes to stderr


def test_help_documents_exit_codes() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mlstack_doctor", "--help"], capture_output=True, text=True, env=doctor_env()
    )
    assert proc.returncode == 0
    for line in ("0  every probe passed", "1  a probe failed", "2  the doctor itself could not run"):
        assert line in proc.stdout


def test_python_version_in_fix_is_the_interpreters() -> None:
    from mlstack_doctor.diagnosis import fix_for

    assert fix_for("NO_PYTHON_H", py_ver=PY_VER) == f"apt-get install -y python{PY_VER}-dev"


def test_warm_tier_without_gpu_is_skipped_with_its_reason(torch_venv: Path, matching_lock: Path) -> None:
    from mlstack_doctor.engine import WARM_TIER

    run = run_doctor(
        "--tier", "warm", "--no-gpu", "--profile", str(matching_lock), "--seq-len", "2048,4096",
        python=str(torch_venv),
    )  # fmt: skip
    assert run.rc == 0 and run.report["tier"] == "warm", run.stdout
    assert [p["name"] for p in run.report["probes"]] == list(WARM_TIER)
    p = run.probe("triton_warm")
    assert p["status"] == "skip" and p["summary"] == "no GPU expected (--no-gpu)"
    assert run.report["options"]["seq_lens"] == [2048, 4096]
    parsed = run.probe("model_config")  # nothing is warmed without a GPU: no worker builds the config
    assert parsed["status"] == "pass" and "config parsed; no GPU expected" in parsed["summary"], parsed
    assert parsed["duration_s"] < 1


def test_a_warm_plan_parses_the_model_config_and_builds_nothing(
    torch_venv: Path, matching_lock: Path, tmp_path: Path
) -> None:
    """--warm-plan (provisioning's first warm run with a cluster cache) decides the key without a worker:
    the 27B config is parsed and its fields checked, and left to the warm of the key to build."""
    run = run_doctor(
        "--tier", "warm", "--no-gpu", "--warm-plan", "--warm-share", "--profile", str(matching_lock),
        "--model", "27b", python=str(torch_venv), env=doctor_env({"TRITON_CACHE_DIR": str(tmp_path)}),
    )  # fmt: skip
    assert run.rc == 0 and run.report["tier"] == "warm", run.stdout
    planned = run.probe("model_config")
    assert planned["status"] == "pass", planned
    summary = "qwen3_5_text config parsed; a warm plan leaves the build to the warm of its key"
    assert planned["summary"] == summary
    assert planned["duration_s"] < 1  # no worker: no torch or transformers import
    assert run.report["options"]["warm_plan"] is True


MICRO = {
    "model_type": "qwen3_5_text",
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 2,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"],
}


@pytest.mark.parametrize("mode", ["warm", "stress"])
def test_warm_and_stress_passes_run_for_real_on_cpu(torch_venv: Path, tmp_path: Path, mode: str) -> None:
    """The worker code of the warm step and the stress tier, on the CPU (torch's reference kernels)."""
    from mlstack_doctor import runner

    args = {"mode": mode, "config_dict": MICRO, "device": "cpu", "seq_lens": [32, 64], "batch": 2}
    args["threads"] = 3
    res = runner.run_worker(
        "w_model.py", args, timeout=600, python=str(torch_venv), env={"TRITON_CACHE_DIR": str(tmp_path)}
    )
    assert res.ok, res.error_text
    if mode == "warm":
        assert res.data["backward"] == "warmed" and [s["seq_len"] for s in res.data["shapes"]] == [32, 64]
        assert all("train_step_s" in s and "forward_s" in s for s in res.data["shapes"])
        assert res.data["autotune_files_new"] == 0 and res.data["fla_in_use"] is False
    else:
        cold = res.data["cold"]
        assert cold["errors"] == [] and cold["backward_errors"] == [] and len(cold["rounds"]) == 2
        assert res.data["threads"] == 3 and "after_warmup" not in res.data


def test_triton_cache_root_points_at_the_running_venvs_cache(tmp_path: Path) -> None:
    # Provisioning lays caches out as <root>/<venv name>; the doctor resolves its own venv's name, links
    # followed, as the role and the scheduled runs would otherwise have to.
    venv_name = os.path.basename(os.path.realpath(sys.prefix))
    run = run_doctor(
        "--no-gpu", "--only", "triton_cache_dir", "--triton-cache-root", str(tmp_path / "triton"),
        env=doctor_env({"TRITON_CACHE_DIR": "/nonexistent/ignored"}),
    )  # fmt: skip
    assert run.rc == 0, run.stderr
    assert run.report["options"]["triton_cache_dir"] == str(tmp_path / "triton" / venv_name)
    assert (tmp_path / "triton" / venv_name).is_dir()
