"""The PVE API of the testbed: fakepve's FakePve, with every container mirrored onto a real LXC container.

fakepve keeps PVE's schema, rules and wording; this subclass adds the real side:
- create / start / stop / shutdown / reboot / destroy tasks do the same to the real container of that
  vmid (the blocking work runs in a worker thread; a real failure fails the task as PVE words it);
- config PUT and create refuse a devN path that is not a device node on the host (PVE's check, which
  fakepve lacks), and rewrite the real LXC config;
- status and lists read the real state (real state wins whenever no task holds the container);
- the containers' API state is saved to the state dir after each change and reloaded at start;
- API tokens, roles and ACL entries with PVE's privilege rule (fakepve lets any token of root@pam do
  anything): a privilege-separated token holds what is granted to it AND held by its user, a token
  without privilege separation exactly its user's, root@pam everything; kept in access.json, each
  secret in its own 0600 file, and managed through PVE's /access endpoints (as `pveum` does).
"""

import asyncio
import hmac
import json
import logging
import os
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fakepve import shapes
from fakepve.lxc import FakeCt
from fakepve.model import PveError, TaskError
from fakepve.server import FakePve

from .. import paths
from ..lxc import lxcconf, realct

log = logging.getLogger("mlstack_testbed.node.backend")

Body = Callable[[], Awaitable[Any]]
TEMPLATE_SUFFIXES = (".tar.zst", ".tar.gz", ".tar.xz")
FORMATS = {".tar.zst": "tzst", ".tar.gz": "tgz", ".tar.xz": "txz"}

# The least privileges the project's API calls need (README, "An API token instead of the password").
# The testbed's own token gets exactly these, so a provisioning run with it proves the list.
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
)
PROVISION_ACL_PATHS = ("/vms", f"/storage/{paths.STORAGE}", f"/sdn/zones/localnetwork/{paths.BRIDGE}")
# PVE's built-in roles the testbed knows; others come from POST /access/roles.
BUILTIN_ROLES: dict[str, frozenset[str]] = {name: frozenset(privs) for name, privs in shapes.ROLES.items()}
ALL_PRIVILEGES = frozenset(shapes.PRIVILEGES)
TOKEN_NAME = re.compile(r"[A-Za-z][A-Za-z0-9._-]+")
USER_ID = re.compile(r"[^\s:/@]+@[A-Za-z][A-Za-z0-9._-]*")


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


