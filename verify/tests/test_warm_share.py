"""The cluster's warm cache: a key warmed on one node is published once and installed, checked, on the
next node of the same key instead of warmed; what is refused (another key, a corrupt or partial tarball,
an unloadable file, a failed warm) warms locally and says why."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path
from typing import Any

import pytest
from mlstack_doctor import cli, engine
from mlstack_doctor.cache import kernel_cache, warm, warm_share
from mlstack_doctor.context import Context, Options
from mlstack_doctor.files import sha256_of
from mlstack_doctor.probes import warm as warm_probe
from mlstack_doctor.record import Status
from test_kernel_cache import entry
from test_warm import CONFIGS, H200, REFUSAL, VERSIONS, FakeSession

B200 = [{"index": 0, "name": "NVIDIA B200", "compute_capability": "10.0"}]


class TritonSession(FakeSession):
    """Answers the warm request as the worker does, writing a real Triton 3.x entry (group file with
    absolute child paths, metadata, an ELF binary) and the autotune result FLA keeps."""

    def new_entry(self) -> Path:
        return entry(self.cache, f"k{len(self.calls)}")


def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, gpus=H200, **opts: Any) -> Context:
    """A container of one node: its own Triton cache (a path of its own), the cluster's share."""
    cache = tmp_path / name / "triton" / "torch211-triton37-fla06-b88c5182afad"
    cache.mkdir(parents=True)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(warm_probe, "installed", VERSIONS.get)
    c = Context(Options(tier="warm", model="27b", warm_share=str(tmp_path / "share"), **opts))
    c.facts.update(model={"config": str(CONFIGS / "qwen3_5_27b.json")}, nvml_gpus=gpus)
    c.session = TritonSession(cache)  # type: ignore[assignment]
    return c


