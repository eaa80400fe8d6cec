"""The PVE API of the testbed: fakepve's FakePve, with every container mirrored onto a real LXC container.

fakepve keeps PVE's schema, rules and wording; this subclass adds the real side:
- create / start / stop / shutdown / reboot / destroy tasks do the same to the real container of that
  vmid (the blocking work runs in a worker thread; a real failure fails the task as PVE words it);
- config PUT and create refuse a devN path that is not a device node on the host (PVE's check, which
  fakepve lacks), and a hookscript that is not an executable snippet, and rewrite the real LXC config;
- a start runs the container's hookscript as PVE does (hooks.py): pre-start before lxc-start, a refusal
  failing the start with the script's output in the task log, post-start after;
- status and lists read the real state (real state wins whenever no task holds the container);
- snapshot / rollback / delete-snapshot tasks on a container whose disks are on a snapshot-capable
  storage (fakepve refuses the others with PVE's "snapshot feature is not available") keep a real copy
  of its rootfs under the state dir's snapshots/<vmid>/<name>, put it back, and remove it;
- the containers' API state, snapshots included, is saved to the state dir after each change and
  reloaded at start;
- API tokens, roles, ACL entries and PVE's permission checks come from access.PveAccess, its
  /access endpoints from access_api.AccessApi.
"""

import asyncio
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from fakepve.lxc import FakeCt
from fakepve.model import PveError, TaskError
from fakepve.server import FakePve

from .. import paths
from ..lxc import lxcconf, realct
from . import hooks
from .access_api import AccessApi

log = logging.getLogger("mlstack_testbed.node.backend")

Body = Callable[[], Awaitable[Any]]
TEMPLATE_SUFFIXES = (".tar.zst", ".tar.gz", ".tar.xz")
# What PVE sets on a running container's cgroup when its config changes (the rest is config only).
LIVE_LIMITS = ("memory", "swap", "cores")
FORMATS = {".tar.zst": "tzst", ".tar.gz": "tgz", ".tar.xz": "txz"}
# A second storage, type btrfs, for containers that take snapshots. It stands in for a btrfs storage:
# a plain folder, the snapshots real copies of the container's rootfs (cp -a) instead of btrfs subvolume
# snapshots. 'local' (type dir) cannot snapshot, as on PVE.
SNAPSHOT_STORAGE = "local-btrfs"
SNAPSHOT_STORAGE_DIR = paths.STATE_DIR / "storage" / SNAPSHOT_STORAGE


