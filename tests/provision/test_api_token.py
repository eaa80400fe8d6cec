"""provision.yml with an API token instead of the password, against the testbed's API, which applies
PVE's privilege rule to tokens. The testbed's own token (testbed.json: api_token_id, its secret in
api_token_secret_file) is privilege-separated and granted only the privileges the README lists.

1. That token provisions a container, a rerun changes nothing, destroy.yml removes it.
2. A wrong secret stops the preflight with PVE's 401, without retrying, printing no secret, making nothing.
3. A token lacking one of those privileges (made through the testbed's API, as `pveum` would) fails
   the create with PVE's 403 (which names the path and the privilege, except for VM.Allocate, which PVE's
   create checks unnamed) and the role's message naming both and the docs' grant; nothing is created.

The secrets reach Ansible through a file lookup (as a vault lookup would), never on a command line.
Containers: vmids 940-942 and 962."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ansible_collections.mlstack.pve.plugins.module_utils import pve_errors
from mlstack_testbed import paths
from mlstack_testbed.lxc import realct
from mlstack_testbed.node import access
from playbook_runner import PlaybookRun, container, read_testbed_token, token_vars
from proxmoxer.core import ResourceException
from tbhelpers import ct_exists, remove_ct


def secret_file(path: Path, secret: str) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(secret + "\n")
    return path


def flat(run: PlaybookRun) -> str:
    return " ".join(run.output.split())


@pytest.fixture
def testbed_token(testbed: Any) -> tuple[str, Path]:
    return read_testbed_token(testbed.state_dir)


@pytest.fixture
def ct(api: Any, testbed: Any, request: pytest.FixtureRequest) -> Iterator[int]:
    """A vmid that is free before the test and removed after it (through the root login)."""
    vmid = int(request.param)
    remove_ct(api, testbed, vmid)
    yield vmid
    remove_ct(api, testbed, vmid)


@pytest.mark.parametrize("ct", [940], indirect=True)
def test_the_least_privilege_token_provisions_reruns_and_destroys(
    run_playbook: Any, api: Any, testbed: Any, testbed_token: tuple[str, Path], ct: int
) -> None:
    token_id, secret_path = testbed_token
    secret = secret_path.read_text().strip()
    assert "!" in token_id and secret_path.stat().st_mode & 0o777 == 0o600
    perms = api.access.permissions.get(userid=token_id)
    assert not perms.get("/", {}).get("Sys.Modify"), "the testbed's token must not be an administrator"
    creds = token_vars(token_id, secret_path)

    # The API is used by the node plays only (pve_host, gpu_container): the token's privileges are proven
    # there, so the runs stop before the inside of the container (--limit to the node).
    first = run_playbook("provision.yml", [container(ct)], limit=testbed.node, **creds)
    assert first.rc == 0, first.output[-5000:]
    config = api.nodes(testbed.node).lxc(ct).config.get()
    assert "mlstack" in config.get("tags", "") and "dev0" in config and "mp0" in config
    creates = [t for t in api.nodes(testbed.node).tasks.get(vmid=ct, limit=50) if t["type"] == "vzcreate"]
    assert creates and creates[0]["user"] == token_id, creates
    assert api.nodes(testbed.node).lxc(ct).status.current.get()["status"] == "running"

    again = run_playbook("provision.yml", [container(ct)], limit=testbed.node, **creds)
    assert again.rc == 0, again.output[-5000:]
    assert again.changed() == 0, again.changed_tasks()

    gone = run_playbook("destroy.yml", [container(ct)], mlstack_destroy_confirm=True, **creds)
    assert gone.rc == 0, gone.output[-5000:]
    assert not ct_exists(api, testbed.node, ct) and not realct.ct_dir(ct).exists()
    for run in (first, again, gone):
        assert secret not in run.output


@pytest.mark.parametrize("ct", [941], indirect=True)
def test_a_wrong_secret_stops_the_preflight_with_pves_401(
    run_playbook: Any, api: Any, testbed: Any, testbed_token: tuple[str, Path], ct: int, tmp_path: Path
) -> None:
    token_id, real_secret_path = testbed_token
    wrong = "0badc0de-0000-4000-8000-00000000dead"
    creds = token_vars(token_id, secret_file(tmp_path / "s", wrong))
    result = run_playbook("provision.yml", [container(ct)], timeout=600, **creds)
    text = flat(result)
    assert result.rc != 0
    assert "401 Unauthorized: invalid token value!" in text, result.output[-4000:]
    assert f"The PVE API refused {token_id}" in text and "Nothing was changed." in text
    # Early: in the preflight play, at once (a refused login is not retried), before any change.
    assert "PLAY [Prepare the PVE nodes and create the containers]" not in result.output
    assert "FAILED - RETRYING" not in result.output
    assert result.changed() == 0, result.changed_tasks()
    for secret in (wrong, real_secret_path.read_text().strip(), testbed.api_password):
        assert secret not in result.output
    assert not ct_exists(api, testbed.node, ct) and not realct.ct_dir(ct).exists()


@pytest.fixture
def lacking_token(
    api: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[str, Path, str]]:
    """A privilege-separated token of root@pam with every privilege the docs list but the one
    `request.param` names, on the same paths, made through the testbed's API as `pveum` does it: its id,
    its secret's file, the privilege it lacks."""
    lacks = str(request.param)
    # Named per run: two runs of this suite on one testbed do not share the token.
    tag = f"{lacks.replace('.', '')}{os.getpid()}"
    role, name = f"MlstackLacking{tag}", f"lacking{tag}"
    token_id = f"{paths.API_USER}!{name}"
    tokens = api.access.users(paths.API_USER).token
    # Left over from an interrupted run with the same pid, or not there.
    with contextlib.suppress(ResourceException):
        tokens(name).delete()
    with contextlib.suppress(ResourceException):
        api.access.roles(role).delete()
    privs = [p for p in access.PROVISION_PRIVILEGES if p != lacks]
    api.access.roles.post(roleid=role, privs=",".join(privs))
    made = tokens(name).post(privsep=1, comment=f"test: lacks {lacks}")
    for path in access.PROVISION_ACL_PATHS:
        api.access.acl.put(path=path, tokens=token_id, roles=role)
    yield token_id, secret_file(tmp_path / "lacking", made["value"]), lacks
    tokens(name).delete()
    api.access.roles(role).delete()


