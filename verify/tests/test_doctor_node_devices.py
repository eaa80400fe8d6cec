"""The doctor against this machine's own NVIDIA device nodes, for real: none, or nodes without a driver (the
testbed's dummy nodes, which `testbed up` makes and its tests remove and make again). `make test` runs
this file in a step that shares the testbed's node (tests/lanes.py), after the testbed is up and never
beside a step that changes its device nodes; the unit tests run beside those steps.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from doctor_testlib import gpu_nodes_state, run_doctor

pytestmark = pytest.mark.slow


def test_expect_gpu_without_gpu_names_the_node_problem(torch_venv: Path, matching_lock: Path) -> None:
    state = gpu_nodes_state()
    if state == "ok":
        pytest.skip("this machine has a working NVIDIA driver")
    run = run_doctor("--profile", str(matching_lock), python=str(torch_venv))
    assert run.rc == 1
    expected = {"none": "NVIDIA_NODE_MISSING", "no_driver": "NVIDIA_NO_DRIVER"}[state]
    assert run.root and run.root["probe"] == "nvidia_device_nodes" and run.root["code"] == expected
    for name in ("nvidia_driver", "torch_cuda", "triton_target", "fla_kernel", "gdn_backward"):
        p = run.probe(name)
        assert p["status"] == "skip" and p["skipped_by"] == "nvidia_device_nodes", p


def test_no_gpu_with_dummy_nodes_warns(torch_venv: Path, matching_lock: Path) -> None:
    if gpu_nodes_state() != "no_driver":
        pytest.skip("needs NVIDIA device nodes without a driver (the testbed's dummy nodes)")
    run = run_doctor("--no-gpu", "--profile", str(matching_lock), python=str(torch_venv))
    p = run.probe("nvidia_device_nodes")
    assert run.rc == 0 and p["status"] == "warn" and p["code"] == "NVIDIA_NO_DRIVER"
