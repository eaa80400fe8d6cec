"""The Jinja face of module_utils/pve_errors: a PVE API error classified, with the message to fail with."""

from __future__ import annotations

from typing import Any

from ansible_collections.mlstack.pve.plugins.module_utils import pve_errors


def pve_api_error(
    text: str,
    authid: str = "",
    token: bool = False,
    doing: str = "calling it",
    outcome: str = "",
    call: str = "",
    vmid: Any = None,
) -> dict[str, object]:
    """See module_utils/pve_errors.refusal."""
    return pve_errors.refusal(str(text), str(authid), bool(token), str(doing), str(outcome), str(call), vmid)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"pve_api_error": pve_api_error}