@pytest.mark.parametrize(
    ("ct", "lacking_token", "pve_said"),
    [
        (942, "VM.Config.Memory", "403 Forbidden: Permission check failed (/vms/942, VM.Config.Memory)"),
        # PVE's create checks VM.Allocate without naming it (pve-container's create_vm, raise_perm_exc()).
        (962, "VM.Allocate", "403 Forbidden: Permission check failed"),
    ],
    indirect=["ct", "lacking_token"],
)
def test_a_token_lacking_a_privilege_fails_with_a_message_naming_it_and_its_grant(
    run_playbook: Any, api: Any, testbed: Any, lacking_token: tuple[str, Path, str], ct: int, pve_said: str
) -> None:
    token_id, secret_path, lacks = lacking_token
    result = run_playbook("provision.yml", [container(ct)], timeout=900, **token_vars(token_id, secret_path))
    text = flat(result)
    assert result.rc != 0
    assert pve_said in text, result.output[-4000:]
    # The role's message: the privilege and its path, PVE's words, and the docs' grant for it.
    assert (
        f"The PVE API refused {token_id} while creating container {ct}: it lacks {lacks} on /vms/{ct}" in text
    )
    assert f"({pve_said}). Container {ct} was not created." in text
    assert f"pveum acl modify /vms --tokens '{token_id}' --roles {pve_errors.ROLE}" in text
    assert f'pveum role add {pve_errors.ROLE} --privs "{",".join(pve_errors.ROLE_PRIVILEGES)}"' in text
    assert pve_errors.GRANT_DOC in text
    assert secret_path.read_text().strip() not in result.output
    assert not ct_exists(api, testbed.node, ct) and not realct.ct_dir(ct).exists()
