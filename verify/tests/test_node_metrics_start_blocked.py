"""The node's collector exports the GPU hookscript's refused starts (one status file per vmid, written by
the gpu_boot role's hookscript) as mlstack_ct_start_blocked{vmid,reason}; a file that is not one (a name
that is no vmid, a reason that is no word) cannot inject a label."""

from __future__ import annotations

from pathlib import Path

from mlstack_doctor.ops import node_metrics
from test_metrics import parse_strict


def test_each_refused_start_is_a_series(tmp_path: Path) -> None:
    (tmp_path / "301").write_text("reason=module_load_failed\nmessage=CT 301 not started: ...\n")
    (tmp_path / "300").write_text('reason=x"} 1\nmessage=planted\n')
    (tmp_path / ".302.tmp").write_text("reason=device_missing\n")
    text = node_metrics.render_node([], 1.0, node_metrics.blocked_starts(str(tmp_path)))
    parse_strict(text)
    assert 'mlstack_ct_start_blocked{vmid="300",reason="unknown"} 1' in text
    assert 'mlstack_ct_start_blocked{vmid="301",reason="module_load_failed"} 1' in text
    assert "302" not in text


def test_no_folder_is_no_series(tmp_path: Path) -> None:
    assert node_metrics.blocked_starts(str(tmp_path / "absent")) == []


def test_the_collector_writes_them(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.mkdir()
    (status / "305").write_text("reason=driver_version_changed\n")
    out = tmp_path / "node.prom"
    args = ["--out", str(out), "--containers", "", "--start-status-dir", str(status)]
    assert node_metrics.main(args, reader=lambda v: "") == 0
    assert 'mlstack_ct_start_blocked{vmid="305",reason="driver_version_changed"} 1' in out.read_text()
