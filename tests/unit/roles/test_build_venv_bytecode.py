"""The venv builder's bytecode sharing (share_bytecode in roles/ml_venv/templates/build-venv.sh.j2, rendered
and run as the builder runs it) on real files: a new venv links the compiled modules of the siblings of its
lock that imported the most, not of the first ones it lists. A node's store often holds venvs built a
moment ago whose doctor has not run yet (they hold no bytecode) beside one that has."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import jinja2

ROOT = Path(__file__).resolve().parents[3]
BUILDER = ROOT / "roles" / "ml_venv" / "templates" / "build-venv.sh.j2"
NAME = "torch211-triton37-fla06-0123456789ab"
SITE = "lib/python3.11/site-packages"


def share_bytecode() -> str:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters["quote"] = shlex.quote
    text = env.from_string(BUILDER.read_text()).render(
        ansible_managed="managed", _ml_venv_uv="/nonexistent/uv", ml_venv_uv_cache_dir="/nonexistent"
    )
    found = re.findall(r"^(share_bytecode\(\) \{\n.*?\n^\})$", text, re.M | re.S)
    assert len(found) == 1, "the builder no longer defines share_bytecode()"
    return found[0]


def venv(path: Path, lock: str, store: Path, compiled: bool) -> Path:
    """A venv of `lock` whose torch/__init__.py is a hard link into `store` (as uv links it), with its
    compiled module when `compiled` (its doctor ran)."""
    torch = path / SITE / "torch"
    torch.mkdir(parents=True)
    os.link(store / "__init__.py", torch / "__init__.py")
    (path / ".mlstack-complete").write_text(f"{lock}  /profile/uv.lock\n")
    if compiled:
        (torch / "__pycache__").mkdir()
        (torch / "__pycache__" / "__init__.cpython-311.pyc").write_bytes(b"compiled")
    return path


def test_the_sibling_that_imported_the_most_is_linked_even_when_listed_last(tmp_path: Path) -> None:
    store = tmp_path / "uv-cache"
    store.mkdir()
    (store / "__init__.py").write_text("# torch\n")
    venvs = tmp_path / "venvs"
    # Listed first: three of the same lock that never imported torch, one of another lock that did.
    for ct in ("ct101", "ct102", "ct103"):
        venv(venvs / ct / NAME, "aaaa", store, compiled=False)
    venv(venvs / "ct104" / NAME, "bbbb", store, compiled=True)
    donor = venv(venvs / "ct160" / NAME, "aaaa", store, compiled=True)
    partial = venv(venvs / "ct190" / f"{NAME}.partial", "aaaa", store, compiled=False)
    (partial / "bin").mkdir()
    (partial / "bin" / "python").symlink_to(sys.executable)
    script = (
        f"{share_bytecode()}\npartial={shlex.quote(str(partial))}\n"
        f"venv={shlex.quote(str(venvs / 'ct190' / NAME))}\nshare_bytecode"
    )
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"1 compiled modules linked from {donor}", r.stdout
    linked = partial / SITE / "torch" / "__pycache__" / "__init__.cpython-311.pyc"
    assert linked.samefile(donor / SITE / "torch" / "__pycache__" / "__init__.cpython-311.pyc")
