"""PVE's access control in the testbed's API: API tokens, roles and ACL entries with PVE's privilege
rule (fakepve lets any token of root@pam do anything), its permission checks and their 403s, the token
logins' 401s, and the /access endpoints that manage them (as `pveum` does).

- a privilege-separated token holds what is granted to it AND held by its user, a token without privilege
  separation exactly its user's, root@pam everything (privileges(), after PVE's RPCEnvironment);
- kept in access.json, each secret in its own 0600 file, reloaded at start;
- the testbed's own token is granted exactly PROVISION_PRIVILEGES, so a provisioning run with it proves
  the list the docs give a real cluster's admin;
- managed through PVE's /access endpoints by access_api.AccessApi.

PveAccess is a mixin of FakePve, as fakepve's own areas are (a `_routes_<area>` table and the hooks it
overrides: allowed, grant, check_permissions, _authenticate, the order of the create's checks). It
knows nothing of the real containers.
"""

import hmac
import json
import os
import re
import time
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from fakepve import shapes
from fakepve.model import PveError

from .. import paths

# The least privileges the project's API calls need (docs/real-cluster.md, "An API token instead of the
# password"). The testbed's own token gets exactly these, so a provisioning run with it proves the list.
PROVISION_ROLE = "MlstackProvision"
PROVISION_PRIVILEGES = (
    # rootfs on the storage (create); reading the template (create) and listing it (the LXC module
    # looks for the template in the storage's content first)
    "Datastore.AllocateSpace",
    # net0 on the bridge (PVE 8+ checks /sdn/zones/localnetwork/<bridge>)
    "SDN.Use",
    # create, destroy, and the nesting feature of an unprivileged container
    "VM.Allocate",
    # list the guests and read their configs (preflight vmid checks; a rerun sees its containers)
    "VM.Audit",
    "VM.Config.CPU",  # cores
    "VM.Config.Disk",  # rootfs
    "VM.Config.Memory",  # memory, swap
    "VM.Config.Network",  # hostname, net0
    "VM.Config.Options",  # tags, description, onboot
    # upgrade.yml -e mlstack_upgrade_snapshot=true: take and prune the project's snapshots
    "VM.Snapshot",
    # rollback.yml -e mlstack_rollback_to_snapshot=true
    "VM.Snapshot.Rollback",
)
PROVISION_ACL_PATHS = ("/vms", f"/storage/{paths.STORAGE}", f"/sdn/zones/localnetwork/{paths.BRIDGE}")
# PVE's built-in roles the testbed knows; others come from POST /access/roles.
BUILTIN_ROLES: dict[str, frozenset[str]] = {name: frozenset(privs) for name, privs in shapes.ROLES.items()}
ALL_PRIVILEGES = frozenset(shapes.PRIVILEGES)
TOKEN_NAME = re.compile(r"[A-Za-z][A-Za-z0-9._-]+")
USER_ID = re.compile(r"[^\s:/@]+@[A-Za-z][A-Za-z0-9._-]*")
# Set on a request whose login PVE refuses: the message of its 401.
LOGIN_REFUSED = web.RequestKey("mlstack_login_refused", str)


@dataclass
class Token:
    """An API token's settings (user.cfg); its secret is kept apart."""

    privsep: bool = True
    comment: str = ""
    expire: int = 0


@dataclass(frozen=True)
class AclEntry:
    """One ACL line: a role for a user or a token on a path, propagated below it or not."""

    path: str
    ugid: str
    role: str
    propagate: bool = True

    @property
    def kind(self) -> str:
        return "token" if "!" in self.ugid else "user"


def normalize_path(path: str) -> str:
    """PVE's normalize_path: one leading slash, no doubled or trailing ones."""
    return "/" + "/".join(seg for seg in str(path).split("/") if seg)


