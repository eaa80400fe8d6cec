"""PVE API errors classified from what the client printed, each kind with the message a user reads: the
privilege and path PVE named (or, for the create's VM.Allocate, the ones it checks unnamed), PVE's words
quoted, and the docs' grant for it."""

from __future__ import annotations

import pytest
from ansible_collections.mlstack.pve.plugins.module_utils import pve_errors

TOKEN = "root@pam!mlstack"
ACL = "pveum acl modify {path} --tokens 'root@pam!mlstack' --roles MlstackProvision"


def refusal(text: str, authid: str = TOKEN, token: bool = True, vmid: int = 942) -> dict[str, object]:
    return pve_errors.refusal(
        text,
        authid,
        token,
        f"creating container {vmid}",
        f"Container {vmid} was not created.",
        "create",
        vmid,
    )


@pytest.mark.parametrize(
    ("text", "path", "privileges", "grant_on"),
    [
        # community.proxmox's message around proxmoxer's "<status> <phrase>: <PVE's status line>"
        (
            "An error occurred: 403 Forbidden: Permission check failed (/vms/942, VM.Config.Memory)",
            "/vms/942",
            ["VM.Config.Memory"],
            "/vms",
        ),
        (
            "An error occurred: 403 Forbidden: Permission check failed "
            "(/storage/local, Datastore.AllocateSpace)",
            "/storage/local",
            ["Datastore.AllocateSpace"],
            "/storage/local",
        ),
        (
            "An error occurred: 403 Forbidden: Permission check failed "
            "(/sdn/zones/localnetwork/vmbr0, SDN.Use)",
            "/sdn/zones/localnetwork/vmbr0",
            ["SDN.Use"],
            "/sdn/zones/localnetwork/vmbr0",
        ),
        # check_any's form: any one of them would do.
        (
            "An error occurred: 403 Forbidden: Permission check failed "
            "(/storage/local, Datastore.AllocateSpace|Datastore.Audit)",
            "/storage/local",
            ["Datastore.AllocateSpace", "Datastore.Audit"],
            "/storage/local",
        ),
    ],
)
def test_a_named_privilege_is_read_with_its_path_and_granted_where_the_docs_grant_it(
    text: str, path: str, privileges: list[str], grant_on: str
) -> None:
    got = refusal(text)
    assert (got["kind"], got["status"], got["path"], got["privileges"]) == (
        "privilege",
        403,
        path,
        privileges,
    )
    assert got["reason"] == text.split("403 Forbidden: ", 1)[1]
    message = str(got["message"])
    assert message.startswith(f"The PVE API refused {TOKEN} while creating container 942: it lacks ")
    assert f"on {path} ({text.split(': ', 1)[1]})" in message
    assert "Container 942 was not created." in message
    assert f"`{ACL.format(path=grant_on)}`" in message
    assert f'`pveum role add MlstackProvision --privs "{",".join(pve_errors.ROLE_PRIVILEGES)}"`' in message


def test_the_creates_unnamed_403_is_vm_allocate_on_the_guest() -> None:
    """pve-container's create checks VM.Allocate without naming it (raise_perm_exc with no argument)."""
    got = refusal("An error occurred: 403 Forbidden: Permission check failed", vmid=960)
    assert (got["kind"], got["path"], got["privileges"]) == ("privilege", "/vms/960", ["VM.Allocate"])
    assert got["reason"] == "Permission check failed"
    message = str(got["message"])
    assert "it lacks VM.Allocate on /vms/960, which PVE checks there without naming it" in message
    assert "(403 Forbidden: Permission check failed)" in message
    assert f"`{ACL.format(path='/vms')}`" in message


def test_an_unnamed_403_of_another_call_names_no_privilege() -> None:
    got = pve_errors.refusal("403 Forbidden: Permission check failed", TOKEN, True, "reading the guests")
    assert (got["kind"], got["privileges"]) == ("error", [])
    assert "403 Forbidden: Permission check failed" in str(got["message"])


def test_a_token_of_another_user_is_granted_the_role_for_its_user_too() -> None:
    message = str(
        refusal("403 Forbidden: Permission check failed (/vms/942, VM.Audit)", "ml@pve!ci")["message"]
    )
    assert "`pveum acl modify /vms --tokens 'ml@pve!ci' --roles MlstackProvision`" in message
    assert "`pveum acl modify /vms --users ml@pve --roles MlstackProvision`" in message


def test_a_privilege_outside_the_projects_role_says_why_pve_asks_for_it() -> None:
    message = str(refusal("403 Forbidden: Permission check failed (/, Sys.Modify)")["message"])
    assert "it lacks Sys.Modify on /" in message
    assert "does not hold Sys.Modify (PVE asks for it on / to create a privileged container" in message
    assert "pveum role add" not in message


@pytest.mark.parametrize(
    "text",
    [
        "403 Forbidden: Permission check failed (user != root@pam)",
        "403 Forbidden: Permission check failed "
        "(configuring device passthrough is only allowed for root@pam)",
    ],
)
def test_root_only_calls(text: str) -> None:
    got = refusal(text)
    assert got["kind"] == "root_only"
    assert "PVE allows this to the root@pam login only" in str(got["message"])


@pytest.mark.parametrize(
    ("text", "said", "token", "fix"),
    [
        # PVE answers a refused login with its status line alone: proxmoxer appends the empty body's parse.
        (
            "401 Unauthorized: invalid token value! - {'errors': b''}",
            "401 Unauthorized: invalid token value!",
            True,
            "The token root@pam!mlstack or its secret is wrong",
        ),
        (
            "401 Unauthorized: no such token 'mlstack' for user 'root@pam' - {'errors': b''}",
            "401 Unauthorized: no such token 'mlstack' for user 'root@pam'",
            True,
            "The token root@pam!mlstack or its secret is wrong",
        ),
        # A refused password login: proxmoxer's own words, no status in them.
        (
            "Couldn't authenticate user: root@pam to https://10.0.0.5:8006/api2/json/access/ticket",
            "Couldn't authenticate user: root@pam to https://10.0.0.5:8006/api2/json/access/ticket",
            False,
            "The user or its password is wrong",
        ),
    ],
)
def test_a_refused_login(text: str, said: str, token: bool, fix: str) -> None:
    got = pve_errors.refusal(
        text, TOKEN if token else "root@pam", token, "reading the guests", "Nothing was changed."
    )
    assert (got["kind"], got["status"]) == ("login", 401)
    who = TOKEN if token else "root@pam"
    assert str(got["message"]).startswith(
        f"The PVE API refused {who} while reading the guests ({said}). Nothing was changed. {fix}"
    )


def test_a_vmid_taken_by_a_guest_the_token_cannot_see() -> None:
    got = refusal("An error occurred: 500 Internal Server Error: CT 942 already exists on node 'testbed'")
    assert (got["kind"], got["status"], got["reason"]) == (
        "taken",
        500,
        "CT 942 already exists on node 'testbed'",
    )
    assert "lists only the guests it holds VM.Audit on" in str(got["message"])


@pytest.mark.parametrize(
    ("text", "status"),
    [
        ("An error occurred: 500 Internal Server Error: storage 'nosuch' does not exist", 500),
        ("HTTPSConnectionPool(host='10.0.0.5', port=8006): Max retries exceeded", None),
    ],
)
def test_other_errors_keep_pves_words(text: str, status: int | None) -> None:
    got = refusal(text)
    assert (got["kind"], got["status"]) == ("error", status)
    assert text.split("An error occurred: ")[-1] in str(got["message"])
