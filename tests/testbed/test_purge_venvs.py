"""`testbed down --purge` removes each destroyed container's venvs from the nodes' shared uv store, as
destroy.yml does on a real node, and keeps uv's cache (the other containers' venvs are hard links into
it). Run on a store of its own: the shared testbed is never taken down here."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from mlstack_testbed import __main__ as cli

REPO = Path(__file__).resolve().parents[2]


def defaults(role: str) -> dict[str, str]:
    return yaml.safe_load((REPO / "roles" / role / "defaults" / "main.yml").read_text())


def test_the_folder_removed_is_the_one_the_container_builds_its_venvs_in() -> None:
    # The store is bound into the container at gpu_container_ct_uv_cache, where ml_venv builds the
    # container's venvs in venvs/ct<vmid>.
    assert defaults("gpu_container")["gpu_container_ct_uv_cache"] == defaults("ml_venv")["ml_venv_uv_store"]
    assert defaults("ml_venv")["ml_venv_venvs_dir"].startswith(
        "{{ ml_venv_uv_store }}/venvs/ct{{ proxmox_vmid"
    )
    store = Path(defaults("gpu_container")["gpu_container_uv_cache_dir"])
    assert cli.node_venvs_dir(100) == store / "venvs" / "ct100"


def test_purge_removes_the_containers_venvs_and_keeps_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "uv"
    role_defaults = tmp_path / "defaults.yml"
    role_defaults.write_text(yaml.safe_dump({"gpu_container_uv_cache_dir": str(store)}))
    monkeypatch.setattr(cli, "ROLE_DEFAULTS", role_defaults)
    cached = store / "cache" / "archive-v0" / "torch" / "__init__.py"
    cached.parent.mkdir(parents=True)
    cached.write_text("torch\n")
    for vmid in (100, 101):
        site = store / "venvs" / f"ct{vmid}" / "abc123" / "lib" / "python3.11" / "site-packages" / "torch"
        site.mkdir(parents=True)
        os.link(cached, site / "__init__.py")
    (store / "venvs" / "ct100" / "abc123.lock").write_text("")

    assert cli.remove_venvs(100) == f"its venvs {store}/venvs/ct100 removed"
    assert not (store / "venvs" / "ct100").exists()
    assert (store / "venvs" / "ct101" / "abc123").is_dir(), "another container's venvs were removed"
    assert cached.read_text() == "torch\n", "uv's cache was touched"
    assert cli.remove_venvs(100) == "", "a container without venvs has nothing to say"
