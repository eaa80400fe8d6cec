"""The toolchain role's read where python3 is missing, through real ansible on localhost: the read's module
cannot start (the shell's exit 127), and that alone is not a failure. A plan (check mode) names python3 as
missing and changes nothing; a real run installs it (tests/provision: every new container)."""

from __future__ import annotations

from pathlib import Path

from localplay import run_play

PLAY = """
- hosts: localhost
  connection: local
  gather_facts: false
  roles:
    - role: toolchain
"""


def test_a_plan_where_python3_is_missing_names_it_and_changes_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "usr" / "bin" / "python3"
    proc = run_play(tmp_path, PLAY, {"ansible_python_interpreter": str(missing)}, "--check")
    said = " ".join(proc.stdout.split())
    assert proc.returncode == 0, proc.stdout[-3000:]
    line = "toolchain: python3 missing (installed with the toolchain in one apt transaction)"
    assert line in said, said[-3000:]
    assert "changed=0" in said and "failed=0" in said


def test_a_read_that_fails_for_another_reason_still_fails(tmp_path: Path) -> None:
    # python3 is there but is not Python: the module's failure is not the missing interpreter's.
    fake = tmp_path / "bin" / "python3"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho broken >&2\nexit 3\n")
    fake.chmod(0o755)
    proc = run_play(tmp_path, PLAY, {"ansible_python_interpreter": str(fake)}, "--check")
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert "Read the toolchain's state" in proc.stdout and "broken" in proc.stdout, proc.stdout[-3000:]