class PveAccess:
    """PVE's users, tokens, roles and ACL, and the checks made with them, for a FakePve subclass."""

    # What the mixin reads of FakePve: the pools (their roles reach their guests) and fakepve's own ACL,
    # switched off here.
    pools: dict[str, set[int]]
    pool_info: dict[str, dict[str, Any]]
    acl: Any

    def init_access(self, access_file: Path, tokens_dir: Path) -> None:
        # fakepve's "everyone may do anything until the first grant" is off; only root@pam
        # holds every privilege, others what PVE's rule gives them (privileges()).
        self.acl = {}
        self.access_file = access_file
        self.tokens_dir = tokens_dir
        self.userids: set[str] = {paths.API_USER}
        self.custom_roles: dict[str, frozenset[str]] = {}
        self.tokens: dict[str, Token] = {}
        self.token_secrets: dict[str, str] = {}
        self.acl_entries: list[AclEntry] = []
        self._deferred_template: tuple[Any, ...] | None = None

    # -------------------------------------------------------- PVE's privilege rule

    def role_privileges(self, role: str) -> frozenset[str]:
        return self.custom_roles.get(role, BUILTIN_ROLES.get(role, frozenset()))

    def privileges(self, authid: str | None, path: str) -> set[str]:
        """What `authid` (a user or user@realm!token) holds on `path`: PVE's RPCEnvironment::permissions.

        root@pam holds everything. A token holds nothing unless it exists; without privilege separation
        it holds exactly its user's privileges; with it, those granted to the token itself that its user
        also holds (a token of root@pam: only those granted to the token)."""
        if authid is None:
            return set()
        path = normalize_path(path)
        if authid == paths.API_USER:
            return set(ALL_PRIVILEGES)
        user, bang, _ = authid.partition("!")
        if bang:
            token = self.tokens.get(authid)
            if token is None or user not in self.userids or (token.expire and token.expire < time.time()):
                return set()
            user_privs = self.privileges(user, path)
            if not token.privsep:
                return user_privs
            own = self._acl_privileges(authid, path)
            return own if user == paths.API_USER else own & user_privs
        if user not in self.userids:
            return set()
        return self._acl_privileges(user, path)

    def _roles_on(self, ugid: str, path: str) -> dict[str, bool]:
        """PVE's AccessControl::roles: walk from / down to `path`; at each level that has entries for
        `ugid` (propagated ones, or any on `path` itself) they replace what was inherited."""
        roles: dict[str, bool] = {}
        for level in sorted({e.path for e in self.acl_entries}):
            final = level == path
            if not (level == "/" or final or path.startswith(level + "/")):
                continue
            here = {
                e.role: e.propagate
                for e in self.acl_entries
                if e.path == level and e.ugid == ugid and (final or e.propagate)
            }
            if here:
                roles = here
        return roles

    def _acl_privileges(self, ugid: str, path: str) -> set[str]:
        roles = self._roles_on(ugid, path)
        if "NoAccess" not in roles:
            # A pool's roles reach its guests and storages, never over a NoAccess (PVE's poolroles).
            for pool, vmids in sorted(self.pools.items()):
                storages = (self.pool_info.get(pool) or {}).get("storage") or ()
                members = {f"/vms/{vmid}" for vmid in vmids} | {f"/storage/{sid}" for sid in storages}
                if path not in members:
                    continue
                pool_roles = self._roles_on(ugid, f"/pool/{pool}")
                if "NoAccess" in pool_roles:
                    roles = {"NoAccess": False}
                    break
                for role in pool_roles:
                    roles.setdefault(role, False)
        if "NoAccess" in roles:
            return set()
        return {priv for role in roles for priv in self.role_privileges(role)}

    def allowed(self, user: str | None, path: str, priv: str) -> bool:
        return priv in self.privileges(user, path)

    def grant(self, user: str, path: str, *privs: str) -> None:
        """fakepve's grant(): the privileges on `path` for `user`, through a role made for them."""
        role = "grant:" + ",".join(sorted(privs))
        self.custom_roles[role] = frozenset(privs)
        if "!" not in user:
            self.userids.add(user)
        self.acl_entries.append(AclEntry(normalize_path(path), user, role))

    def _check(
        self, user: str | None, check: list[Any], values: dict[str, Any], declared: Any = None
    ) -> tuple[bool, str]:
        # PVE's "self" is the user itself, not a token of it (fakepve let the user's tokens pass).
        if check[:2] == ["userid-param", "self"]:
            return user is not None and values.get("userid") == user, ""
        ok, why = super()._check(user, check, values, declared)
        return bool(ok), str(why)

    def check_permissions(
        self, user: str | None, perms: dict[str, Any] | None, values: dict[str, Any], declared: Any = None
    ) -> None:
        """PVE's check_api2_permissions: only the root@pam login skips the checks (fakepve also let
        every token of root@pam skip them)."""
        if user == paths.API_USER:
            return
        if perms is not None and perms.get("user") in ("all", "world") and "check" not in perms:
            return
        if perms is None or "check" not in perms:
            raise PveError(403, "Permission check failed (user != root@pam)")
        ok, why = self._check(user, perms["check"], values, declared)
        if not ok:
            raise PveError(403, f"Permission check failed ({why})" if why else "Permission check failed")

    # PVE's create_vm checks the new config's privileges (check_ct_modify_config_perm) before the
    # template's (check_volume_access), fakepve the other way round: a token lacking
    # Datastore.AllocateSpace on the storage of both is refused for the root disk, as by PVE.
    def _check_template(self, user: str | None, ostemplate: str, restore: Any) -> None:
        self._deferred_template = (user, ostemplate, restore)

    def _check_modify_perm(self, user: str | None, vmid: int, *rest: Any) -> None:
        deferred, self._deferred_template = self._deferred_template, None
        super()._check_modify_perm(user, vmid, *rest)
        if deferred is not None:
            super()._check_template(*deferred)

    # ----------------------------------------------------------- authentication

    def _authenticate(self, request: Any) -> Any:
        """Who asks, or PVE's 401: noted on the request, whose answer is then PVE's status line alone."""
        try:
            return self._authid(request)
        except PveError as e:
            if e.status == 401:
                request[LOGIN_REFUSED] = e.message
            raise

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """PVE's API server answers a refused login (AnyEvent's auth_handler dying) with the status line
        and no body, where fakepve sends a JSON one: clients read the reason (proxmoxer prints it and
        the empty body's parse, ` - {'errors': b''}`), so the testbed answers as PVE does."""
        response: web.StreamResponse = await super()._middleware(request, handler)
        refused = request.get(LOGIN_REFUSED)
        if refused is not None and response.status == 401:
            return web.Response(status=401, reason=str(refused).splitlines()[0])
        return response

    def _authid(self, request: Any) -> Any:
        """An API token as PVE checks it (AccessControl::verify_token), with its 401 wording; no ticket
        at all as PVE's auth_handler words it; a ticket as fakepve checks it."""
        auth = request.headers.get("Authorization", "")
        if not auth.startswith("PVEAPIToken=") or request.path.endswith("/access/ticket"):
            if not request.path.endswith("/access/ticket") and not request.cookies.get("PVEAuthCookie"):
                raise PveError(401, "No ticket")
            return super()._authenticate(request)
        tokenid, eq, secret = auth[len("PVEAPIToken=") :].rpartition("=")
        if not eq:
            raise PveError(401, "no tokenid specified")
        user, bang, name = tokenid.partition("!")
        if not bang or not USER_ID.fullmatch(user) or not TOKEN_NAME.fullmatch(name):
            raise PveError(
                401, f"'{tokenid}' is not a valid token ID - not able to split into user and token parts"
            )
        if user not in self.userids:
            raise PveError(401, f"no such user ('{user}')")
        token = self.tokens.get(tokenid)
        if token is None:
            raise PveError(401, f"no such token '{name}' for user '{user}'")
        if token.expire and token.expire < time.time():
            raise PveError(401, f"token '{name}' access expired")
        if not hmac.compare_digest(self.token_secrets.get(tokenid, "").encode(), secret.encode()):
            raise PveError(401, "invalid token value!")
        return tokenid

    # -------------------------------------------------------------- management

    def add_user(self, userid: str) -> None:
        if not USER_ID.fullmatch(userid):
            raise PveError(400, "Parameter verification failed.", {"userid": "invalid format"})
        self.userids.add(userid)

    def add_role(self, roleid: str, privs: Iterable[str]) -> None:
        unknown = sorted(set(privs) - ALL_PRIVILEGES)
        if unknown:
            raise PveError(500, f"invalid privilege '{unknown[0]}'")
        self.custom_roles[roleid] = frozenset(privs)

    def add_token(self, tokenid: str, privsep: bool = True, comment: str = "", expire: int = 0) -> str:
        """Create a token; returns its secret (shown once, as PVE does)."""
        user, _, name = tokenid.partition("!")
        if user not in self.userids:
            raise PveError(500, f"no such user ('{user}')")
        if not TOKEN_NAME.fullmatch(name):
            raise PveError(400, "Parameter verification failed.", {"tokenid": "invalid format"})
        if tokenid in self.tokens:
            raise PveError(500, "Token already exists.")
        self.tokens[tokenid] = Token(privsep=privsep, comment=comment, expire=expire)
        self.token_secrets[tokenid] = str(uuid.uuid4())
        return self.token_secrets[tokenid]

    def remove_token(self, tokenid: str) -> None:
        user, _, name = tokenid.partition("!")
        if tokenid not in self.tokens:
            raise PveError(500, f"no such token '{name}' for user '{user}'")
        del self.tokens[tokenid]
        self.token_secrets.pop(tokenid, None)
        # PVE drops the token's ACL entries with it.
        self.acl_entries = [e for e in self.acl_entries if e.ugid != tokenid]

    def set_acl(self, path: str, roles: Iterable[str], ugids: Iterable[str], propagate: bool = True) -> None:
        path = normalize_path(path)
        for role in roles:
            if role not in self.custom_roles and role not in BUILTIN_ROLES:
                raise PveError(500, f"role '{role}' does not exist")
            for ugid in ugids:
                user, bang, name = ugid.partition("!")
                if bang and ugid not in self.tokens:
                    raise PveError(500, f"no such token '{name}' for user '{user}'")
                if not bang and user not in self.userids:
                    raise PveError(500, f"no such user ('{user}')")
                entry = AclEntry(path, ugid, role, propagate)
                self.acl_entries = [
                    e for e in self.acl_entries if (e.path, e.ugid, e.role) != (path, ugid, role)
                ]
                self.acl_entries.append(entry)

    def delete_acl(self, path: str, roles: Iterable[str], ugids: Iterable[str]) -> None:
        path, drop = normalize_path(path), {(r, u) for r in roles for u in ugids}
        self.acl_entries = [e for e in self.acl_entries if e.path != path or (e.role, e.ugid) not in drop]

    def ensure_provision_token(self) -> str | None:
        """The testbed's own privilege-separated token, granted PROVISION_PRIVILEGES on the paths the
        project's calls use; made when missing, its role and grants reset to the current list. Returns a
        note when something was made."""
        note = None
        if paths.API_TOKEN_ID not in self.tokens or not self.token_secrets.get(paths.API_TOKEN_ID):
            self.tokens.pop(paths.API_TOKEN_ID, None)
            self.add_token(paths.API_TOKEN_ID, privsep=True, comment="mlstack provisioning (least privilege)")
            note = f"made API token {paths.API_TOKEN_ID} (secret in {paths.API_TOKEN_SECRET_FILE})"
        self.tokens[paths.API_TOKEN_ID].privsep = True
        self.add_role(PROVISION_ROLE, PROVISION_PRIVILEGES)
        self.acl_entries = [e for e in self.acl_entries if e.ugid != paths.API_TOKEN_ID]
        for path in PROVISION_ACL_PATHS:
            self.set_acl(path, [PROVISION_ROLE], [paths.API_TOKEN_ID])
        self.save_access()
        return note

    # ------------------------------------------------------------- persistence

    def token_secret_file(self, tokenid: str) -> Path:
        user, _, name = tokenid.partition("!")
        return self.tokens_dir / user / name

    def save_access(self) -> None:
        """access.json (no secrets) and one 0600 file per token secret; secrets of gone tokens removed."""
        data = {
            "version": 1,
            "users": sorted(self.userids - {paths.API_USER}),
            "roles": {name: sorted(privs) for name, privs in sorted(self.custom_roles.items())},
            "tokens": {tid: asdict(t) for tid, t in sorted(self.tokens.items())},
            "acl": [asdict(e) for e in self.acl_entries],
        }
        tmp = self.access_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        tmp.replace(self.access_file)
        self.tokens_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        for tokenid, secret in self.token_secrets.items():
            f = self.token_secret_file(tokenid)
            f.parent.mkdir(exist_ok=True, mode=0o700)
            if not f.is_file() or f.read_text().strip() != secret:
                part = f.with_name(f.name + ".tmp")
                fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w") as out:
                    out.write(secret + "\n")
                part.replace(f)
        for f in self.tokens_dir.glob("*/*"):
            if f"{f.parent.name}!{f.name}" not in self.token_secrets:
                f.unlink()

    def load_access(self) -> None:
        if not self.access_file.is_file():
            return
        data = json.loads(self.access_file.read_text())
        self.userids = {paths.API_USER, *data.get("users", [])}
        self.custom_roles = {name: frozenset(privs) for name, privs in data.get("roles", {}).items()}
        self.tokens = {tid: Token(**t) for tid, t in data.get("tokens", {}).items()}
        self.acl_entries = [AclEntry(**e) for e in data.get("acl", [])]
        self.token_secrets = {}
        for tokenid in self.tokens:
            f = self.token_secret_file(tokenid)
            if f.is_file():
                self.token_secrets[tokenid] = f.read_text().strip()
