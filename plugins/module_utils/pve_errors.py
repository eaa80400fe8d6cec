"""PVE API errors, classified in one place: a refused login (401), a privilege missing on a path (403), a
call PVE allows to root@pam only, a vmid already taken, or any other error; and the message that says what
to fix, with the grant the docs give a real cluster's admin. PVE's own text is kept as `reason`.

The input is what the client printed: proxmoxer's "<status> <phrase>: <reason>[ - <errors>]" (the reason
is PVE's status line, e.g. "Permission check failed (/vms/121, VM.Config.Memory)"), inside
community.proxmox's message, or proxmoxer's "Couldn't authenticate user" for a refused password login.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Where the docs grant the project's token its privileges, and the role they make: exactly the privileges
# the project's API calls need. The testbed grants its own token the same list (a test keeps the docs,
# this list and the testbed's equal).
GRANT_DOC = 'docs/real-cluster.md, "An API token instead of the password"'
ROLE = "MlstackProvision"
ROLE_PRIVILEGES = (
    "Datastore.AllocateSpace",
    "SDN.Use",
    "VM.Allocate",
    "VM.Audit",
    "VM.Config.CPU",
    "VM.Config.Disk",
    "VM.Config.Memory",
    "VM.Config.Network",
    "VM.Config.Options",
    "VM.Snapshot",
    "VM.Snapshot.Rollback",
)
# Checks whose 403 names nothing (PVE's raise_perm_exc without an argument), by the call that makes
# them: the create's VM.Allocate on the guest (pve-container's create_vm; the pool's would do too).
UNNAMED_CHECKS = {"create": ("VM.Allocate", "/vms/{vmid}")}
# Privileges outside the project's role that PVE asks for, and why.
WHY_ASKED = {
    "Sys.Modify": "PVE asks for it on / to create a privileged container (mlstack_unprivileged: false)",
}

_HTTP = re.compile(r"\b([1-5]\d\d) [A-Z][A-Za-z -]*?: (.*)", re.S)
# What proxmoxer appends for an answer without a body (PVE's refused logins): not PVE's words.
_NO_BODY = re.compile(r" - \{'errors': b''\}\s*$")
_PERMISSION = re.compile(r"Permission check failed(?: \((.*)\))?\s*$", re.S)
_PATH_PRIVILEGES = re.compile(r"(/\S*|), ([A-Za-z.]+(?:\|[A-Za-z.]+)*)")
_TAKEN = re.compile(r"(?:CT|VM) (\d+) already exists on node '([^']+)'")
_PASSWORD_REFUSED = "Couldn't authenticate user"


@dataclass(frozen=True)
class ApiError:
    """One PVE API error: its kind (login, privilege, root_only, taken, error), PVE's text as `reason`,
    and for a missing privilege the path and the privileges (any one of them does when `any_of`)."""

    kind: str
    status: int | None
    reason: str
    # The client's words for PVE's answer ("403 Forbidden: Permission check failed (...)").
    said: str = ""
    path: str = ""
    privileges: tuple[str, ...] = ()
    any_of: bool = False
    # PVE's 403 named neither the path nor the privilege: they come from UNNAMED_CHECKS.
    unnamed: bool = False


def classify(text: str, call: str = "", vmid: int | str | None = None) -> ApiError:
    """The error in the client's `text`, most specific evidence first; `call` (a key of UNNAMED_CHECKS)
    and `vmid` name what was asked, for a 403 that names nothing."""
    text = str(text).strip()
    found = _HTTP.search(text)
    if found is None:
        if _PASSWORD_REFUSED in text:
            return ApiError("login", 401, text, text)
        return ApiError("error", None, text, text)
    said = _NO_BODY.sub("", found.group(0)).strip()
    status, reason = int(found.group(1)), _NO_BODY.sub("", found.group(2)).strip()
    if status == 401:
        return ApiError("login", status, reason, said)
    if status == 403:
        return _forbidden(reason, said, call, vmid)
    if _TAKEN.search(reason):
        return ApiError("taken", status, reason, said)
    return ApiError("error", status, reason, said)


def _forbidden(reason: str, said: str, call: str, vmid: int | str | None) -> ApiError:
    checked = _PERMISSION.match(reason)
    what = (checked.group(1) or "") if checked else reason
    if "root@pam" in what:
        # "user != root@pam", "configuring device passthrough is only allowed for root@pam", ...
        return ApiError("root_only", 403, reason, said)
    named = _PATH_PRIVILEGES.fullmatch(what)
    if named:
        privileges = tuple(named.group(2).split("|"))
        return ApiError(
            "privilege", 403, reason, said, named.group(1), privileges, any_of=len(privileges) > 1
        )
    if checked and not what and call in UNNAMED_CHECKS:
        privilege, path = UNNAMED_CHECKS[call]
        return ApiError("privilege", 403, reason, said, path.format(vmid=vmid), (privilege,), unnamed=True)
    return ApiError("error", 403, reason, said)


def grant_path(path: str) -> str:
    """Where the docs grant a privilege PVE checks on `path`: a guest's on /vms (every guest), the rest
    on the path itself."""
    return "/vms" if re.fullmatch(r"/vms/\d+", path) else path


def grant_commands(authid: str, path: str) -> list[str]:
    """The docs' grant of the project's role on `path` to `authid` (a token, or a user), as pveum runs it;
    a token of another user than root@pam needs the role for that user too (a token holds only what its
    user also holds)."""
    user, bang, _ = authid.partition("!")
    where = grant_path(path)
    if not bang:
        return [f"pveum acl modify {where} --users {authid} --roles {ROLE}"]
    commands = [f"pveum acl modify {where} --tokens '{authid}' --roles {ROLE}"]
    if user != "root@pam":
        commands.append(f"pveum acl modify {where} --users {user} --roles {ROLE}")
    return commands


def explain(error: ApiError, authid: str, token: bool, doing: str, outcome: str) -> str:
    """The message for `error`: who was refused while `doing` what, the client's words for PVE's answer,
    `outcome` (what was not changed), and what to fix."""
    refused = f"The PVE API refused {authid} while {doing}"
    if error.kind == "login":
        return f"{refused} ({error.said}). {outcome} " + (
            f"The token {authid} or its secret is wrong: check mlstack_pve_api_token_id and the secret in"
            f" vault (mlstack_pve_api_token_secret), or make the token again ({GRANT_DOC})."
            if token
            else "The user or its password is wrong: check mlstack_pve_api_user and mlstack_pve_api_password"
            " (vault)."
        )
    if error.kind == "privilege":
        return f"{refused}: {_lacks(error)} ({error.said}). {outcome} {_grant(error, authid)}"
    if error.kind == "root_only":
        return (
            f"{refused}: PVE allows this to the root@pam login only ({error.said}). {outcome} The project"
            " sends devN and host-path mpN keys through `pct set` on the node, never through the API."
        )
    if error.kind == "taken":
        return (
            f"{refused}: {error.said}. {outcome} A guest the preflight did not see holds that vmid: {authid}"
            f" lists only the guests it holds VM.Audit on (grant VM.Audit on /vms, {GRANT_DOC}), or the guest"
            " was made since; choose another vmid or remove that guest."
        )
    return f"The PVE API answered {error.said} while {doing} as {authid}. {outcome}"


def _lacks(error: ApiError) -> str:
    privileges = " or ".join(error.privileges) if error.any_of else ", ".join(error.privileges)
    lacks = f"it lacks {privileges} on {error.path}"
    if error.unnamed:
        lacks += ", which PVE checks there without naming it"
    return lacks


def _grant(error: ApiError, authid: str) -> str:
    held = [p for p in error.privileges if p in ROLE_PRIVILEGES]
    if not held:
        why = "; ".join(WHY_ASKED[p] for p in error.privileges if p in WHY_ASKED)
        return (
            f"The project's role {ROLE} does not hold {' or '.join(error.privileges)}"
            + (f" ({why})" if why else "")
            + f": grant it on {error.path} to {authid} with a role of yours, or change what asks for it."
        )
    role = f'pveum role add {ROLE} --privs "{",".join(ROLE_PRIVILEGES)}"'
    acl = "; ".join(f"`{c}`" for c in grant_commands(authid, error.path))
    return (
        f"Grant it as {GRANT_DOC} does: the role {ROLE} holds {held[0]} (`{role}`; `pveum role modify` for"
        f" a role that exists), granted on {grant_path(error.path)}: {acl}. Then rerun."
    )


def refusal(
    text: str,
    authid: str = "",
    token: bool = False,
    doing: str = "calling it",
    outcome: str = "",
    call: str = "",
    vmid: int | str | None = None,
) -> dict[str, object]:
    """classify() and explain() in one: the error's fields and its `message`, for a task to fail with."""
    error = classify(text, call, vmid)
    return {
        "kind": error.kind,
        "status": error.status,
        "reason": error.reason,
        "path": error.path,
        "privileges": list(error.privileges),
        "message": explain(error, authid, token, doing, outcome),
    }
