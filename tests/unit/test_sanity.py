"""`ansible-test sanity`, the tests of it that run without downloads. The others (ansible-doc, changelog,
import, pep8, pylint, runtime-metadata, validate-modules, yamllint) each install pinned requirements into a
virtual environment of their own, after bootstrapping pip from ansible-test's file server; where both that
server and PyPI are reachable, all of them run from a copy of the checkout at
ansible_collections/mlstack/pve with `ansible-test sanity --python 3.11` (tests/sanity/ignore-2.19.txt holds
the accepted findings; ignore-2.21.txt, which ansible-core 2.21's ansible-test reads, is a link to it)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_TEST = str(Path(sys.executable).parent / "ansible-test")
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
OFFLINE = (
    "action-plugin-docs",
    "compile",
    "empty-init",
    "ignores",
    "line-endings",
    "no-assert",
    "no-get-exception",
    "no-illegal-filenames",
    "no-smart-quotes",
    "replace-urlopen",
    "shebang",
    "symlinks",
    "use-argspec-type-path",
    "use-compat-six",
)


def git_files(*which: str) -> set[str]:
    out = subprocess.run(["git", "ls-files", "-z", *which], cwd=REPO, capture_output=True, check=True).stdout
    return set(filter(None, out.decode().split("\0")))


def test_offline_sanity(tmp_path: Path) -> None:
    # ansible-test runs in ansible_collections/NAMESPACE/NAME, on the files git would commit, less the
    # hidden files that other steps of `make test` leave in the checkout while they run.
    tracked = git_files("--cached")
    files = tracked | {rel for rel in git_files("--others", "--exclude-standard") if "/." not in f"/{rel}"}
    collection = tmp_path / "ansible_collections" / "mlstack" / "pve"
    for rel in sorted(files):
        src = REPO / rel
        if src.is_symlink() or src.is_file():  # a file deleted in the work tree is not copied
            (collection / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, collection / rel, follow_symlinks=False)
    argv = [ANSIBLE_TEST, "sanity", "--python", PYTHON, "--color", "no"]
    for name in OFFLINE:
        argv += ["--test", name]
    r = subprocess.run(argv, cwd=collection, capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    for name in OFFLINE:
        assert f'Running sanity test "{name}"' in r.stdout + r.stderr, f"{name} did not run"
