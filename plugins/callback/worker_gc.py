# Copyright (c) 2026 mlstack maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Each forked worker freezes the heap it inherits, so its garbage collector never walks it."""

from __future__ import annotations

DOCUMENTATION = r"""
name: worker_gc
type: aggregate
author: mlstack maintainers
short_description: Less controller CPU per task, by freezing the heap each worker inherits
description:
  - >-
    ansible-playbook forks one worker process per task and host from its main process. A garbage
    collection in a worker walks the objects it inherited (the inventory, variables and plugins the
    main process holds) in the generations it collects, and writes to each, so the kernel copies
    those pages into a worker that runs one task.
  - >-
    With this callback enabled, each worker calls C(gc.freeze()) right after the fork: the inherited
    objects are left out of its collections, and what the worker itself allocates is collected as
    before. The main process is unchanged. It prints nothing and changes no result.
  - >-
    On the testbed a changed=0 rerun of one node and two containers costs about 10% less controller
    CPU, a first container about 14% (docs/benchmarks.md). Enable it with
    C(callbacks_enabled = mlstack.pve.worker_gc) in the C([defaults]) section of ansible.cfg, as this
    collection's own ansible.cfg does. A run that sets C(ANSIBLE_CALLBACKS_ENABLED) replaces that list:
    name it there too.
version_added: 0.1.0
requirements:
  - A controller whose workers are forked (the default on Linux).
"""

import gc
import os
from typing import Any

from ansible.plugins.callback import CallbackBase

_registered = False


def _freeze_in_workers() -> None:
    """Once per process, however often the plugin is loaded."""
    global _registered
    if not _registered:
        os.register_at_fork(after_in_child=gc.freeze)
        _registered = True


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "mlstack.pve.worker_gc"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, display: Any = None) -> None:
        super().__init__(display)
        _freeze_in_workers()
