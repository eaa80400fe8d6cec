"""What happens to a container on its own, through the real playbooks on the testbed, on CT 310 provisioned
once for the file: a disk that fills up under apt, the container stopped by hand, and the container
destroyed by hand and provisioned again.

The full disk is a real one: a tmpfs of the container's own (an unprivileged container may mount one) over
the folder that g++-12 unpacks into, holding what was there and a file that leaves 4 MiB free. With g++-12
removed, the toolchain's install must unpack it there: first the free-space check (told to measure that
folder) refuses before apt starts, naming the folder and the bytes; then, with the default check, apt
itself dies mid-unpack and the run shows dpkg's own words; the filler removed, the rerun finishes what
dpkg left half-done and ends green, with no command typed in the container."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mlstack_testbed import client
from playbook_runner import PlaybookRun, container, make_runner
from tbhelpers import attach, remove_ct

VMID = 310
NAME = f"testbed-ct{VMID}"
# g++-12's compiler proper (cc1plus, about 33 MiB of its 36) unpacks here, beside gcc-12's files.
GCC_DIR = "/usr/lib/gcc/x86_64-linux-gnu/12"
FILLER = f"{GCC_DIR}/.filler"
LEFT_KIB = 4096
CUT = "g++-12"  # removing it removes g++ and build-essential, two of the toolchain's packages
KEEP = "/root/gcc12.keep"


def one_line(text: str) -> str:
    return " ".join(text.split())


def sh(script: str, timeout: float = 300) -> str:
    r = attach(VMID, script, timeout=timeout)
    assert r.returncode == 0, f"{script}: {r.stdout}{r.stderr}"
    return r.stdout


def installed(package: str) -> bool:
    return attach(VMID, f"dpkg-query -W -f '${{Status}}' {package}").stdout == "install ok installed"


@pytest.fixture(scope="module")
def ct(tmp_path_factory: pytest.TempPathFactory, testbed: Any) -> Iterator[dict[str, Any]]:
    """CT 310 provisioned from scratch, and how to run a playbook on it (its reports in the file's folder)."""
    work = tmp_path_factory.mktemp("host-life")
    run = make_runner(work)
    entry = [container(VMID)]
    extra = {"doctor_tier": "quick", "mlstack_verify_tier": "fast", "fleet_report_dir": str(work / "reports")}
    remove_ct(testbed.proxmox(), testbed, VMID)
    first = run("provision.yml", entry, **extra)
    assert first.rc == 0, first.output[-4000:]

    def play(playbook: str, **more: Any) -> tuple[PlaybookRun, float]:
        t0 = time.monotonic()
        result = run(playbook, entry, **(extra | more))
        return result, time.monotonic() - t0

    yield {"play": play, "reports": work / "reports", "node": testbed.node}
    remove_ct(testbed.proxmox(), testbed, VMID)


@pytest.fixture
def full_gcc_dir(ct: dict[str, Any]) -> Iterator[int]:
    """g++-12 removed and GCC_DIR on a full tmpfs of its own (LEFT_KIB free); yields the free bytes. Put
    back afterwards: what the tmpfs holds then is copied onto the folder under it."""
    sh(f"apt-get remove -y -q {CUT} >/dev/null")
    sh(
        f"set -e; rm -rf {KEEP}; mkdir -p {KEEP}; cp -a {GCC_DIR}/. {KEEP}/;"
        f" used=$(du -sk {GCC_DIR} | cut -f1); mount -t tmpfs -o size=$((used + 65536))k tmpfs {GCC_DIR};"
        f" cp -a {KEEP}/. {GCC_DIR}/; avail=$(df -k --output=avail {GCC_DIR} | tail -1);"
        f" fallocate -l $(( (avail - {LEFT_KIB}) * 1024 )) {FILLER}"
    )
    yield int(sh(f"df -B1 --output=avail {GCC_DIR} | tail -1"))
    sh(
        f"set -e; rm -f {FILLER}; rm -rf {KEEP}; mkdir -p {KEEP}; cp -a {GCC_DIR}/. {KEEP}/;"
        f" umount {GCC_DIR}; cp -a {KEEP}/. {GCC_DIR}/; rm -rf {KEEP}"
    )


@pytest.mark.slow
def test_full_disk_is_named_and_a_rerun_after_freeing_it_ends_green(
    ct: dict[str, Any], full_gcc_dir: int
) -> None:
    play = ct["play"]
    # 1. The check before apt, told to measure the folder: refused with the folder and the bytes.
    need = 40 * 1048576
    checked, _ = play("provision.yml", toolchain_free_mib={"/": 400, "/var/cache/apt": 100, GCC_DIR: 40})
    said = one_line(checked.output)
    assert checked.rc != 0
    assert f"CT {VMID} ({NAME}): {GCC_DIR} has {full_gcc_dir} bytes free" in said, said[-3000:]
    assert f"needs {need} (40.0 MiB, toolchain_free_mib)" in said, said[-3000:]
    assert "Nothing was installed" in said
    print("refused:", said[said.index(f"CT {VMID} ({NAME}): {GCC_DIR}") :][:400])
    assert not installed(CUT)
    assert attach(VMID, "dpkg --audit").stdout.strip() == ""

    # 2. The default check (the root disk and apt's cache have room): apt dies mid-unpack, and the run
    # shows dpkg's words, not the mirrors hint.
    died, _ = play("provision.yml")
    said = one_line(died.output)
    assert died.rc != 0
    assert f"apt in {NAME} ran out of disk space" in said, said[-3000:]
    assert "No space left on device" in said, said[-3000:]
    assert "package mirrors" not in said
    print("died:", said[said.index(f"apt in {NAME} ran out") :][:900])
    # g++-12's unpack was rolled back; g++ and build-essential, unpacked before it, wait for it.
    assert " g++ " in attach(VMID, "dpkg --audit").stdout, "apt died mid-unpack"

    # 3. Space freed (nothing else typed): the rerun finishes what dpkg left and installs the rest.
    sh(f"rm -f {FILLER}")
    again, _ = play("provision.yml")
    assert again.rc == 0, one_line(again.output)[-4000:]
    assert "dpkg_audit left half-done by an interrupted dpkg" in one_line(again.output)
    assert any("Configure the packages dpkg left unpacked" in t for t in again.changed_tasks())
    assert installed(CUT) and installed("build-essential")
    assert attach(VMID, "dpkg --audit").stdout.strip() == ""
    print("rerun:", again.recap().get(NAME), again.changed_tasks())


def test_verify_names_a_stopped_container_at_once(ct: dict[str, Any], api: Any) -> None:
    node = ct["node"]
    client.wait_task(api, node, api.nodes(node).lxc(VMID).status.stop.post(), 60)
    try:
        result, seconds = ct["play"]("verify.yml")
        said = one_line(result.output)
        assert result.rc != 0
        started = f"CT {VMID} is stopped on {node}: start it with `pct start {VMID}` on {node}"
        assert started in said, said[-3000:]
        assert "The doctor was not run here; nothing was changed." in said
        assert "non-zero return code" not in said
        assert result.changed() == 0, result.changed_tasks()
        # Not waited for: the playbook's own cost (tens of seconds on a busy testbed), not the start timeout.
        assert seconds < 60, seconds
        assert api.nodes(node).lxc(VMID).status.current.get()["status"] == "stopped"
        print(f"verify.yml on a stopped container: {seconds:.1f} s:", said[said.index(started) :][:300])
    finally:
        client.wait_task(api, node, api.nodes(node).lxc(VMID).status.start.post(), 60)


def test_fleet_report_says_a_container_destroyed_by_hand_was_recreated(
    ct: dict[str, Any], api: Any, testbed: Any
) -> None:
    reports: Path = ct["reports"]
    ct["play"]("verify.yml")  # the report before, whatever the tests before left
    before = next(
        r for r in json.loads((reports / "fleet.json").read_text())["containers"] if r["vmid"] == VMID
    )
    assert before["identity"], "the container's creation stamp is read"
    remove_ct(api, testbed, VMID)
    result, _ = ct["play"]("provision.yml")
    assert result.rc == 0, one_line(result.output)[-4000:]
    doc = json.loads((reports / "fleet.json").read_text())
    changes = doc["drift"]["containers"][NAME]
    assert any(c.startswith("recreated: missing since the previous report") for c in changes), changes
    assert any("its venv came from the node's store (complete there, not rebuilt)" in c for c in changes), (
        changes
    )
    md = (reports / "fleet.md").read_text()
    assert "recreated: missing since the previous report" in md
    print(md[md.index("## Since the last report") :])
