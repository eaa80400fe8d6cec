"""Each stack fact lives once: the profiles are the folders under profiles/ (stack_facts.list_profiles), the
default profile is policy.yml's, the purposes and the rules' evaluation are stack_facts' (the doctor's
facts/stack.py, copied). A profile folder dropped in is a profile everywhere, with no code changed; the
roles, the docs and the doctor state none of these facts again."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml
from ansible_collections.mlstack.pve.plugins.module_utils import inventory_check, stack_facts
from ansible_collections.mlstack.pve.plugins.module_utils import stack_policy as sp
from ansible_collections.mlstack.pve.plugins.module_utils.stack_packages import STACK
from mlstack_doctor import profile as prof

REPO = Path(__file__).resolve().parents[4]
PROFILES = REPO / "profiles"
NEW = "torch299-dropped-in"
H200 = [{"index": 0, "name": "NVIDIA H200", "uuid": "GPU-0", "compute_cap": "9.0"}]


@pytest.fixture
def dropped_in(tmp_path: Path) -> Path:
    """A copy of profiles/ with one more profile folder (the default's files under a new name)."""
    profiles = tmp_path / "profiles"
    shutil.copytree(PROFILES, profiles)
    default = yaml.safe_load((PROFILES / "policy.yml").read_text())["default_profile"]
    shutil.copytree(PROFILES / default, profiles / NEW)
    return profiles


def test_the_profiles_are_the_folders_holding_a_profile_yml() -> None:
    folders = sorted(p.parent.name for p in PROFILES.glob(f"*/{stack_facts.PROFILE_FILES[0]}"))
    assert stack_facts.list_profiles(str(PROFILES)) == folders and len(folders) >= 4


def test_a_profile_dropped_in_is_known_to_the_collection(dropped_in: Path) -> None:
    where = str(dropped_in)
    assert NEW in stack_facts.list_profiles(where) == sp.list_profiles(where)
    assert inventory_check.known_profiles(where) == stack_facts.list_profiles(where)
    assert inventory_check.profiles_exist([{"vmid": 7, "profile": NEW}], where) == []
    choice = sp.choose_stack(H200, {"vmid": 7, "profile": NEW}, where)
    assert (choice["profile"], choice["refused"]) == (NEW, None)
    out = dropped_in.parent / "shipped_profiles.json"
    assert sp.write_shipped(where, str(out), STACK) and NEW in json.loads(out.read_text())["profiles"]
    assert not sp.write_shipped(where, str(out), STACK), "an unchanged file is left as it is"


def test_a_profile_dropped_in_is_known_to_the_doctor(
    dropped_in: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prof, "CHECKOUT_PROFILES", dropped_in)
    prof.shipped_data.cache_clear()
    try:
        assert NEW in prof.shipped() and prof.load(NEW).name == NEW
        assert prof.shipped_data() == sp_shipped(dropped_in), "the doctor and the collection read one way"
    finally:
        prof.shipped_data.cache_clear()


def sp_shipped(profiles: Path) -> dict[str, Any]:
    """What the collection's wheel build writes for the doctor, read back."""
    out = profiles.parent / "written.json"
    sp.write_shipped(str(profiles), str(out), STACK)
    return json.loads(out.read_text())


@pytest.mark.parametrize("lacks", ["uv.lock", "pyproject.toml"])
def test_a_profile_folder_lacking_a_file_is_an_error_naming_it(dropped_in: Path, lacks: str) -> None:
    (dropped_in / NEW / lacks).unlink()
    with pytest.raises(ValueError, match=f"{NEW}: a stack profile needs .* it lacks {lacks}"):
        stack_facts.list_profiles(str(dropped_in))
    said = inventory_check.profiles_exist([{"vmid": 7, "profile": NEW}], str(dropped_in))
    assert len(said) == 1 and f"it lacks {lacks}" in said[0]


def test_a_default_profile_that_is_no_profile_is_refused(dropped_in: Path) -> None:
    policy = yaml.safe_load((dropped_in / "policy.yml").read_text())
    (dropped_in / "policy.yml").write_text(yaml.safe_dump({**policy, "default_profile": "torch99"}))
    with pytest.raises(ValueError, match="default_profile 'torch99' is not a stack profile"):
        sp.load_policy(str(dropped_in))


def _strings(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [s for k, v in node.items() for s in _strings(k) + _strings(v)]
    if isinstance(node, list):
        return [s for v in node for s in _strings(v)]
    return [node] if isinstance(node, str) else []


ROLE_FILES = sorted(
    p
    for pattern in ("roles/*/defaults/*.yml", "roles/*/vars/*.yml", "roles/*/meta/argument_specs.yml")
    for p in REPO.glob(pattern)
)


@pytest.mark.parametrize("path", ROLE_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_role_states_a_profile(path: Path) -> None:
    """A role's defaults, vars and spec name no profile: the default is policy.yml's, read where needed."""
    named = set(_strings(yaml.safe_load(path.read_text()))) & set(stack_facts.list_profiles(str(PROFILES)))
    assert named == set(), f"{path.relative_to(REPO)} names {sorted(named)}: read profiles/policy.yml instead"


def test_ml_venv_defaults_to_the_policys_default_profile() -> None:
    defaults = yaml.safe_load((REPO / "roles/ml_venv/defaults/main.yml").read_text())
    assert "policy.yml" in defaults["ml_venv_profile"] and ".default_profile" in defaults["ml_venv_profile"]


def test_the_doctor_ships_no_copy_of_profiles_in_the_checkout() -> None:
    """shipped_profiles.json is written by the wheel build, never kept in git beside profiles/."""
    tracked = subprocess.run(
        ["git", "ls-files", "verify/src/mlstack_doctor/shipped_profiles.json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert tracked.returncode != 0 or tracked.stdout.strip() == ""


def test_the_testbeds_doctor_finds_the_profiles_as_in_the_checkout() -> None:
    """gpu-passthrough-check mounts the doctor's sources and profiles/ as the checkout lays them out, where
    the doctor reads the shipped profiles (profile.CHECKOUT_PROFILES: profiles/ beside verify/src)."""
    from mlstack_testbed.gpucheck import cases

    module = PurePosixPath(cases.DOCTOR_MP) / "mlstack_doctor" / "profile.py"
    here = Path(prof.__file__).resolve()
    assert here.parents[3] / "profiles" == prof.CHECKOUT_PROFILES
    assert str(module.parents[3] / "profiles") == cases.PROFILES_MP


def test_the_docs_table_lists_every_profile_and_the_default() -> None:
    """docs/profiles.md's table of profiles is profiles/ and names policy.yml's default as the default."""
    text = (REPO / "docs" / "profiles.md").read_text()
    table = text.split("| profile |", 1)[1].split("\n\n", 1)[0]
    rows = {line.split("`")[1]: line for line in table.splitlines() if line.startswith("| `")}
    assert sorted(rows) == stack_facts.list_profiles(str(PROFILES))
    default = yaml.safe_load((PROFILES / "policy.yml").read_text())["default_profile"]
    assert [n for n, line in rows.items() if "(default)" in line] == [default]
