"""`--model DIR`: the checkpoint's tensors are compared with the model its config.json builds, before any
load, from the safetensors headers alone. The checkpoints are real: written by transformers'
save_pretrained and by safetensors in the torch test venv, then read by the doctor run with that venv."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from doctor_testlib import SRC, run_doctor
from mlstack_doctor import safetensors_header
from mlstack_doctor.probes.model import load_report

TINY = SRC / "mlstack_doctor" / "configs" / "qwen3_5_tiny.json"

# One run of the venv's python: the tiny model saved whole and in shards, and checkpoints rewritten by
# safetensors itself (a tensor dropped; the multimodal layout of Qwen3.5's own checkpoints).
WRITE = r"""
import json, sys, torch, transformers
from pathlib import Path
from safetensors.torch import load_file, save_file
root, cfg_path = Path(sys.argv[1]), sys.argv[2]
raw = json.loads(Path(cfg_path).read_text())
raw["vocab_size"] = 1000  # a small embedding: the files stay small
cfg = transformers.AutoConfig.for_model(raw.pop("model_type"), **raw)
torch.manual_seed(0)
model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
model.save_pretrained(root / "good")
model.save_pretrained(root / "sharded", max_shard_size="1MB")
tensors = load_file(root / "good" / "model.safetensors")
def variant(name, state):
    (root / name).mkdir()
    shutil.copy(root / "good" / "config.json", root / name / "config.json")
    save_file(state, root / name / "model.safetensors", metadata={"format": "pt"})
