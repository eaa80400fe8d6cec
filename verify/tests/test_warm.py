"""The warm step's cache key: rerun when any part changes, skip otherwise; the probe around it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mlstack_doctor import runner
from mlstack_doctor.cache import warm
from mlstack_doctor.context import Context, Options
from mlstack_doctor.probes import warm as warm_probe
from mlstack_doctor.record import Status

CONFIGS = Path(__file__).resolve().parents[1] / "src" / "mlstack_doctor" / "configs"
Q27B = json.loads((CONFIGS / "qwen3_5_27b.json").read_text())
H200 = [{"index": 0, "name": "NVIDIA H200", "compute_capability": "9.0"}]
VERSIONS = {
    "torch": "2.11.0",
    "triton": "3.6.0",
    "flash-linear-attention": "0.5.1",
    "fla-core": "0.5.1",
    "transformers": "5.17.0",
    "tilelang": None,
    "causal-conv1d": None,
}
REFUSAL = (
    "RuntimeError: Triton >= 3.4.0 on Hopper GPUs produces incorrect results for gated chunk_bwd_dqkwg "
    "(see #640). Please install tilelang: `pip install tilelang`"
)


def parts(**over: Any) -> dict[str, Any]:
    kw: dict[str, Any] = {
        "gpus": warm.gpu_part(H200, None),
        "packages": dict(VERSIONS),
        "cfg": warm.warm_config(Q27B),
        "seq_lens": [2048],
        "batch": 1,
    }
    kw.update(over)
    return warm.key_parts(**kw)


def test_depth_reduced_config_keeps_the_widths() -> None:
    cfg = warm.warm_config(Q27B)
    assert cfg["num_hidden_layers"] == 4
    assert cfg["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    for k in ("hidden_size", "intermediate_size", "vocab_size", "linear_num_value_heads", "head_dim"):
        assert cfg[k] == Q27B[k]
    assert warm.warm_config(Q27B, 0)["num_hidden_layers"] == 64
    assert warm.warm_config(Q27B, 8)["layer_types"] == Q27B["layer_types"][:8]


def test_depth_of_the_target_is_not_part_of_the_key() -> None:
    shallower = {**Q27B, "num_hidden_layers": 48, "layer_types": Q27B["layer_types"][:48]}
    assert warm.cache_key(parts(cfg=warm.warm_config(shallower))) == warm.cache_key(parts())


def test_gpu_part_follows_cuda_visible_devices() -> None:
    two = [*H200, {"index": 1, "name": "NVIDIA B200", "compute_capability": "10.0"}]
    assert warm.gpu_part(two, None) == ["NVIDIA B200 sm_100", "NVIDIA H200 sm_90"]
    assert warm.gpu_part(two, "0") == ["NVIDIA H200 sm_90"]


@pytest.fixture
def stamped(tmp_path: Path) -> Path:
    """A cache warmed for parts(): the stamp, and the entry the warm step wrote."""
    (tmp_path / "ENTRY").mkdir()
    warm.write_stamp(tmp_path, parts(), {"entries": ["ENTRY"], "kernels_tuned": 3, "seconds": 1.0})
    return tmp_path


def test_same_key_skips(stamped: Path) -> None:
    d = warm.decide(stamped, parts())
    assert not d.warm and d.reason == "cache key already warm" and d.stamp["kernels_tuned"] == 3


@pytest.mark.parametrize(
    "change,part",
    [
        ({"gpus": ["NVIDIA B200 sm_100"]}, "gpu"),
        ({"packages": {**VERSIONS, "triton": "3.7.1"}}, "packages.triton"),
        ({"packages": {**VERSIONS, "flash-linear-attention": "0.5.2"}}, "packages.flash-linear-attention"),
        ({"packages": {**VERSIONS, "fla-core": "0.5.2"}}, "packages.fla-core"),
        ({"packages": {**VERSIONS, "torch": "2.12.0"}}, "packages.torch"),
        ({"packages": {**VERSIONS, "transformers": "5.18.0"}}, "packages.transformers"),
        ({"packages": {**VERSIONS, "tilelang": "0.1.15"}}, "packages.tilelang"),
        ({"cfg": warm.warm_config({**Q27B, "hidden_size": 4096})}, "config"),
        ({"cfg": warm.warm_config(Q27B, 8)}, "config"),
        ({"seq_lens": [4096]}, "shapes.seq_lens"),
        ({"seq_lens": [2048, 8192]}, "shapes.seq_lens"),
        ({"batch": 4}, "shapes.batch"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_any_change_of_the_key_reruns(stamped: Path, change: dict[str, Any], part: str) -> None:
    d = warm.decide(stamped, parts(**change))
    assert d.warm and d.reason.startswith("cache key changed since the last warm step")
    assert f"{part}:" in d.reason or f"{part}." in d.reason, d.reason


def test_cold_cache_warms(tmp_path: Path) -> None:
    d = warm.decide(tmp_path, parts())
    assert d.warm and "cold" in d.reason


def test_entries_gone_rerun(stamped: Path) -> None:
    (stamped / "ENTRY").rmdir()  # someone pruned the cache
    d = warm.decide(stamped, parts())
    assert d.warm and "1 of 1 cache entries" in d.reason


def test_unreadable_stamp_reruns(stamped: Path) -> None:
    warm.stamp_path(stamped, warm.cache_key(parts())).write_text("{not json")
    assert warm.decide(stamped, parts()).warm


def test_rewarm_forces(stamped: Path) -> None:
    assert warm.decide(stamped, parts(), force=True).warm


# The probe around the key, with a stand-in for the GPU session (the GPU part runs on the H200).


class FakeSession:
    """Answers the 'warm' request as the worker does, writing what Triton would write to the cache."""

    started, dead = True, None

    def __init__(self, cache: Path, backward_error: str | None = None) -> None:
        self.cache, self.backward_error, self.calls = cache, backward_error, []

    def call(self, op: str, args: dict[str, Any], *, probe: str, timeout: float) -> runner.WorkerResult:
        self.calls.append((op, args))
        (self.new_entry() / "chunk_fwd_kernel_o.autotune.json").write_text("{}")
        data: dict[str, Any] = {
            "ok": True,
            "seq_lens": args["seq_lens"],
            "batch": args["batch"],
            "layers": args["config_dict"]["num_hidden_layers"],
            "shapes": [{"seq_len": s, "forward_s": 1.0} for s in args["seq_lens"]],
            "backward": "warmed",
            "autotune_files_new": 1,
            "tuned_kernels": ["chunk_fwd_kernel_o"],
            "seconds": 2.5,
        }
        if self.backward_error:
            data.update(backward="failed", backward_error=self.backward_error)
        return runner.WorkerResult(runner.RunResult(["w_session.py"], 0, "", "", 2.5), data)

    def new_entry(self) -> Path:
        """The cache entry this call's kernel lands in."""
        entry = self.cache / f"E{len(self.calls)}"
        entry.mkdir()
        return entry


