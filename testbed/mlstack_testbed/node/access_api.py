"""PVE's /access endpoints in the testbed's API, as `pveum` uses them: API tokens
(`/access/users/{userid}/token[/{tokenid}]`, the secret answered once, as `value`), roles
(`/access/roles[/{roleid}]`), the ACL (`/access/acl`) and `GET /access/permissions` with PVE's rule. Each
change is saved at once (access.PveAccess.save_access).

AccessApi is the area mixin of FakePve (its `_routes_access_control` table) over the access control.
"""

import re
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from fakepve.model import PveError

from .. import paths
from .access import BUILTIN_ROLES, PveAccess, normalize_path


class AccessApi(PveAccess):
    """The /access endpoints over PveAccess's users, tokens, roles and ACL."""

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