@pytest.fixture
def published(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Node 1 warmed the key and published it."""
    first = warm_probe.triton_warm(node(tmp_path, monkeypatch, "node1"))
    assert first.status is Status.PASS and first.evidence["action"] == "warmed", first.summary
    return first.evidence


def test_the_first_warm_publishes_its_key_with_the_stamp(published: dict[str, Any], tmp_path: Path) -> None:
    key = published["key"]
    assert published["published"] == str(tmp_path / "share" / f"{key}.tar.gz")
    manifest = json.loads((tmp_path / "share" / f"{key}.json").read_text())
    assert manifest["key"] == key and warm.cache_key(manifest["parts"]) == key
    with tarfile.open(published["published"]) as tar:
        names = tar.getnames()
    assert f"mlstack-warm/{key}.json" in names and any(n.endswith("k1.cubin") for n in names)


def test_the_next_node_installs_it_and_skips_the_warm(
    published: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = node(tmp_path, monkeypatch, "node2")
    r = warm_probe.triton_warm(ctx)
    key, artifact = published["key"], tmp_path / "share" / f"{published['key']}.tar.gz"
    assert r.status is Status.PASS and r.evidence["action"] == "installed"
    assert r.summary.startswith(f"skipped: installed from the cluster's cache {artifact}, key {key}")
    assert not ctx.session.calls  # type: ignore[union-attr]
    cache = Path(r.evidence["cache_dir"])
    grp = next(cache.rglob("__grp__k1.json"))  # Triton's group file points into THIS cache now
    assert all(p.startswith(str(cache) + "/") for p in json.loads(grp.read_text())["child_paths"].values())
    assert kernel_cache.scan(str(cache))["bad"] == {}
    again = warm_probe.triton_warm(ctx)  # the key check accepts what was installed; nothing installed over it
    assert again.evidence["action"] == "skipped" and again.summary.startswith(
        "skipped: cache key already warm"
    )


def test_a_node_already_warm_is_never_installed_over(published: dict[str, Any], tmp_path: Path) -> None:
    cache = Path(published["cache_dir"])
    with pytest.raises(warm_share.Refused, match="already holds a warm stamp"):
        warm_share.install(tmp_path / "share", published["key"], published["key_parts"], cache)


def _repack(artifact: Path, tmp_path: Path, add: tuple[str, bytes] | None = None, drop: str = "") -> None:
    """Rewrite the tarball (and its manifest's sha256, as a publisher would): with a member added or one
    whose name ends with `drop` left out."""
    src = tmp_path / "orig.tar.gz"
    artifact.rename(src)
    with tarfile.open(src) as old, tarfile.open(artifact, "w:gz") as new:
        for m in old.getmembers():
            if not (drop and m.name.endswith(drop)):
                new.addfile(m, old.extractfile(m))
        if add:
            extra = tmp_path / "extra"
            extra.write_bytes(add[1])
            new.add(extra, arcname=add[0])
    manifest = artifact.with_suffix("").with_suffix(".json")
    doc = json.loads(manifest.read_text())
    doc["sha256"] = sha256_of(artifact)
    manifest.write_text(json.dumps(doc))


def _cut(a: Path, tmp_path: Path) -> None:
    a.write_bytes(a.read_bytes()[: a.stat().st_size // 2])


def _garbage(a: Path, tmp_path: Path) -> None:
    a.write_bytes(b"not a tarball" * 100)


def _bad_binary(a: Path, tmp_path: Path) -> None:
    with tarfile.open(a) as t:
        name = next(n for n in t.getnames() if n.endswith("k1.cubin"))
    _repack(a, tmp_path, drop="k1.cubin", add=(name, b"\x7fELF" + b"\x00" * 10))


@pytest.mark.parametrize(
    "damage,why",
    [
        (_cut, "is corrupt or partial"),
        (_garbage, "is corrupt or partial"),
        (lambda a, t: _repack(a, t, add=("../../etc/cron.d/x", b"x")), "lies outside the cache"),
        (lambda a, t: _repack(a, t, add=("NOTNAMED/x.json", b"{}")), "belongs to no entry the stamp names"),
        (lambda a, t: _repack(a, t, drop=".json"), "carries no stamp"),
        (
            _bad_binary,
            "cannot be loaded: H35EW22PQ25OHHVRS7SC5WXSYCGYAT5DONP5QNVPQSIDZUMGK1: k1.cubin: not a 64-bit",
        ),
    ],
    ids=["partial", "garbage", "escape", "unnamed", "no-stamp", "bad-binary"],
)
def test_a_bad_artifact_is_refused_and_the_node_warms_locally(
    published: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage, why: str
) -> None:
    damage(tmp_path / "share" / f"{published['key']}.tar.gz", tmp_path)
    ctx = node(tmp_path, monkeypatch, "node2")
    r = warm_probe.triton_warm(ctx)
    assert why in r.evidence["share_refused"] and r.evidence["share_refused"].endswith(": warming locally")
    assert r.status is Status.PASS and r.evidence["action"] == "warmed" and len(ctx.session.calls) == 1  # type: ignore[union-attr]
    cache = Path(r.evidence["cache_dir"])
    assert not (cache / warm_share.INCOMING).exists() or not any((cache / warm_share.INCOMING).iterdir())


def test_another_gpu_is_another_key_and_warms_locally_saying_so(
    published: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = warm_probe.triton_warm(node(tmp_path, monkeypatch, "node3", gpus=B200))
    assert r.evidence["action"] == "warmed" and r.evidence["key"] != published["key"]
    note = r.evidence["share_note"]
    assert (
        f"the nearest, {published['key']}, differs: gpu: ['NVIDIA H200 sm_90'] -> ['NVIDIA B200 sm_100']"
        in note
    )
    assert r.evidence["published"].endswith(f"{r.evidence['key']}.tar.gz")  # the cluster now holds both keys


def test_a_manifest_of_other_parts_under_this_key_is_refused(
    published: dict[str, Any], tmp_path: Path
) -> None:
    other = {**published["key_parts"], "shapes": {"seq_lens": [4096], "batch": 1}}
    with pytest.raises(warm_share.Refused, match=r"warmed for other key parts: shapes\.seq_lens"):
        warm_share.install(tmp_path / "share", published["key"], other, tmp_path / "elsewhere")


@pytest.mark.parametrize("error", [REFUSAL, "OutOfMemoryError: CUDA out of memory."], ids=["refused", "oom"])
def test_a_warm_that_did_not_pass_is_never_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: str
) -> None:
    ctx = node(tmp_path, monkeypatch, "node1")
    ctx.session = TritonSession(Path(warm_probe.cache_dir()), error)  # type: ignore[assignment]
    r = warm_probe.triton_warm(ctx)
    assert r.status is not Status.PASS and "published" not in r.evidence
    assert not list((tmp_path / "share").glob("*.tar.gz"))


def test_an_entry_that_cannot_be_loaded_is_not_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = node(tmp_path, monkeypatch, "node1")
    ctx.opts.warm_share = None
    first = warm_probe.triton_warm(ctx)  # warmed without a share, then an entry is damaged
    cache = Path(first.evidence["cache_dir"])
    next(cache.rglob("k1.cubin")).write_bytes(b"")
    with pytest.raises(warm_share.Refused, match=r"cannot be loaded .*empty"):
        warm_share.pack(cache, first.evidence["key"], tmp_path / "share")


def test_a_warm_key_the_share_lacks_is_published_by_the_next_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = node(tmp_path, monkeypatch, "node1")
    ctx.opts.warm_share = None
    warm_probe.triton_warm(ctx)  # warmed before the cluster had a share
    ctx.opts.warm_share = str(tmp_path / "share")
    r = warm_probe.triton_warm(ctx)
    assert r.evidence["action"] == "skipped" and r.evidence["share_has_key"] and "published" in r.evidence
    assert "published" not in warm_probe.triton_warm(ctx).evidence  # once


def test_plan_installs_what_the_share_holds_and_never_warms(
    published: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cold = node(tmp_path, monkeypatch, "node3", gpus=B200, warm_plan=True)
    r = warm_probe.triton_warm(cold)
    assert r.evidence["action"] == "planned" and not cold.session.calls and not r.evidence["share_has_key"]  # type: ignore[union-attr]
    same = node(tmp_path, monkeypatch, "node2", warm_plan=True)
    assert warm_probe.triton_warm(same).evidence["action"] == "installed"


def test_the_node_share_is_inside_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = node(tmp_path, monkeypatch, "node1")
    ctx.opts.warm_share = ""
    r = warm_probe.triton_warm(ctx)
    assert r.evidence["share_dir"] == str(Path(r.evidence["cache_dir"]) / "mlstack-share")
    assert Path(r.evidence["published"]).parent == Path(r.evidence["share_dir"])
    assert "mlstack-share" not in warm.entries(r.evidence["cache_dir"])


@pytest.mark.parametrize(("share", "runs"), [(None, False), ("", True), ("/mnt/share", True)])
def test_without_a_gpu_the_warm_step_runs_only_for_the_share(share: str | None, runs: bool) -> None:
    probe = next(p for p in engine.PROBES if p.name == "triton_warm")
    ctx = Context(Options(tier="warm", expect_gpu=False, warm_share=share))
    ctx.facts["installed"] = dict.fromkeys(probe.needs_packages, "1")
    gated = engine.gate(ctx, probe)
    assert (gated is None) is runs
    if not runs:
        assert gated is not None and gated.summary == "no GPU expected (--no-gpu)"


def test_without_a_gpu_a_cold_key_is_checked_against_the_share_and_not_warmed(
    published: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = node(tmp_path, monkeypatch, "cpu", gpus=B200, expect_gpu=False)
    r = warm_probe.triton_warm(ctx)
    assert r.status is Status.SKIP and r.summary == "no GPU expected (--no-gpu)"
    assert "differs: gpu: ['NVIDIA H200 sm_90'] -> []" in r.evidence["share_note"]


def test_the_cli_records_the_share_only_when_given() -> None:
    p = cli.build_parser()
    assert p.parse_args(["--tier", "warm", "--warm-share"]).warm_share == ""
    assert p.parse_args(["--warm-share", "/mnt/s"]).warm_share == "/mnt/s"
    assert p.parse_args([]).warm_share is None and p.parse_args([]).warm_plan is False


def test_entries_another_container_of_the_node_moved_in_are_kept(
    published: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = node(tmp_path, monkeypatch, "node2")
    cache = Path(warm_probe.cache_dir())
    src = Path(published["cache_dir"])
    for name in warm.entries(src):  # the same content-addressed entries, there before this install
        shutil.copytree(src / name, cache / name)
    r = warm_probe.triton_warm(ctx)
    assert r.evidence["action"] == "installed" and warm.stamp_path(cache, published["key"]).is_file()
