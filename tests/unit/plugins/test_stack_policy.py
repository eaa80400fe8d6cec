"""The stack policy replayed over recorded nvidia-smi answers and this repository's real profiles.

tests/data/nvidia-smi/*.csv are answers to `nvidia-smi --query-gpu=index,name,uuid,compute_cap
--format=csv,noheader` in nvidia-smi's exact format (", " between fields), reconstructed for the GPU models
(names and compute capabilities as NVIDIA reports them, UUIDs made up); the testbed's stand-in nvidia-smi
replays the same files.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible_collections.mlstack.pve.plugins.filter.stack_policy import stack_choice
from ansible_collections.mlstack.pve.plugins.module_utils import stack_policy as sp
from ansible_collections.mlstack.pve.plugins.module_utils.nvidia_facts import parse_nvidia_smi_csv

REPO = Path(__file__).resolve().parents[3]
PROFILES = REPO / "profiles"
RECORDED = REPO / "tests" / "data" / "nvidia-smi"
DEFAULT = "torch211-triton37-fla06"


def recorded(name: str) -> list[dict[str, Any]]:
    return parse_nvidia_smi_csv((RECORDED / f"{name}.csv").read_text())


@pytest.mark.parametrize(
    ("name", "count", "model", "arch"),
    [
        ("h200", 8, "NVIDIA H200", "sm_90"),
        ("h100-pcie", 2, "NVIDIA H100 PCIe", "sm_90"),
        ("b200", 8, "NVIDIA B200", "sm_100"),
        ("rtx-pro-6000", 8, "NVIDIA RTX PRO 6000 Blackwell Server Edition", "sm_120"),
        ("v100", 4, "Tesla V100-SXM2-32GB", "sm_70"),
    ],
)
def test_recorded_answers_parse(name: str, count: int, model: str, arch: str) -> None:
    gpus = recorded(name)
    assert [g["index"] for g in gpus] == list(range(count))
    assert {g["name"] for g in gpus} == {model}
    assert {sp.arch_of(g["compute_cap"]) for g in gpus} == {arch}
    assert all(re.fullmatch(r"GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", g["uuid"]) for g in gpus)


@pytest.mark.parametrize(
    ("profile", "extras"), [(None, []), ("torch211-triton36", ["hopper"]), ("torch211-triton37", ["hopper"])]
)
def test_the_answer_recorded_on_the_lent_h200_through_the_policy(
    profile: str | None, extras: list[str]
) -> None:
    """nvidia-smi's own answer on the H200 the profiles were proven on (2026-12-01)."""
    gpus = recorded("h200-recorded")
    assert [(g["name"], sp.arch_of(g["compute_cap"])) for g in gpus] == [("NVIDIA H200", "sm_90")]
    entry = {"vmid": 200, "gpus": "all", **({"profile": profile} if profile else {})}
    choice = stack_choice(gpus, entry, str(PROFILES))
    assert (choice["profile"], choice["extras"], choice["refused"]) == (profile or DEFAULT, extras, None)


def test_lines_that_are_not_gpu_rows_are_skipped() -> None:
    text = "WARNING: infoROM is corrupted at gpu 0000:17:00.0\n0, NVIDIA H200, GPU-1, 9.0\n\n"
    assert parse_nvidia_smi_csv(text) == [
        {"index": 0, "name": "NVIDIA H200", "uuid": "GPU-1", "compute_cap": "9.0"}
    ]


@pytest.mark.parametrize(
    ("cap", "arch"),
    [("9.0", "sm_90"), ("10.0", "sm_100"), ("10.3", "sm_103"), ("12.0", "sm_120"), ("8.9", "sm_89")],
)
def test_arch_of(cap: str, arch: str) -> None:
    assert sp.arch_of(cap) == arch


