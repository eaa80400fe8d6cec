"""The skips `make test` accepts (tests/lanes.py counts every skip of every step): a test that skips for
a reason not listed here, or where the listed condition does not hold on this machine, fails its step.

Each entry: the start of the skip's reason (a regular expression), why skipping there hides no
regression, and the condition of this machine it stands for, probed here, not by the code under test.
A missing test venv, a missing .deb, a missing package `make test` installs, a doctor that crashed, a
non-root run: none of these is on the list.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path


@cache
def nvidia_gpu_here() -> bool:
    """A working NVIDIA GPU: nvidia-smi lists one (the testbed's dummy nodes have no driver)."""
    try:
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0 and "GPU " in r.stdout


@cache
def venv_lacks_the_execution_environments_ansible() -> bool:
    """This Python's ansible-core is not the one execution-environment.yml installs."""
    pinned = re.search(
        r"package_pip: ansible-core==(\S+)",
        (Path(__file__).parents[1] / "execution-environment.yml").read_text(),
    )
    return pinned is None or importlib.metadata.version("ansible-core") != pinned.group(1)


@dataclass(frozen=True)
class Allowed:
    reason: str
    why: str
    holds: Callable[[], bool]


ALLOWED = (
    Allowed(
        r"no CUDA GPU",
        "a GPU test (verify/tests/test_gpu.py) on a machine without a GPU: no GPU code path to run",
        lambda: not nvidia_gpu_here(),
    ),
    Allowed(
        r"this machine has a working NVIDIA driver|needs NVIDIA device nodes without a driver",
        "the no-driver diagnoses need the testbed's dummy nodes; a real GPU's driver answers instead",
        nvidia_gpu_here,
    ),
    Allowed(
        r"only on a VM whose image carries /\.dockerenv",
        "the stray-/.dockerenv verdict needs that file, which only some VM images carry",
        lambda: not Path("/.dockerenv").exists(),
    ),
    Allowed(
        r"root ignores permission bits",
        "a mode-500 cache is unwritable only to a non-root user; as root the two other unwritable-cache "
        "cases (under a file, a read-only tmpfs) run",
        lambda: os.geteuid() == 0,
    ),
    Allowed(
        r"the execution environment is core\d+'s",
        "the execution environment's build context is checked on its own stack's Ansible and collections: "
        "where this venv holds the other stack, the second controller's step (<stack>-controller) runs it",
        venv_lacks_the_execution_environments_ansible,
    ),
    Allowed(
        r"CT 100 was there before these tests: kept",
        "the README's own container (`make provision`, by hand) is the user's: no test destroys it",
        lambda: True,
    ),
)


def allowed(reason: str) -> Allowed | None:
    """The entry that allows a skip with this reason on this machine, or None."""
    for entry in ALLOWED:
        if re.match(entry.reason, reason) and entry.holds():
            return entry
    return None