@pytest.fixture
def ctx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Context:
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(warm_probe, "installed", VERSIONS.get)
    c = Context(Options(tier="warm", model="27b"))
    c.facts.update(model={"config": str(CONFIGS / "qwen3_5_27b.json")}, nvml_gpus=H200)
    c.session = FakeSession(tmp_path)  # type: ignore[assignment]
    return c


def test_probe_warms_once_then_skips(ctx: Context, tmp_path: Path) -> None:
    first = warm_probe.triton_warm(ctx)
    assert first.status is Status.PASS and first.evidence["action"] == "warmed"
    assert "1 kernel configs tuned" in first.summary and "4 of 64 layers" in first.summary
    assert ctx.session.calls[0][1]["config_dict"]["num_hidden_layers"] == 4  # type: ignore[union-attr]
    stamp = json.loads(Path(first.evidence["stamp_path"]).read_text())
    assert stamp["entries"] == ["E1"] and stamp["backward"] == "warmed"
    second = warm_probe.triton_warm(ctx)
    assert second.status is Status.PASS and second.evidence["action"] == "skipped"
    assert second.summary.startswith("skipped: cache key already warm")
    assert len(ctx.session.calls) == 1  # type: ignore[union-attr]


def test_probe_rewarms_when_the_shapes_change(ctx: Context) -> None:
    warm_probe.triton_warm(ctx)
    ctx.opts.seq_lens = [4096]
    again = warm_probe.triton_warm(ctx)
    assert again.evidence["action"] == "warmed"
    assert "shapes.seq_lens: [2048] -> [4096]" in again.evidence["reason"]


