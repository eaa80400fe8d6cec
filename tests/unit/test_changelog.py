"""Release notes come from changelogs/ (antsibull-changelog): each change adds a fragment, a release
collects them into changelogs/changelog.yaml, and CHANGELOG.md is written from that file, never by hand."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHANGELOG = str(Path(sys.executable).parent / "antsibull-changelog")


def test_fragments_are_valid() -> None:
    r = subprocess.run(
        [CHANGELOG, "lint"], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    # lint prints one line per problem (the fragment's path and what is wrong) and exits 3.
    assert r.returncode == 0 and not r.stdout.strip(), r.stdout + r.stderr


def test_changelog_md_is_generated(tmp_path: Path) -> None:
    shutil.copy(REPO / "galaxy.yml", tmp_path)
    shutil.copytree(REPO / "changelogs", tmp_path / "changelogs")
    r = subprocess.run(
        [CHANGELOG, "generate"], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert (REPO / "CHANGELOG.md").read_text() == (tmp_path / "CHANGELOG.md").read_text(), (
        "CHANGELOG.md differs from what `antsibull-changelog generate` writes: a change adds its note as a "
        "fragment under changelogs/fragments/ (changelogs/config.yaml says how), not in CHANGELOG.md"
    )
