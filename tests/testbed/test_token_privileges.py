"""PVE's privilege rule for API tokens, in the testbed's API (access.PveAccess of backend.TestbedPve),
without a server.

A privilege-separated token holds what is granted to the token AND held by its user; a token without
privilege separation holds exactly its user's privileges; root@pam holds everything, a privilege-
separated token of root@pam only what is granted to the token. ACL entries on a more specific path
replace inherited ones, unpropagated ones hold only on their own path, NoAccess wins. Token logins
fail with PVE's 401 wording. Also: the least privileges the testbed's token gets are the ones the
docs tell a real cluster's admin to grant (docs/real-cluster.md)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from ansible_collections.mlstack.pve.plugins.module_utils import pve_errors
from fakepve.model import PveError
from mlstack_testbed import paths
from mlstack_testbed.node import access, backend

REPO = Path(__file__).resolve().parents[2]
ROOT_TOKEN = "root@pam!ci"
ALICE = "alice@pve"


@pytest.fixture
def pve(tmp_path: Path) -> backend.TestbedPve:
    return backend.TestbedPve(
        password="pw",
        state_file=tmp_path / "api-state.json",
        access_file=tmp_path / "access.json",
        tokens_dir=tmp_path / "tokens",
    )


class Request(dict[str, Any]):
    """What TestbedPve._authenticate reads of an aiohttp request; a mapping, as the request is."""

    def __init__(self, authorization: str) -> None:
        super().__init__()
        self.headers = {"Authorization": authorization}
        self.path = "/api2/json/version"
        self.cookies: dict[str, str] = {}
        self.method = "GET"


def test_root_holds_everything_and_a_privsep_root_token_only_its_grants(pve: backend.TestbedPve) -> None:
    pve.add_token(ROOT_TOKEN, privsep=True)
    assert pve.allowed("root@pam", "/", "Sys.Modify")
    assert pve.privileges(ROOT_TOKEN, "/vms/100") == set()
    pve.add_role("Audit", ["VM.Audit"])
    pve.set_acl("/vms", ["Audit"], [ROOT_TOKEN])
    assert pve.privileges(ROOT_TOKEN, "/vms/100") == {"VM.Audit"}
    assert not pve.allowed(ROOT_TOKEN, "/vms/100", "VM.Allocate")
    assert not pve.allowed(ROOT_TOKEN, "/", "Sys.Modify")
    assert pve.privileges(ROOT_TOKEN, "/storage/local") == set()


def test_a_token_without_privilege_separation_holds_exactly_its_users(pve: backend.TestbedPve) -> None:
    pve.add_token("root@pam!full", privsep=False)
    assert pve.allowed("root@pam!full", "/", "Sys.Modify")
    pve.add_user(ALICE)
    pve.add_role("VmUser", ["VM.Audit", "VM.PowerMgmt"])
    pve.set_acl("/vms", ["VmUser"], [ALICE])
    pve.add_token(f"{ALICE}!full", privsep=False)
    pve.add_role("Other", ["Sys.Audit"])
    # Grants to a token without privilege separation do not count: only the user's do.
    pve.set_acl("/", ["Other"], [f"{ALICE}!full"])
    assert pve.privileges(f"{ALICE}!full", "/vms/7") == {"VM.Audit", "VM.PowerMgmt"}
    assert pve.privileges(f"{ALICE}!full", "/") == set()


def test_a_privsep_token_holds_the_intersection_with_its_user(pve: backend.TestbedPve) -> None:
    pve.add_user(ALICE)
    pve.add_role("UserRole", ["VM.Audit", "VM.Allocate"])
    pve.add_role("TokenRole", ["VM.Allocate", "VM.Config.Memory"])
    pve.set_acl("/vms", ["UserRole"], [ALICE])
    pve.add_token(f"{ALICE}!sep")
    pve.set_acl("/vms", ["TokenRole"], [f"{ALICE}!sep"])
    assert pve.privileges(ALICE, "/vms/7") == {"VM.Audit", "VM.Allocate"}
    assert pve.privileges(f"{ALICE}!sep", "/vms/7") == {"VM.Allocate"}


def test_specific_paths_replace_inherited_grants_and_propagate_matters(pve: backend.TestbedPve) -> None:
    pve.add_token(ROOT_TOKEN)
    pve.add_role("Audit", ["VM.Audit"])
    pve.add_role("Alloc", ["VM.Allocate"])
    pve.set_acl("/vms", ["Audit"], [ROOT_TOKEN])
    pve.set_acl("/vms/200", ["Alloc"], [ROOT_TOKEN])
    pve.set_acl("/vms/300", ["NoAccess"], [ROOT_TOKEN])
    assert pve.privileges(ROOT_TOKEN, "/vms/100") == {"VM.Audit"}
    assert pve.privileges(ROOT_TOKEN, "/vms/200") == {"VM.Allocate"}
    assert pve.privileges(ROOT_TOKEN, "/vms/300") == set()
    pve.set_acl("/storage", ["Audit"], [ROOT_TOKEN], propagate=False)
    assert pve.privileges(ROOT_TOKEN, "/storage") == {"VM.Audit"}
    assert pve.privileges(ROOT_TOKEN, "/storage/local") == set()


def test_a_pools_grants_reach_its_guests(pve: backend.TestbedPve) -> None:
    pve.add_token(ROOT_TOKEN)
    pve.add_role("Alloc", ["VM.Allocate"])
    pve.pools["ml"] = {940}
    pve.set_acl("/pool/ml", ["Alloc"], [ROOT_TOKEN])
    assert pve.allowed(ROOT_TOKEN, "/vms/940", "VM.Allocate")
    assert not pve.allowed(ROOT_TOKEN, "/vms/941", "VM.Allocate")


def test_unknown_expired_and_deleted_tokens_hold_nothing(pve: backend.TestbedPve) -> None:
    pve.add_role("Audit", ["VM.Audit"])
    pve.add_token("root@pam!old", expire=1)
    pve.set_acl("/", ["Audit"], ["root@pam!old"])
    assert pve.privileges("root@pam!old", "/vms/1") == set()
    assert pve.privileges("root@pam!nosuch", "/vms/1") == set()
    pve.add_token(ROOT_TOKEN)
    pve.set_acl("/", ["Audit"], [ROOT_TOKEN])
    pve.remove_token(ROOT_TOKEN)
    assert pve.privileges(ROOT_TOKEN, "/vms/1") == set()
    assert all(e.ugid != ROOT_TOKEN for e in pve.acl_entries)


def test_token_logins_fail_with_pves_401_wording(pve: backend.TestbedPve) -> None:
    secret = pve.add_token(ROOT_TOKEN)
    assert pve._authenticate(Request(f"PVEAPIToken={ROOT_TOKEN}={secret}")) == ROOT_TOKEN
    cases = {
        f"PVEAPIToken={ROOT_TOKEN}=wrong": "invalid token value!",
        f"PVEAPIToken=root@pam!nosuch={secret}": "no such token 'nosuch' for user 'root@pam'",
        f"PVEAPIToken=bob@pve!ci={secret}": "no such user ('bob@pve')",
        "PVEAPIToken=root@pam": "no tokenid specified",
    }
    for header, message in cases.items():
        with pytest.raises(PveError) as refused:
            pve._authenticate(Request(header))
        assert (refused.value.status, refused.value.message) == (401, message)


def test_a_root_token_is_checked_like_any_other_on_root_only_calls(pve: backend.TestbedPve) -> None:
    pve.add_token("root@pam!full", privsep=False)
    pve.check_permissions("root@pam", None, {})
    # PVE lets only the root@pam login through a call without a permission rule.
    with pytest.raises(PveError) as refused:
        pve.check_permissions("root@pam!full", None, {})
    assert refused.value.status == 403
    rule: dict[str, Any] = {"check": ["perm", "/vms/{vmid}", ["VM.Allocate"]]}
    pve.check_permissions("root@pam!full", rule, {"vmid": 5})
    pve.add_token(ROOT_TOKEN)
    with pytest.raises(PveError) as refused:
        pve.check_permissions(ROOT_TOKEN, rule, {"vmid": 5})
    assert refused.value.message == "Permission check failed (/vms/5, VM.Allocate)"


def test_tokens_and_grants_persist_with_each_secret_in_a_0600_file(
    pve: backend.TestbedPve, tmp_path: Path
) -> None:
    pve.ensure_provision_token()
    secret = pve.token_secrets[paths.API_TOKEN_ID]
    secret_file = tmp_path / "tokens" / "root@pam" / paths.API_TOKEN_NAME
    assert secret_file.read_text().strip() == secret
    assert secret_file.stat().st_mode & 0o777 == 0o600
    assert secret not in (tmp_path / "access.json").read_text()
    again = backend.TestbedPve(
        password="pw",
        state_file=tmp_path / "api-state.json",
        access_file=tmp_path / "access.json",
        tokens_dir=tmp_path / "tokens",
    )
    again.load_access()
    assert again.ensure_provision_token() is None, "a second start must keep the token and its secret"
    assert again.token_secrets[paths.API_TOKEN_ID] == secret
    for path in access.PROVISION_ACL_PATHS:
        assert again.privileges(paths.API_TOKEN_ID, path + "/x") == set(access.PROVISION_PRIVILEGES)
    assert not again.allowed(paths.API_TOKEN_ID, "/", "Sys.Modify")
    assert not again.allowed(paths.API_TOKEN_ID, "/nodes/testbed", "Sys.Audit")


def test_the_docs_grant_exactly_the_testbed_tokens_privileges_as_the_roles_messages_quote() -> None:
    """The page the collection's messages point a refused token to (pve_errors.GRANT_DOC) makes the role
    with exactly the privileges the testbed's token holds, and grants it with the commands the messages
    quote."""
    page, _, heading = pve_errors.GRANT_DOC.partition(", ")
    text = (REPO / page).read_text()
    assert f"## {heading.strip(chr(34))}\n" in text, f"{page}: no section {heading}"
    found = re.search(r"pveum role add (\S+) --privs \"([^\"]+)\"", text)
    assert found, f'{page}: no `pveum role add ... --privs "..."` line'
    assert found.group(1) == pve_errors.ROLE == access.PROVISION_ROLE
    assert sorted(found.group(2).split(",")) == sorted(access.PROVISION_PRIVILEGES)
    assert sorted(pve_errors.ROLE_PRIVILEGES) == sorted(access.PROVISION_PRIVILEGES)
    # The docs' example token, granted on /vms and on the bridge as a refused token's message says.
    for path in ("/vms/100", "/sdn/zones/localnetwork/vmbr0"):
        for command in pve_errors.grant_commands("root@pam!mlstack", path):
            assert command in text, f"{page}: no `{command}`"