@pytest.mark.parametrize(("purpose", "status"), [("training", Status.FAIL), ("inference", Status.WARN)])
def test_refused_backward_follows_the_purpose_and_is_still_stamped(
    ctx: Context, tmp_path: Path, purpose: str, status: Status
) -> None:
    ctx.opts.purpose = purpose
    ctx.session = FakeSession(tmp_path, backward_error=REFUSAL)  # type: ignore[assignment]
    r = warm_probe.triton_warm(ctx)
    assert r.status is status and r.code == "FLA_BACKWARD_NEEDS_TILELANG" and "tilelang" in (r.fix or "")
    assert "backward REFUSED" in r.summary and "forward warmed" in r.summary
    assert json.loads(Path(r.evidence["stamp_path"]).read_text())["backward"] == "refused"
    again = warm_probe.triton_warm(ctx)  # a warm key keeps the verdict of the run that stamped it
    assert again.evidence["action"] == "skipped"
    assert (again.status, again.code) == (status, "FLA_BACKWARD_NEEDS_TILELANG")


def test_other_backward_failure_fails_without_a_stamp(ctx: Context, tmp_path: Path) -> None:
    ctx.session = FakeSession(tmp_path, backward_error="OutOfMemoryError: CUDA out of memory.")  # type: ignore[assignment]
    r = warm_probe.triton_warm(ctx)
    assert r.status is Status.FAIL and r.code == "GPU_OUT_OF_MEMORY"
    assert not list((tmp_path / warm.STAMP_DIR).glob("*.json"))


def test_a_warm_rerun_does_not_build_the_config_again(
    ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The warm tier on a warm key: model_config parses the config and names the warm that built it, with no
    worker (no transformers import); a cold key, or --rewarm, still builds it."""
    from mlstack_doctor.probes import gpu, model

    built: list[str] = []
    call = gpu.call

    def build(c: Context, probe: str, op: str, *args: Any, **kwargs: Any) -> runner.WorkerResult:
        if op != "model_config":
            return call(c, probe, op, *args, **kwargs)
        built.append(op)
        answer = {"ok": True, "transformers": VERSIONS["transformers"], "config_class": "Qwen3_5TextConfig"}
        return runner.WorkerResult(runner.RunResult(["w_model.py"], 0, "", "", 1.0), answer)

    monkeypatch.setattr(gpu, "call", build)
    monkeypatch.setattr(model, "installed", VERSIONS.get)
    monkeypatch.setattr(FakeSession, "imports", {}, raising=False)
    cold = model.model_config(ctx)
    assert cold.status is Status.PASS and built == ["model_config"], cold.summary
    warm_probe.triton_warm(ctx)
    again = model.model_config(ctx)
    key = warm.cache_key(warm_probe.setup(ctx)[1])
    assert again.status is Status.PASS and built == ["model_config"], again.summary
    assert again.summary.startswith(f"qwen3_5_text config parsed; built at the warm of key {key}")
    assert again.evidence["warm_key"] == key
    ctx.opts.rewarm = True
    model.model_config(ctx)
    assert built == ["model_config"] * 2
    # A plan (--warm-plan) on a cold key parses the config and leaves the build to the warm of the key; the
    # same cold key without --warm-plan builds it.
    ctx.opts.rewarm, ctx.opts.warm_plan = False, True
    ctx.opts.seq_lens = [4096]  # another key: cold here
    plan = model.model_config(ctx)
    assert plan.status is Status.PASS and built == ["model_config"] * 2, plan.summary
    assert plan.summary == "qwen3_5_text config parsed; a warm plan leaves the build to the warm of its key"
    assert ctx.facts["model"]["config"] == plan.evidence["config"]  # the warm probe's key is made from it
    ctx.opts.warm_plan = False
    model.model_config(ctx)
    assert built == ["model_config"] * 3
    # No GPU to warm on: parsed only. A cluster cache holding the key: installed, so parsed only; one that
    # lacks it: this run warms, so it builds the config.
    ctx.opts.expect_gpu = False
    no_gpu = model.model_config(ctx)
    assert no_gpu.summary.endswith(
        "config parsed; no GPU expected: nothing is warmed here, and the warm of its key builds it"
    )
    ctx.opts.expect_gpu = True
    share = tmp_path / "share"
    share.mkdir()
    ctx.opts.warm_share = str(share)
    model.model_config(ctx)
    assert built == ["model_config"] * 4
    key = warm.cache_key(warm_probe.setup(ctx)[1])
    (share / f"{key}.tar.gz").write_bytes(b"")
    (share / f"{key}.json").write_text("{}")
    held = model.model_config(ctx)
    assert held.status is Status.PASS and built == ["model_config"] * 4, held.summary
    assert held.summary.endswith(
        f"the cluster's cache holds key {key}: installed here, built where it was warmed"
    )
