"""Filter `stack_choice`: the effective stack profile, extras and purpose of a container on its GPUs."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.mlstack.pve.plugins.module_utils.stack_policy import choose_stack


def stack_choice(gpus: list[dict[str, Any]], container: dict[str, Any], profiles_dir: str) -> dict[str, Any]:
    """See module_utils/stack_policy.choose_stack; bad input is an AnsibleFilterError naming the container."""
    try:
        return choose_stack(list(gpus or []), dict(container), str(profiles_dir))
    except (ValueError, OSError) as e:
        raise AnsibleFilterError(str(e)) from e


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"stack_choice": stack_choice}
