"""A command and the read of its JSON report in one call, against a real command (a shell script that
prints a table and writes a report, as the doctor does): exit codes, a missing command, a bad report."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from ansible_collections.mlstack.pve.plugins.module_utils.run_report import missing_command, run_and_read

# Prints two lines, writes $2 as the report (or leaves it), exits $1.
TOOL = """#!/bin/sh
printf 'probe  status\\nhost   pass\\n'
echo "said on stderr" >&2
[ -n "$2" ] && printf '%s' "$2" > "$3"
exit "$1"
"""


def run(argv: list[str]) -> tuple[int, str, str]:
    p = subprocess.run(argv, capture_output=True, text=True, check=False)
    return p.returncode, p.stdout, p.stderr


@pytest.fixture
def tool(tmp_path: Path) -> Path:
    path = tmp_path / "doctor"
    path.write_text(TOOL)
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("rc", [0, 1])
def test_the_report_comes_back_with_the_output(tool: Path, tmp_path: Path, rc: int) -> None:
    out = tmp_path / "report.json"
    doc = {"tier": "fast", "summary": {"ok": rc == 0}}
    result = run_and_read([str(tool), str(rc), json.dumps(doc), str(out)], str(out), run, (0, 1))
    assert result["rc"] == rc and result["report"] == doc and result["report_error"] is None
    assert result["stdout_lines"] == ["probe  status", "host   pass"] and result["stdout"].endswith("pass")
    assert result["stderr"] == "said on stderr" and result["missing"] is None


def test_an_exit_code_outside_read_on_leaves_the_report_unread(tool: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    result = run_and_read([str(tool), "2", "{}", str(out)], str(out), run, (0, 1))
    assert result["rc"] == 2 and result["report"] is None
    assert result["report_error"] == "not read: the command exited 2"


@pytest.mark.parametrize(
    "written,why",
    [("", "was not written"), ("{not json", "is not JSON"), ("[1, 2]", "is not a report")],
)
def test_an_unusable_report_is_none_with_the_reason(
    tool: Path, tmp_path: Path, written: str, why: str
) -> None:
    out = tmp_path / "report.json"
    result = run_and_read([str(tool), "0", written, str(out)], str(out), run, (0, 1))
    assert result["rc"] == 0 and result["report"] is None and why in result["report_error"]


def test_a_missing_command_is_not_run_and_says_so(tmp_path: Path) -> None:
    ran: list[list[str]] = []
    argv = [str(tmp_path / "venv" / "bin" / "mlstack-doctor"), "--tier", "warm"]
    result = run_and_read(argv, str(tmp_path / "r.json"), lambda a: ran.append(a) or (0, "", ""), (0, 1))
    assert ran == [] and result["rc"] == 127 and result["report"] is None
    assert result["missing"] == f"{argv[0]} is missing"


def test_a_command_that_is_not_executable_is_missing(tool: Path) -> None:
    tool.chmod(0o644)
    assert missing_command([str(tool)]) == f"{tool} is not executable"
    assert missing_command(["ldconfig"]) is None  # a bare name is PATH's to find


@pytest.mark.parametrize(
    "summary,codes",
    [
        ({"ok": True, "root_cause": None, "root_causes": []}, []),
        (
            {
                "ok": False,
                "root_cause": {"probe": "a", "code": "X", "fix": "fx"},
                "root_causes": [
                    {"probe": "a", "code": "X", "fix": "fx"},
                    {"probe": "b", "code": "Y", "fix": "fy"},
                ],
            },
            ["X", "Y"],
        ),
        ({"ok": False, "root_cause": {"probe": "a", "code": "X", "fix": "fx"}}, ["X"]),  # a 1.0 report
    ],
    ids=["passed", "two independent failures", "schema 1.0"],
)
def test_every_root_cause_comes_back(tool: Path, tmp_path: Path, summary: dict, codes: list[str]) -> None:
    out = tmp_path / "report.json"
    doc = {"tier": "full", "summary": summary}
    result = run_and_read([str(tool), "1", json.dumps(doc), str(out)], str(out), run, (0, 1))
    assert [r["code"] for r in result["root_causes"]] == codes
