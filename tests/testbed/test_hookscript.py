"""A container's hookscript, run by the testbed's API start as PVE runs it: `<script> <vmid> <phase>` in the
node's own namespace (its /usr/sbin), pre-start before lxc-start and post-start after, a refusal in pre-start
failing the start with the script's output in the task log; a hookscript that is not there is refused at
`config` time in PVE's words (CT 937)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mlstack_testbed import client, paths
from proxmoxer.core import ResourceException
from tbhelpers import remove_ct, wait_ok

VMID = 937
NAME = f"mlstack-test-hook-{VMID}"


@pytest.fixture
def hooked(api: Any, testbed: client.Testbed, tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """CT 937, stopped, and a snippet that logs each call (with where nvidia-modprobe is) and refuses
    pre-start while its flag file exists: (log, flag)."""
    log, flag = tmp_path / "calls", tmp_path / "refuse"
    snippet = paths.LOCAL_STORAGE / "snippets" / NAME
    snippet.parent.mkdir(parents=True, exist_ok=True)
    snippet.write_text(
        "#!/bin/sh\n"
        f'echo "$1 $2 $(command -v nvidia-modprobe)" >>{log}\n'
        f'if [ "$2" = pre-start ] && [ -e {flag} ]; then echo "refused: the flag is set"; exit 3; fi\n'
    )
    snippet.chmod(0o755)
    remove_ct(api, testbed, VMID)
    lxc = api.nodes(testbed.node).lxc
    wait_ok(
        api,
        testbed,
        lxc.post(vmid=VMID, ostemplate=testbed.template, storage=testbed.storage, unprivileged=1),
    )
    yield log, flag
    remove_ct(api, testbed, VMID)
    snippet.unlink(missing_ok=True)


def test_a_missing_hookscript_is_refused(
    api: Any, testbed: client.Testbed, hooked: tuple[Path, Path]
) -> None:
    with pytest.raises(ResourceException) as e:
        api.nodes(testbed.node).lxc(VMID).config.put(hookscript="local:snippets/mlstack-test-none")
    assert "script 'local:snippets/mlstack-test-none' does not exist" in str(e.value)


def test_the_hookscript_runs_on_the_node_around_the_start(
    api: Any, testbed: client.Testbed, hooked: tuple[Path, Path]
) -> None:
    log, flag = hooked
    ct = api.nodes(testbed.node).lxc(VMID)
    ct.config.put(hookscript=f"local:snippets/{NAME}")
    wait_ok(api, testbed, ct.status.start.post())
    assert log.read_text().splitlines() == [
        f"{VMID} pre-start /usr/sbin/nvidia-modprobe",
        f"{VMID} post-start /usr/sbin/nvidia-modprobe",
    ]

    wait_ok(api, testbed, ct.status.stop.post())
    flag.touch()
    upid = ct.status.start.post()
    status = client.wait_task(api, testbed.node, upid)
    said = "\n".join(client.task_log(api, testbed.node, upid))
    assert status["exitstatus"].startswith(f"hookscript error for {VMID} on pre-start: command"), status
    assert "refused: the flag is set" in said and "failed: exit code 3" in said, said
    assert ct.status.current.get()["status"] == "stopped"