CASES = [
    # (recorded answer, container, profile, extras, refused must contain, a reason must contain)
    ("h200", {}, DEFAULT, [], None, "the default"),
    (
        "h200",
        {"profile": "torch211-triton36"},
        "torch211-triton36",
        ["hopper"],
        None,
        "extra hopper (tilelang) added for training",
    ),
    (
        "h200",
        {"profile": "torch211-triton37"},
        "torch211-triton37",
        ["hopper"],
        None,
        "hopper-fla640-any-triton",
    ),
    (
        "h200",
        {"profile": "torch211-triton36", "purpose": "inference"},
        "torch211-triton36",
        [],
        None,
        "concerns training only",
    ),
    (
        "h200",
        {"profile": "torch211-triton36", "extras": ["hopper"]},
        "torch211-triton36",
        ["hopper"],
        None,
        "set in the inventory, is needed",
    ),
    (
        "h200",
        {"profile": "torch211-triton36", "extras": []},
        "torch211-triton36",
        [],
        "NVIDIA H200 (sm_90)",
        None,
    ),
    ("h100-pcie", {"profile": DEFAULT, "extras": []}, DEFAULT, [], None, "set in the inventory"),
    ("b200", {}, DEFAULT, [], None, "note: blackwell-triton-lt-3-8"),
    (
        "b200",
        {"profile": "torch211-triton36"},
        "torch211-triton36",
        [],
        None,
        "warning: blackwell-wy-bwd-autotune",
    ),
    ("rtx-pro-6000", {}, DEFAULT, [], None, "NVIDIA RTX PRO 6000 Blackwell Server Edition (sm_120)"),
    (
        "rtx-pro-6000",
        {"profile": "torch211-triton36", "extras": ["hopper"]},
        "torch211-triton36",
        ["hopper"],
        None,
        "warning: blackwell-tilelang-fla051",
    ),
    (
        "rtx-pro-6000",
        {"profile": "torch211-triton36", "purpose": "inference"},
        "torch211-triton36",
        [],
        None,
        "warning: blackwell-fwd-h-race",
    ),
    ("v100", {}, DEFAULT, [], "Tesla V100-SXM2-32GB (sm_70)", None),
    ("v100", {"purpose": "inference"}, DEFAULT, [], "cuda13-min-arch", None),
    (
        "mixed",
        {"profile": "torch211-triton37"},
        "torch211-triton37",
        ["hopper"],
        None,
        "mixed architectures sm_89, sm_90, sm_120",
    ),
    ("mixed", {}, DEFAULT, [], None, "warning: mixed architectures"),
    ("", {}, DEFAULT, [], None, "GPU architecture unknown"),
    (
        "",
        {"profile": "torch211-triton36", "extras": []},
        "torch211-triton36",
        [],
        None,
        "GPU architecture unknown",
    ),
]


@pytest.mark.parametrize(("answer", "entry", "profile", "extras", "refused", "reason"), CASES)
def test_choice(
    answer: str,
    entry: dict[str, Any],
    profile: str,
    extras: list[str],
    refused: str | None,
    reason: str | None,
) -> None:
    gpus = recorded(answer) if answer else []
    choice = stack_choice(gpus, {"vmid": 210, "hostname": "ml-210", "gpus": "all", **entry}, str(PROFILES))
    assert (choice["profile"], choice["extras"]) == (profile, extras)
    assert choice["purpose"] == entry.get("purpose", "training")
    assert choice["explicit"] == {"profile": "profile" in entry, "extras": "extras" in entry}
    assert choice["archs"] == sorted(
        {sp.arch_of(g["compute_cap"]) for g in gpus}, key=lambda a: int(a[3:-1]) * 10 + int(a[-1])
    )
    assert all("\n" not in r for r in choice["reasons"])
    if refused is None:
        assert choice["refused"] is None
    else:
        assert (
            choice["refused"]
            and refused in choice["refused"]
            and "container 210 (ml-210)" in choice["refused"]
        )
    if reason is not None:
        assert any(reason in r for r in choice["reasons"]), choice["reasons"]


def test_hopper_training_without_tilelang_is_refused_with_what_to_choose() -> None:
    choice = stack_choice(
        recorded("h200"), {"vmid": 201, "profile": "torch211-triton36", "extras": []}, str(PROFILES)
    )
    msg = choice["refused"]
    assert msg.startswith("container 201: NVIDIA H200 (sm_90), fla-core 0.5.1, triton 3.6.0")
    assert "#640" in msg and "provide no tilelang" in msg
    # What works instead: the profile that needs no extra there, the extra, or inference.
    assert f"Instead: profile {DEFAULT} or " in msg
    assert "or extras ['hopper'] or purpose: inference" in msg
    assert "torch211-triton37 " not in msg  # it locks FLA 0.5.1 too: no cure without tilelang