class TestbedPve(AccessApi, FakePve):
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
        self.init_access(access_file, tokens_dir)
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
            },
            SNAPSHOT_STORAGE: {
                "type": "btrfs",
                "active": 1,
                "content": "rootdir,images",
                "files": set(),
                "volumes": {},
                "path": str(SNAPSHOT_STORAGE_DIR),
                "avail": 50 * 1024**3,
            },
        }
        self.state_file = state_file
        # Each snapshot's rootfs copy: <snapshot_dir>/<vmid>/<name>/rootfs, beside the API's state
        # (paths.SNAPSHOTS_DIR for the testbed's own state file).
        self.snapshot_dir = state_file.parent / paths.SNAPSHOTS_DIR.name
        self._rollback_start: dict[int, bool] = {}
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
        if values.get("hookscript"):
            try:
                hooks.script_path(str(values["hookscript"]))
            except hooks.HookError as e:
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
        before, running = dict(ct.config), ct.status == "running"
        await super()._update_config(ct, user, values, deletes, reverts)
        if not realct.exists(ct.vmid):
            return
        if running:
            self._keep_unplugged_pending(ct, before)
            if any(ct.config.get(k) != before.get(k) for k in LIVE_LIMITS):
                # PVE hotplugs these into the running container's cgroup (cpuset for cores: pvestatd).
                try:
                    await asyncio.to_thread(realct.apply_limits, ct.vmid, dict(ct.config))
                except (realct.RealCtError, lxcconf.PveConfigError) as e:
                    raise PveError(500, f"unable to hotplug {', '.join(LIVE_LIMITS)}: {e}") from None
            return
        try:
            await asyncio.to_thread(realct.write_config, ct.vmid, dict(ct.config))
        except lxcconf.PveConfigError as e:
            # PVE finds these at start, as here; the config stays as written.
            log.info("CT %s: real config not rewritten yet: %s", ct.vmid, e)

    @staticmethod
    def _keep_unplugged_pending(ct: FakeCt, before: dict[str, Any]) -> None:
        """A new devN/mpN that fakepve counts as hotplugged into a running container stays pending: the
        testbed does not plug a node or a bind mount into a running real container, so the container
        gets it at its next start, as on a PVE node where the hotplug failed."""
        for key in [k for k in ct.config if (lxcconf.DEV_KEY.match(k) or lxcconf.MP_KEY.match(k))]:
            if key not in before:
                ct.pending[key] = ct.config.pop(key)

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
            "vzsnapshot": self._real_snapshot,
            "vzrollback": self._real_rollback,
            "vzdelsnapshot": self._real_delsnapshot,
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
                await self._hook(ct, "pre-start", tasklog)
                await asyncio.to_thread(realct.start, ct.vmid, dict(ct.config))
        except (realct.RealCtError, lxcconf.PveConfigError, OSError, hooks.HookError) as e:
            self._drop(ct)
            await asyncio.to_thread(realct.destroy, ct.vmid)
            raise TaskError(f"unable to create CT {ct.vmid} - {e}") from e
        return note

    async def _real_start(self, ct: FakeCt, body: Body, tasklog: list[str]) -> Any:
        note = await body()
        try:
            if not realct.exists(ct.vmid):
                raise realct.RealCtError(f"no real container {ct.vmid} in {paths.LXC_PATH}")
            await self._hook(ct, "pre-start", tasklog)
            await asyncio.to_thread(realct.start, ct.vmid, dict(ct.config))
        except hooks.HookError as e:
            ct.status, ct.pid = "stopped", None
            raise TaskError(str(e)) from e
        except (realct.RealCtError, lxcconf.PveConfigError, OSError) as e:
            ct.status, ct.pid = "stopped", None
            tasklog.append(str(e))
            raise TaskError(f"startup for container '{ct.vmid}' failed") from e
        self._reconcile(ct)
        await self._hook(ct, "post-start", tasklog)
        return note

    async def _hook(self, ct: FakeCt, phase: str, tasklog: list[str]) -> None:
        """The container's hookscript for `phase`, if it has one (in a worker thread: the script may call
        this API, as `pct config` does)."""
        volid = ct.config.get("hookscript")
        if volid:
            await asyncio.to_thread(hooks.run_phase, str(volid), ct.vmid, ct.node, phase, tasklog)

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
            await asyncio.to_thread(realct.drop_snapshot_copies, self.snapshot_dir / str(ct.vmid))
        except realct.RealCtError as e:
            raise TaskError(str(e)) from e
        return note

    # ------------------------------------------------------------- snapshots

    def snapshot_copy(self, vmid: int, name: str) -> Path:
        """The folder holding the real copy of snapshot `name` of container `vmid`."""
        return self.snapshot_dir / str(vmid) / name

    async def _real_snapshot(self, ct: FakeCt, body: Body, tasklog: list[str]) -> Any:
        # fakepve's body checks the storage, the name and the locks, and records the snapshot.
        before = set(ct.snapshots)
        note = await body()
        for name in set(ct.snapshots) - before:
            ct.lock = "snapshot"
            try:
                await asyncio.to_thread(realct.snapshot_rootfs, ct.vmid, self.snapshot_copy(ct.vmid, name))
            except (realct.RealCtError, OSError) as e:
                parent = ct.snapshots.pop(name).get("parent")
                if parent:
                    ct.config["parent"] = parent
                else:
                    ct.config.pop("parent", None)
                raise TaskError(f"snapshot '{name}' failed: {e}") from e
            finally:
                ct.lock = None
        return note

    async def _lxc_rollback(self, user: str, v: dict[str, Any]) -> Any:
        # The start after a rollback is the real container's: fakepve's body only restores the config.
        vmid, start = int(v["vmid"]), bool(int(v.get("start") or 0))
        if start:
            self.require(user, f"/vms/{vmid}", "VM.PowerMgmt")
        self._rollback_start[vmid] = start
        try:
            return await super()._lxc_rollback(user, {**v, "start": 0})
        except Exception:
            self._rollback_start.pop(vmid, None)
            raise

    async def _real_rollback(self, ct: FakeCt, body: Body, tasklog: list[str]) -> Any:
        start = self._rollback_start.pop(ct.vmid, False)
        # fakepve's body checks the snapshot and restores the PVE config (its 'parent' names the snapshot).
        note = await body()
        name = str(ct.config.get("parent", ""))
        ct.lock = "rollback"
        try:
            await asyncio.to_thread(realct.stop, ct.vmid, None, True)
            await asyncio.to_thread(realct.restore_rootfs, ct.vmid, self.snapshot_copy(ct.vmid, name))
            await asyncio.to_thread(realct.write_config, ct.vmid, dict(ct.config))
        except (realct.RealCtError, lxcconf.PveConfigError, OSError) as e:
            raise TaskError(f"rollback to snapshot '{name}' failed: {e}") from e
        finally:
            ct.lock = None
            self._reconcile(ct)
        if start:
            try:
                await asyncio.to_thread(realct.start, ct.vmid, dict(ct.config))
            except (realct.RealCtError, lxcconf.PveConfigError, OSError) as e:
                tasklog.append(str(e))
                raise TaskError(f"startup for container '{ct.vmid}' failed") from e
            finally:
                self._reconcile(ct)
        return note

    async def _real_delsnapshot(self, ct: FakeCt, body: Body, tasklog: list[str]) -> Any:
        before = set(ct.snapshots)
        note = await body()
        for name in before - set(ct.snapshots):
            try:
                await asyncio.to_thread(realct.drop_snapshot_copies, self.snapshot_copy(ct.vmid, name))
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
                    "snapshots": ct.snapshots,
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
            ct.snapshots = self._saved_snapshots(vmid, item.get("snapshots") or {}, notes)
            ct.status, ct.pid = status, pid
            if status == "running":
                ct.started_at = (
                    os.stat(f"/proc/{pid}").st_mtime if pid and Path(f"/proc/{pid}").exists() else None
                )

    def _saved_snapshots(
        self, vmid: int, saved: dict[str, Any], notes: list[str]
    ) -> dict[str, dict[str, Any]]:
        """The saved snapshots whose real copy is still there (real state wins)."""
        kept = {}
        for name, snap in saved.items():
            if (self.snapshot_copy(vmid, name) / "rootfs").is_dir():
                kept[name] = dict(snap)
            else:
                notes.append(f"CT {vmid}: snapshot {name} has no real copy any more; dropped from the API")
        return kept

    # ------------------------------------------------------- storage content

    # pveam downloads templates into the storage's folder behind the API's back, as on PVE: the
    # storage's content is read from the folder whenever it is asked for.
    async def _content_list(self, v: dict[str, Any], user: str) -> Any:
        self.refresh_templates()
        return await super()._content_list(v, user)

    async def _content_info(self, v: dict[str, Any], user: str) -> Any:
        self.refresh_templates()
        return await super()._content_info(v, user)
