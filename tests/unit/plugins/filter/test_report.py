from __future__ import annotations

from ansible_collections.mlstack.pve.plugins.filter.report import stage_verdicts


def test_worst_status_wins_and_order_is_kept() -> None:
    probes = [
        {"stage": "host", "status": "pass"},
        {"stage": "host", "status": "warn"},
        {"stage": "toolchain", "status": "pass"},
        {"stage": "toolchain", "status": "fail"},
        {"stage": "gpu", "status": "skip"},
    ]
    assert stage_verdicts(probes) == {"host": "warn", "toolchain": "fail", "gpu": "skip"}
    assert list(stage_verdicts(probes)) == ["host", "toolchain", "gpu"]