def test_unsupported_arch_names_no_profile_as_a_cure() -> None:
    msg = stack_choice(recorded("v100"), {"vmid": 9}, str(PROFILES))["refused"]
    assert "Instead: a GPU of compute capability 7.5 or newer" in msg
    assert "profile torch211" not in msg.split("Instead:")[1]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            {"profile": "torch99"},
            f"container 7: profile 'torch99' is not a stack profile in {PROFILES}; "
            f"known: torch211-triton36, torch211-triton37, {DEFAULT}",
        ),
        ({"purpose": "train"}, "container 7: purpose 'train' is not one of training, inference"),
        (
            {"profile": DEFAULT, "extras": ["hopper"]},
            f"container 7: profile {DEFAULT} has no extra hopper; its extras: tilelang",
        ),
        ({"extras": "tilelang"}, "container 7: extras must be a list of extra names"),
    ],
)
def test_bad_input_is_a_filter_error_naming_the_container(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(AnsibleFilterError) as e:
        stack_choice(recorded("h200"), {"vmid": 7, **entry}, str(PROFILES))
    assert message in str(e.value)


def test_rules_read_the_lock_not_the_profile_name(tmp_path: Path) -> None:
    """A profile named like the new default but locking FLA 0.5.1 still needs tilelang on Hopper; one with
    no tilelang extra is refused, naming what would work."""
    shutil.copy(PROFILES / "policy.yml", tmp_path / "policy.yml")
    shutil.copytree(PROFILES / DEFAULT, tmp_path / DEFAULT)
    shutil.copytree(PROFILES / "torch211-triton36", tmp_path / "fla06-lookalike")
    choice = stack_choice(recorded("h200"), {"vmid": 3, "profile": "fla06-lookalike"}, str(tmp_path))
    assert choice["extras"] == ["hopper"]
    pyproject = tmp_path / "fla06-lookalike" / "pyproject.toml"
    text = pyproject.read_text()
    pyproject.write_text(
        text[: text.index("[project.optional-dependencies]")] + text[text.index("[tool.uv]") :]
    )
    choice = stack_choice(recorded("h200"), {"vmid": 3, "profile": "fla06-lookalike"}, str(tmp_path))
    assert choice["extras"] == []
    assert "profile fla06-lookalike has no extra providing tilelang" in choice["refused"]
    assert f"Instead: profile {DEFAULT} or purpose: inference" in choice["refused"]


def _locked_in_text(lock_text: str, package: str) -> str:
    m = re.search(rf'^name = "{re.escape(package)}"\nversion = "([^"]+)"', lock_text, re.M)
    assert m, package
    return m.group(1)


@pytest.mark.parametrize("profile", sp.list_profiles(str(PROFILES)))
def test_locked_versions_are_read_from_uv_lock(profile: str) -> None:
    read = sp.read_profile(str(PROFILES), profile)
    text = (PROFILES / profile / "uv.lock").read_text()
    assert read["versions"] == {p: _locked_in_text(text, p) for p in sp.POLICY_PACKAGES}
    pyproject = (PROFILES / profile / "pyproject.toml").read_text()
    table = pyproject.split("[project.optional-dependencies]")[1].split("\n[")[0]
    assert read["extras"] == sorted(re.findall(r"^(\w+) = \[", table, re.M))
    assert read["tilelang_extras"] == [
        e for e in read["extras"] if re.search(rf'^{e} = \[.*"tilelang==', pyproject, re.M)
    ]


def test_the_lock_pins_what_the_readme_says() -> None:
    """The profiles the policy reasons about are the ones docs/profiles.md describes."""
    assert sp.read_profile(str(PROFILES), DEFAULT)["versions"]["triton"] == "3.7.1"
    assert sp.read_profile(str(PROFILES), "torch211-triton36")["versions"]["fla-core"] == "0.5.1"


def test_policy_rules_are_sourced_and_parse() -> None:
    policy = sp.load_policy(str(PROFILES))
    raw = yaml.safe_load((PROFILES / "policy.yml").read_text())
    assert policy["default_profile"] == DEFAULT and DEFAULT in sp.list_profiles(str(PROFILES))
    ids = [r["id"] for r in raw["rules"]]
    assert len(ids) == len(set(ids))
    for rule in raw["rules"]:
        assert rule["sources"] and all(re.fullmatch(r"https://\S+", s) for s in rule["sources"]), rule["id"]
        assert all(
            s.startswith("sm_") or s[:2] in (">=", "<=") or s[0] in "<>=" for s in rule["archs"].split(",")
        )
        for spec in rule["versions"].values():
            sp.version_in("1.0", spec)  # raises on a clause it cannot read
        if rule["action"] == "add_extra":
            assert rule["provides"] == "tilelang"


def test_the_docs_policy_table_lists_every_rule() -> None:
    section = (REPO / "docs" / "profiles.md").read_text()
    for rule in yaml.safe_load((PROFILES / "policy.yml").read_text())["rules"]:
        assert f"`{rule['id']}`" in section, rule["id"]
    assert f"`{DEFAULT}` (default)" in section


@pytest.mark.parametrize(
    ("version", "spec", "expected"),
    [
        ("3.6.0", ">=3.4.0,<3.7.1", True),
        ("3.7.1", ">=3.4.0,<3.7.1", False),
        ("2.11.0+cu130", ">=2.11", True),
        ("13.0.96", ">=13", True),
        ("0.5.1", "<0.5.2", True),
        ("0.6.0", "<0.6.0", False),
    ],
)
def test_version_ranges(version: str, spec: str, expected: bool) -> None:
    assert sp.version_in(version, spec) is expected


@pytest.mark.parametrize(
    ("arch", "spec", "expected"),
    [
        ("sm_90", ">=sm_90,<sm_100", True),
        ("sm_103", ">=sm_100,<sm_130", True),
        ("sm_89", ">=sm_90,<sm_100", False),
        ("sm_70", "<sm_75", True),
    ],
)
def test_arch_ranges(arch: str, spec: str, expected: bool) -> None:
    assert sp.arch_in(arch, spec) is expected


@pytest.mark.parametrize(
    ("answer", "entry", "absent"),
    [
        ("rtx-pro-6000", {"profile": "torch211-triton36"}, "blackwell-tilelang-fla051"),
        ("h200", {"profile": "torch211-triton36", "purpose": "inference"}, "hopper-tilelang-nvcc"),
        ("h200", {}, "hopper-fla640"),
    ],
)
def test_rules_that_do_not_apply_say_nothing(answer: str, entry: dict[str, Any], absent: str) -> None:
    choice = stack_choice(recorded(answer), {"vmid": 4, **entry}, str(PROFILES))
    assert not [r for r in choice["reasons"] if absent in r]


def test_through_ansible(tmp_path: Path) -> None:
    """The filter as a playbook calls it, on the recorded H200 answer: refused, and the message reaches
    the user."""
    import json
    import subprocess

    playbook = tmp_path / "choose.yml"
    playbook.write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.debug:\n"
        '        msg: "{{ gpus | mlstack.pve.stack_choice(container, profiles) | to_json }}"\n'
    )
    extra = {
        "gpus": recorded("h200")[:2],
        "container": {"vmid": 201, "profile": "torch211-triton36", "extras": [], "gpus": [0, 1]},
        "profiles": str(PROFILES),
    }
    r = subprocess.run(
        [
            REPO / ".venv" / "bin" / "ansible-playbook",
            "-i",
            "localhost,",
            "-c",
            "local",
            playbook,
            "-e",
            json.dumps(extra),
        ],
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "ANSIBLE_STDOUT_CALLBACK": "json", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads(r.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]["msg"]
    choice = json.loads(result) if isinstance(result, str) else result
    assert choice["profile"] == "torch211-triton36" and choice["archs"] == ["sm_90"]
    assert choice["refused"].startswith("container 201: NVIDIA H200 (sm_90)")