class TestbedPve(FakePve):
    """FakePve on the nodes 'testbed', 'testbed2', ... whose containers are real."""

    def __init__(
        self,
        password: str,
        host: str = paths.API_HOST,
        port: int = paths.API_PORT,
        state_file: Path = paths.API_STATE,
        access_file: Path = paths.ACCESS_FILE,
        tokens_dir: Path = paths.TOKENS_DIR,
    ) -> None:
        super().__init__(user=paths.API_USER, password=password, host=host, port=port)
        # Access: fakepve's "everyone may do anything until the first grant" is off; only root@pam
        # holds every privilege, others what PVE's rule gives them (privileges()).
        self.acl = {}
        self.access_file = access_file
        self.tokens_dir = tokens_dir
        self.userids: set[str] = {paths.API_USER}
        self.custom_roles: dict[str, frozenset[str]] = {}
        self.tokens: dict[str, Token] = {}
        self.token_secrets: dict[str, str] = {}
        self.acl_entries: list[AclEntry] = []
        # The cluster's nodes; their containers all live in the machine's LXC (vmids unique cluster-wide).
        self.nodes = {name: {"online": True} for name in paths.cluster_nodes()}
        # Tasks run in the background as on PVE; PVE seconds are real seconds (no delays are configured).
        self.time_scale = 1.0
        # One dir storage, as a PVE installed on ext4 without LVM has it.
        self.storages = {
            paths.STORAGE: {
                "type": "dir",
                "active": 1,
                "content": "iso,vztmpl,backup,rootdir,images",
                "files": set(),
                "volumes": {},
                "path": str(paths.LOCAL_STORAGE),
                "avail": 50 * 1024**3,
            }
        }
        self.state_file = state_file
        self._create_templates: dict[int, str] = {}
        self._shutdown_args: dict[int, tuple[int, bool]] = {}
        self._loading = False
        self.refresh_templates()

    # ------------------------------------------------------------------ storage

    def refresh_templates(self) -> None:
        """List the OS templates in the local storage's template/cache as vztmpl volumes."""
        store = self.storages[paths.STORAGE]
        vols = {k: v for k, v in store["volumes"].items() if not k.startswith("vztmpl/")}
        cache = paths.LOCAL_STORAGE / "template" / "cache"
        for f in sorted(cache.glob("*.tar.*")) if cache.is_dir() else []:
            suffix = next((s for s in TEMPLATE_SUFFIXES if f.name.endswith(s)), None)
            if suffix:
                st = f.stat()
                vols[f"vztmpl/{f.name}"] = {
                    "content": "vztmpl",
                    "format": FORMATS[suffix],
                    "size": st.st_size,
                    "ctime": int(st.st_mtime),
                }
        store["volumes"] = vols

    def template_file(self, volid: str) -> Path:
        sid, _, volname = volid.partition(":")
        if sid != paths.STORAGE or not volname.startswith("vztmpl/"):
            raise realct.RealCtError(
                f"unable to use volume {volid} - not an OS template on storage '{paths.STORAGE}'"
            )
        return paths.LOCAL_STORAGE / "template" / "cache" / volname.split("/", 1)[1]

    # ---------------------------------------------------------------- checks

    @staticmethod
    def _check_devices(values: dict[str, Any]) -> None:
        """PVE checks each devN at config time: a valid /dev path that is a device node on the host."""
        for key, value in values.items():
            if lxcconf.DEV_KEY.match(key):
                try:
                    lxcconf.check_device(lxcconf.parse_dev(key, str(value)).path)
                except lxcconf.PveFormatError as e:
                    raise PveError(
                        400, "Parameter verification failed.", {key: f"invalid format - {e}\n"}
                    ) from None
                except lxcconf.PveConfigError as e:
                    raise PveError(500, str(e)) from None

    def _check_vmid_unused(self, vmid: int) -> None:
        super()._check_vmid_unused(vmid)
        if not self._loading and realct.ct_dir(vmid).exists():
            # A real container nobody registered: the id is taken on this node.
            raise PveError(500, f"CT {vmid} already exists on node '{paths.NODE}'")

    # ----------------------------------------------------------- API handlers

    def _lxc_handler(self, fn: Callable[..., Awaitable[Any]]) -> Any:
        async def saving(user: str, v: dict[str, Any]) -> Any:
            try:
                return await fn(user, v)
            finally:
                self.save()

        return super()._lxc_handler(saving)

    async def _lxc_create(self, user: str, v: dict[str, Any]) -> Any:
        self._check_devices(v)
        self.refresh_templates()
        self._create_templates[int(v["vmid"])] = str(v.get("ostemplate", ""))
        return await super()._lxc_create(user, v)

    async def _update_config(
        self, ct: FakeCt, user: str, values: dict[str, Any], deletes: list[str], reverts: list[str]
    ) -> None:
        self._check_devices(values)
        await super()._update_config(ct, user, values, deletes, reverts)
        if realct.exists(ct.vmid) and ct.status != "running":
            try:
                await asyncio.to_thread(realct.write_config, ct.vmid, dict(ct.config))
            except lxcconf.PveConfigError as e:
                # PVE finds these at start, as here; the config stays as written.
                log.info("CT %s: real config not rewritten yet: %s", ct.vmid, e)

    # ---------------------------------------------------------------- tasks

    async def task(
        self,
        node: str,
        ttype: str,
        tid: Any,
        user: str,
        body: Body,
        vm: Any = None,
        lock: bool = True,
        log: Any = (),
    ) -> str:
        hook = {
            "vzcreate": self._real_create,
            "vzstart": self._real_start,
            "vzstop": self._real_stop,
            "vzshutdown": self._real_shutdown,
            "vzreboot": self._real_reboot,
            "vzdestroy": self._real_destroy,
        }.get(ttype)
        if hook is None or not isinstance(vm, FakeCt):
            return await super().task(node, ttype, tid, user, body, vm=vm, lock=lock, log=log)
        record: dict[str, Any] = {}

        async def real() -> Any:
            try:
                return await hook(vm, body, record.get("log", []))
            finally:
                self.save()

        upid = await super().task(node, ttype, tid, user, real, vm=vm, lock=lock, log=log)
        record["log"] = self.tasks[upid]["log"]
        return upid

    async def _real_create(self, ct: FakeCt, body: Body, tasklog: list[str]) -> Any:
        ostemplate = self._create_templates.pop(ct.vmid, "")
        note = await body()
        start = ct.status == "running"
        try:
            tarball = self.template_file(ostemplate)
            unpriv = bool(ct.config.get("unprivileged"))
            tasklog.append(f"extracting archive '{tarball}'")
            await asyncio.to_thread(realct.create_from_template, ct.vmid, tarball, unpriv)
            await asyncio.to_thread(realct.write_config, ct.vmid, dict(ct.config))
            if start:
                await asyncio.to_thread(realct.start, ct.vmid, dict(ct.config))
        except (realct.RealCtError, lxcconf.PveConfigError, OSError) as e:
            self._drop(ct)
            await asyncio.to_thread(realct.destroy, ct.vmid)
            raise TaskError(f"unable to create CT {ct.vmid} - {e}") from e
        return note

    async def _real_start(self, ct: FakeCt, body: Body, tasklog: list[str]) -> Any:
        note = await body()
        try:
            if not realct.exists(ct.vmid):
                raise realct.RealCtError(f"no real container {ct.vmid} in {paths.LXC_PATH}")
            await asyncio.to_thread(realct.start, ct.vmid, dict(ct.config))
        except (realct.RealCtError, lxcconf.PveConfigError, OSError) as e:
            ct.status, ct.pid = "stopped", None
            tasklog.append(str(e))
            raise TaskError(f"startup for container '{ct.vmid}' failed") from e
        self._reconcile(ct)
        return note

    async def _real_stop(self, ct: FakeCt, body: Body, tasklog: list[str]) -> Any:
        note = await body()
        await self._stop_real(ct, None)
        return note

    async def _real_shutdown(self, ct: FakeCt, body: Body, tasklog: list[str]) -> Any:
        # PVE: lxc-stop with the timeout; forceStop kills after it, else the task fails.
        timeout, force = self._shutdown_args.pop(ct.vmid, (self.shutdown_default_timeout, False))
        try:
            await asyncio.to_thread(realct.stop, ct.vmid, timeout, force)
        except realct.RealCtError as e:
            raise TaskError(str(e)) from e
        return await body()

    async def _real_reboot(self, ct: FakeCt, body: Body, tasklog: list[str]) -> Any:
        await self._stop_real(ct, self.shutdown_default_timeout)
        return await self._real_start(ct, body, tasklog)

    async def _real_destroy(self, ct: FakeCt, body: Body, tasklog: list[str]) -> Any:
        note = await body()
        try:
            await asyncio.to_thread(realct.destroy, ct.vmid)
        except realct.RealCtError as e:
            raise TaskError(str(e)) from e
        return note

    async def _stop_real(self, ct: FakeCt, timeout: int | None) -> None:
        try:
            await asyncio.to_thread(realct.stop, ct.vmid, timeout, True)
        except realct.RealCtError as e:
            raise TaskError(str(e)) from e

    async def _lxc_shutdown(self, user: str, v: dict[str, Any]) -> Any:
        vmid = int(v["vmid"])
        timeout = v["timeout"] if v.get("timeout") is not None else self.shutdown_default_timeout
        self._shutdown_args[vmid] = (int(timeout), bool(v.get("forceStop")))
        return await super()._lxc_shutdown(user, v)

    # --------------------------------------------------------------- status

    def _reconcile(self, ct: FakeCt) -> None:
        """Real state wins while no task holds the container."""
        if ct.lock_holder is not None or ct.lock:
            return
        status, pid = realct.state(ct.vmid)
        if status == "running":
            ct.status, ct.pid = "running", pid
        else:
            ct.status, ct.pid = "stopped", None

    def _status(self, ct: FakeCt) -> dict[str, Any]:
        self._reconcile(ct)
        return super()._status(ct)

    def ct_resources(self, user: str, kind: str | None = None) -> list[dict[str, Any]]:
        for ct in self.cts:
            self._reconcile(ct)
        return super().ct_resources(user, kind)

    # ---------------------------------------------------------- persistence

    def save(self) -> None:
        data = {
            "version": 1,
            "cts": [
                {
                    "vmid": ct.vmid,
                    "node": ct.node,
                    "config": ct.config,
                    "pending": ct.pending,
                    "status": ct.status,
                }
                for ct in self.cts
                if ct.lock != "create"
            ],
            # Login tickets outlive a restart of the server, as PVE's signed tickets do.
            "tickets": {t: v for t, v in self.tickets.items() if v.get("expires", 0) > time.time()},
        }
        tmp = self.state_file.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(data, indent=1, sort_keys=True) + "\n")
        tmp.replace(self.state_file)

    def issue_ticket(self, user: str) -> tuple[str, str]:
        ticket: tuple[str, str] = super().issue_ticket(user)
        self.save()
        return ticket

    def load(self) -> list[str]:
        """Reload the saved containers; those whose real container is gone are dropped (real state wins)."""
        notes: list[str] = []
        if not self.state_file.is_file():
            return notes
        data = json.loads(self.state_file.read_text())
        self.tickets.update(
            {t: v for t, v in data.get("tickets", {}).items() if float(v.get("expires", 0)) > time.time()}
        )
        self._loading = True
        try:
            self._load_items(data, notes)
        finally:
            self._loading = False
        return notes

    def _load_items(self, data: dict[str, Any], notes: list[str]) -> None:
        for item in data.get("cts", []):
            vmid = int(item["vmid"])
            status, pid = realct.state(vmid)
            if status == "missing":
                notes.append(f"CT {vmid}: no real container any more; dropped from the API")
                continue
            ct = self.add_ct(
                vmid,
                node=str(item.get("node") or data.get("node") or paths.FIRST_NODE),
                status="stopped",
                config=item.get("config") or {},
                pending=item.get("pending") or {},
                defaults=False,
            )
            ct.config.pop("lock", None)
            ct.status, ct.pid = status, pid
            if status == "running":
                ct.started_at = (
                    os.stat(f"/proc/{pid}").st_mtime if pid and Path(f"/proc/{pid}").exists() else None
                )

    # ------------------------------------------------------- storage content

    # pveam downloads templates into the storage's folder behind the API's back, as on PVE: the
    # storage's content is read from the folder whenever it is asked for.
    async def _content_list(self, v: dict[str, Any], user: str) -> Any:
        self.refresh_templates()
        return await super()._content_list(v, user)

    async def _content_info(self, v: dict[str, Any], user: str) -> Any:
        self.refresh_templates()
        return await super()._content_info(v, user)

    # ------------------------------------------------ access: PVE's privilege rule

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

    # --------------------------------------------------- access: authentication

    def _authenticate(self, request: Any) -> Any:
        """An API token as PVE checks it (AccessControl::verify_token), with its 401 wording; tickets
        as fakepve does."""
        auth = request.headers.get("Authorization", "")
        if not auth.startswith("PVEAPIToken=") or request.path.endswith("/access/ticket"):
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

    # ------------------------------------------------------ access: management

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

    # ----------------------------------------------------- access: persistence

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

    # ------------------------------------------------------ access: API routes

    def _routes_access_control(self) -> list[tuple[str, str, Callable[..., Awaitable[Any]]]]:
        token = "/access/users/{userid}/token"
        return [
            ("GET", token, self._token_list),
            ("GET", token + "/{tokenid}", self._token_read),
            ("POST", token + "/{tokenid}", self._token_create),
            ("PUT", token + "/{tokenid}", self._token_update),
            ("DELETE", token + "/{tokenid}", self._token_delete),
            ("GET", "/access/acl", self._acl_list),
            ("PUT", "/access/acl", self._acl_update),
            ("GET", "/access/roles", self._role_list),
            ("POST", "/access/roles", self._role_create),
            ("GET", "/access/roles/{roleid}", self._role_read),
            ("PUT", "/access/roles/{roleid}", self._role_update),
            ("DELETE", "/access/roles/{roleid}", self._role_delete),
        ]

    def _token_view(self, tokenid: str) -> dict[str, Any]:
        t = self.tokens[tokenid]
        return {"privsep": int(t.privsep), "comment": t.comment, "expire": t.expire}

    def _token_id(self, v: dict[str, Any]) -> str:
        userid, tokenid = str(v["userid"]), f"{v['userid']}!{v['tokenid']}"
        if userid not in self.userids:
            raise PveError(500, f"no such user ('{userid}')")
        return tokenid

    async def _token_list(self, v: dict[str, Any], user: str) -> Any:
        prefix = f"{v['userid']}!"
        return [
            {"tokenid": tid[len(prefix) :], **self._token_view(tid)}
            for tid in sorted(self.tokens)
            if tid.startswith(prefix)
        ]

    async def _token_read(self, v: dict[str, Any], user: str) -> Any:
        tokenid = self._token_id(v)
        if tokenid not in self.tokens:
            raise PveError(500, f"no such token '{v['tokenid']}' for user '{v['userid']}'")
        return self._token_view(tokenid)

    async def _token_create(self, v: dict[str, Any], user: str) -> Any:
        tokenid = self._token_id(v)
        privsep = bool(int(v.get("privsep", 1)))
        secret = self.add_token(tokenid, privsep, str(v.get("comment") or ""), int(v.get("expire") or 0))
        self.save_access()
        return {"full-tokenid": tokenid, "info": self._token_view(tokenid), "value": secret}

    async def _token_update(self, v: dict[str, Any], user: str) -> Any:
        tokenid = self._token_id(v)
        if tokenid not in self.tokens:
            raise PveError(500, f"no such token '{v['tokenid']}' for user '{v['userid']}'")
        t = self.tokens[tokenid]
        if v.get("privsep") is not None:
            t.privsep = bool(int(v["privsep"]))
        if v.get("comment") is not None:
            t.comment = str(v["comment"])
        if v.get("expire") is not None:
            t.expire = int(v["expire"])
        out = self._token_view(tokenid)
        if v.get("regenerate"):
            self.token_secrets[tokenid] = str(uuid.uuid4())
            out["value"] = self.token_secrets[tokenid]
        self.save_access()
        return out

    async def _token_delete(self, v: dict[str, Any], user: str) -> Any:
        self.remove_token(self._token_id(v))
        self.save_access()
        return None

    @staticmethod
    def _split(value: Any) -> list[str]:
        items = value if isinstance(value, list) else [value]
        return [x for item in items if item is not None for x in re.split(r"[,;\s]+", str(item)) if x]

    async def _acl_list(self, v: dict[str, Any], user: str) -> Any:
        return [
            {"path": e.path, "type": e.kind, "ugid": e.ugid, "roleid": e.role, "propagate": int(e.propagate)}
            for e in self.acl_entries
            if user == paths.API_USER or "Sys.Audit" in self.privileges(user, "/access")
        ]

    async def _acl_update(self, v: dict[str, Any], user: str) -> Any:
        roles = self._split(v.get("roles"))
        ugids = self._split(v.get("users")) + self._split(v.get("tokens"))
        if self._split(v.get("groups")):
            raise PveError(500, "the testbed has no groups")
        if v.get("delete"):
            self.delete_acl(str(v["path"]), roles, ugids)
        else:
            self.set_acl(str(v["path"]), roles, ugids, bool(int(v.get("propagate", 1))))
        self.save_access()
        return None

    async def _role_list(self, v: dict[str, Any], user: str) -> Any:
        roles = {**BUILTIN_ROLES, **self.custom_roles}
        return [
            {"roleid": name, "privs": ",".join(sorted(privs)), "special": int(name in BUILTIN_ROLES)}
            for name, privs in sorted(roles.items())
        ]

    async def _role_create(self, v: dict[str, Any], user: str) -> Any:
        roleid = str(v["roleid"])
        if roleid in self.custom_roles or roleid in BUILTIN_ROLES:
            raise PveError(500, f"role '{roleid}' already exists")
        self.add_role(roleid, self._split(v.get("privs")))
        self.save_access()
        return None

    async def _role_read(self, v: dict[str, Any], user: str) -> Any:
        roleid = str(v["roleid"])
        if roleid not in self.custom_roles and roleid not in BUILTIN_ROLES:
            raise PveError(500, f"role '{roleid}' does not exist")
        return dict.fromkeys(sorted(self.role_privileges(roleid)), 1)

    async def _role_update(self, v: dict[str, Any], user: str) -> Any:
        roleid = str(v["roleid"])
        if roleid in BUILTIN_ROLES:
            raise PveError(500, f"cannot modify role '{roleid}'")
        if roleid not in self.custom_roles:
            raise PveError(500, f"role '{roleid}' does not exist")
        privs = set(self._split(v.get("privs")))
        self.add_role(roleid, privs | (set(self.custom_roles[roleid]) if v.get("append") else set()))
        self.save_access()
        return None

    async def _role_delete(self, v: dict[str, Any], user: str) -> Any:
        roleid = str(v["roleid"])
        if roleid in BUILTIN_ROLES:
            raise PveError(500, f"cannot delete role '{roleid}'")
        if self.custom_roles.pop(roleid, None) is None:
            raise PveError(500, f"role '{roleid}' does not exist")
        # PVE drops the role from every ACL entry.
        self.acl_entries = [e for e in self.acl_entries if e.role != roleid]
        self.save_access()
        return None

    async def _permissions(self, v: dict[str, Any], user: str) -> Any:
        """GET /access/permissions with PVE's rule; another user's (not one's own token's) needs
        Sys.Audit on /access."""
        who = str(v.get("userid") or user)
        own = who == user or who.partition("!")[0] == user
        if not own and "Sys.Audit" not in self.privileges(user, "/access"):
            raise PveError(403, "Permission check failed (/access, Sys.Audit)")
        if v.get("path") is not None:
            wanted = [normalize_path(str(v["path"]))]
        else:
            wanted = sorted(
                {"/", "/access", "/access/groups", "/nodes", "/pool", "/sdn", "/storage", "/vms"}
                | {e.path for e in self.acl_entries}
                | {f"/vms/{vmid}" for vmids in self.pools.values() for vmid in vmids}
            )
        held = {path: self.privileges(who, path) for path in wanted}
        return {path: dict.fromkeys(sorted(privs), 1) for path, privs in held.items() if privs}
