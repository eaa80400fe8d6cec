"""The stack policy through provision.yml on the testbed node reporting H200s (its nvidia-smi replays
a recorded H200 answer): a training container that explicitly asks for a stack whose FLA refuses the
backward on Hopper without tilelang is refused in the preflight, before anything exists (CT 121); an
inference container on that stack is accepted, and the plan says why (CT 141, planned only; the upgrade
of such a container, tests/provision/test_upgrade.py, runs beside the other steps on a node without a
driver)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from playbook_runner import PlaybookRun, container, make_runner, set_gpu_model

VMID = 121
# An inference container on that stack (test_upgrade.py provisions one): planned only (--check).
PLANNED = 141
OLD = "torch211-triton36"


def instead(said: str) -> list[str]:
    """The alternatives a refusal offers: its "Instead: A or B or C (source)."."""
    found = re.search(r"Instead: (.*?) \(https?://", said)
    return found.group(1).split(" or ") if found else []


def test_the_alternatives_are_read_from_the_instead_clause_only() -> None:
    why = "FLA raises ... Please install tilelang ... profile torch211-triton37-fla06 elsewhere."
    assert instead(f"{why} Instead: no profile here works on that GPU (https://x/640).") == [
        "no profile here works on that GPU"
    ]
    assert instead(f"{why} Instead: profile a or extras ['hopper'] (https://x/640).") == [
        "profile a",
        "extras ['hopper']",
    ]


@pytest.fixture(scope="module")
def h200_node(testbed: Any) -> Iterator[None]:
    set_gpu_model("h200")
    yield
    set_gpu_model(None)


@pytest.fixture(scope="module")
def refused(h200_node: None, tmp_path_factory: pytest.TempPathFactory) -> PlaybookRun:
    run = make_runner(tmp_path_factory.mktemp("policy"))
    entry = container(VMID, profile=OLD, extras=[], purpose="training")
    return run("provision.yml", [entry], timeout=600)


def test_refused_before_any_change(refused: PlaybookRun, api: Any, testbed: Any) -> None:
    from proxmoxer.core import ResourceException

    assert refused.rc != 0
    assert refused.changed() == 0, refused.changed_tasks()
    # Failed in the preflight play: the node was never prepared, the container never created.
    assert "Create the container through the PVE API" not in refused.output
    with pytest.raises(ResourceException):
        api.nodes(testbed.node).lxc(VMID).status.current.get()


def test_refusal_names_the_gpu_and_the_alternative(refused: PlaybookRun) -> None:
    said = " ".join(refused.output.split())
    assert f"{VMID}" in said and "torch211-triton36" in said
    assert "H200" in said and "sm_90" in said, said[-3000:]
    # What to choose instead: the profile that trains on Hopper without tilelang, and the extra. (The why
    # names tilelang in any case: FLA's own words.)
    choices = instead(said)
    assert "profile torch211-triton37-fla06" in choices, said[-3000:]
    assert any(c.startswith("extras [") for c in choices), choices
    assert "Nothing was changed." in said


@pytest.fixture(scope="module")
def accepted(h200_node: None, tmp_path_factory: pytest.TempPathFactory) -> PlaybookRun:
    run = make_runner(tmp_path_factory.mktemp("policy-accepted"))
    entry = container(PLANNED, profile=OLD, extras=[], purpose="inference")
    return run("provision.yml", [entry], timeout=600, flags=("--check", "--diff"))


def test_the_old_stack_is_accepted_for_inference(accepted: PlaybookRun, api: Any, testbed: Any) -> None:
    from proxmoxer.core import ResourceException

    said = " ".join(accepted.output.split())
    assert accepted.rc == 0, said[-4000:]
    assert "testbed: 8 GPU(s): NVIDIA H200 (sm_90)" in said
    accepted_line = f"CT {PLANNED}: profile {OLD}, extras [], purpose inference, GPUs sm_90."
    assert accepted_line in said, said[-4000:]
    # A plan: the container was not made.
    with pytest.raises(ResourceException):
        api.nodes(testbed.node).lxc(PLANNED).status.current.get()