import shutil
variant("no_norm", {k: v for k, v in tensors.items() if k != "model.norm.weight"})
mm = {k.replace("model.", "model.language_model.", 1): v for k, v in tensors.items()}
mm["model.visual.blocks.0.attn.qkv.weight"] = torch.zeros(8, 8, dtype=torch.bfloat16)
mm["mtp.fc.weight"] = torch.zeros(8, 8, dtype=torch.bfloat16)
variant("multimodal", mm)
variant("extra_layer", {**tensors, "model.layers.4.mlp.up_proj.weight": torch.zeros(512, 256)})
cfg.tie_word_embeddings = True  # lm_head is the embedding: save_pretrained leaves it out of the file
transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).save_pretrained(root / "tied")
"""


@pytest.fixture(scope="session")
def checkpoints(torch_venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("checkpoints")
    proc = subprocess.run(
        [str(torch_venv), "-c", WRITE, str(root), str(TINY)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return root


def _copy(checkpoints: Path, name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(checkpoints / name, tmp_path / name))


def _model_config(torch_venv: Path, folder: Path) -> dict:
    run = run_doctor("--no-gpu", "--only", "model_config", "--model", str(folder), python=str(torch_venv))
    return run.probe("model_config")


@pytest.mark.parametrize("name", ["good", "sharded", "multimodal", "tied"])
def test_checkpoints_that_fit_their_config_pass(
    torch_venv: Path, checkpoints: Path, tmp_path: Path, name: str
) -> None:
    """The multimodal one has Qwen3.5's `model.language_model.` prefix, a vision tower and MTP head
    (transformers renames the first and ignores the others on load); the tied one has no lm_head (the
    config ties it to the embedding): both fit as well."""
    folder = _copy(checkpoints, name, tmp_path)
    p = _model_config(torch_venv, folder)
    assert p["status"] == "pass", p
    check = p["evidence"]["weights_check"]
    assert check["compared"] and check["missing_count"] == check["mismatched_count"] == 0, check
    assert "tensors fit it" in p["summary"]
    if name == "multimodal":
        assert check["unexpected_count"] == 0 and check["unexpected_ignored"] == 2, check
    if name == "tied":  # the file holds no lm_head.weight; the config ties it to the embedding
        assert "lm_head.weight" not in safetensors_header.read_checkpoint(folder).tensors


def test_embedding_that_disagrees_with_config_is_named_at_the_quick_tier(
    torch_venv: Path, checkpoints: Path, tmp_path: Path
) -> None:
    folder = _copy(checkpoints, "good", tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["vocab_size"] = 1001  # config.json edited after the weights were written
    (folder / "config.json").write_text(json.dumps(cfg))
    p = _model_config(torch_venv, folder)
    assert p["status"] == "fail" and p["code"] == "MODEL_WEIGHTS_MISMATCH", p
    rows = {m["tensor"]: m for m in p["evidence"]["weights_check"]["mismatched"]}
    assert rows["model.embed_tokens.weight"]["checkpoint"] == [1000, 256]
    assert rows["model.embed_tokens.weight"]["model"] == [1001, 256]
    assert (
        "model.embed_tokens.weight is [1000, 256] in model.safetensors, the config builds [1001, 256]"
        in (p["summary"])
    )
    assert "huggingface-cli download" in p["fix"] and str(folder) in p["fix"]


def test_missing_tensor_is_named(torch_venv: Path, checkpoints: Path, tmp_path: Path) -> None:
    p = _model_config(torch_venv, _copy(checkpoints, "no_norm", tmp_path))
    assert p["code"] == "MODEL_WEIGHTS_MISMATCH", p
    assert p["evidence"]["weights_check"]["missing"] == ["model.norm.weight"]
    assert "1 tensor(s) the model needs are in no shard: model.norm.weight" in p["summary"]


def test_extra_tensor_is_named(torch_venv: Path, checkpoints: Path, tmp_path: Path) -> None:
    """A layer the config does not build (num_hidden_layers lowered in config.json): transformers would
    drop it with a warning and run a shallower model."""
    p = _model_config(torch_venv, _copy(checkpoints, "extra_layer", tmp_path))
    assert p["code"] == "MODEL_WEIGHTS_MISMATCH", p
    assert p["evidence"]["weights_check"]["unexpected"] == ["model.layers.4.mlp.up_proj.weight"]


def test_missing_shard_is_named_before_any_build(torch_venv: Path, checkpoints: Path, tmp_path: Path) -> None:
    folder = _copy(checkpoints, "sharded", tmp_path)
    index = json.loads((folder / safetensors_header.INDEX).read_text())
    gone = sorted(set(index["weight_map"].values()))[-1]
    (folder / gone).unlink()
    p = _model_config(torch_venv, folder)
    assert p["code"] == "MODEL_WEIGHTS_INCOMPLETE" and p["evidence"]["missing_shards"] == [gone], p
    assert "weights_check" not in p["evidence"]


def test_the_reader_gives_each_tensor_its_shape_dtype_and_file(checkpoints: Path) -> None:
    tensors = safetensors_header.read_checkpoint(checkpoints / "sharded").tensors
    index = json.loads((checkpoints / "sharded" / safetensors_header.INDEX).read_text())["weight_map"]
    assert {k: t["file"] for k, t in tensors.items()} == index
    assert tensors["model.embed_tokens.weight"]["shape"] == [1000, 256]
    assert {t["dtype"] for t in tensors.values()} == {"BF16"}


def test_a_failed_load_keeps_transformers_own_report(
    torch_venv: Path, checkpoints: Path, tmp_path: Path
) -> None:
    """The full tier's load fails with "look at the above report": the rows of that report, read from the
    loader's real stderr, name the tensor and both shapes (model_forward keeps them as evidence)."""
    folder = _copy(checkpoints, "good", tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["vocab_size"] = 1001
    (folder / "config.json").write_text(json.dumps(cfg))
    load = f"import transformers; transformers.AutoModelForCausalLM.from_pretrained({str(folder)!r})"
    proc = subprocess.run([str(torch_venv), "-c", load], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "ignore_mismatched_sizes" in proc.stderr, proc.stderr[-1500:]
    report = load_report(proc.stderr)
    assert report is not None, proc.stderr[-1500:]
    rows = {r["tensor"]: r for r in report["rows"]}
    assert rows["model.embed_tokens.weight"]["status"] == "MISMATCH"
    assert "[1000, 256]" in rows["model.embed_tokens.weight"]["detail"]
    assert "[1001, 256]" in rows["model.embed_tokens.weight"]["detail"]
