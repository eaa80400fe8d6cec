"""Gating with stub probes: the engine is the unit; the probes are stand-ins."""

from __future__ import annotations

import pytest
from mlstack_doctor import engine
from mlstack_doctor.context import Context, Options
from mlstack_doctor.record import Stage, Status, failed, passed


def _ctx(**kw: object) -> Context:
    return Context(Options(**kw))  # type: ignore[arg-type]


@pytest.fixture
def chain(monkeypatch: pytest.MonkeyPatch) -> None:
    probes = (
        engine.Probe(
            "a", Stage.HOST, lambda c: failed("a", Stage.HOST, "broken", "NVIDIA_NODE_MISSING", "fix a")
        ),
        engine.Probe("b", Stage.TORCH, lambda c: passed("b", Stage.TORCH, "ok"), ("a",)),
        engine.Probe("c", Stage.FLA, lambda c: passed("c", Stage.FLA, "ok"), ("b",)),
        engine.Probe("d", Stage.TOOLCHAIN, lambda c: passed("d", Stage.TOOLCHAIN, "ok")),
        engine.Probe("g", Stage.TORCH, lambda c: passed("g", Stage.TORCH, "ok"), gpu=True),
        engine.Probe("f", Stage.MODEL, lambda c: passed("f", Stage.MODEL, "ok"), min_tier="full"),
    )
    monkeypatch.setattr(engine, "PROBES", probes)


def test_failure_skips_dependants_with_root(chain: None) -> None:
    results = {r.name: r for r in engine.run(_ctx())}
    assert results["b"].status is Status.SKIP and results["b"].skipped_by == "a"
    assert results["c"].status is Status.SKIP and results["c"].skipped_by == "a"
    assert "root cause: a NVIDIA_NODE_MISSING" in results["c"].summary
    assert results["d"].status is Status.PASS
    assert "f" not in results  # full tier only
    summary = engine.summarize(list(results.values()))
    assert summary["root_cause"]["probe"] == "a" and summary["failed"] == 1 and not summary["ok"]


def test_no_gpu_skips_gpu_probes(chain: None) -> None:
    results = {r.name: r for r in engine.run(_ctx(expect_gpu=False, tier="full"))}
    assert results["g"].summary == "no GPU expected (--no-gpu)"
    assert results["f"].status is Status.PASS


def test_only_ignores_unlisted_prerequisites(chain: None) -> None:
    results = engine.run(_ctx(only=["c"]))
    assert [r.name for r in results] == ["c"] and results[0].status is Status.PASS


def test_real_probe_table_is_ordered_and_closed() -> None:
    names = [p.name for p in engine.PROBES]
    for i, p in enumerate(engine.PROBES):
        for dep in p.requires:
            assert dep in names[:i], f"{p.name} requires {dep}, which must come first"
