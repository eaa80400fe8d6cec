"""Test-only callback: inject a fault at an exact point of a playbook run.

Enabled by the fault suite only (ANSIBLE_CALLBACK_PLUGINS + ANSIBLE_CALLBACKS_ENABLED). Environment:
  MLSTACK_FAULT_TASK  substring of the task name that triggers it
  MLSTACK_FAULT_WHEN  `start` (the task is about to run) or `ok` (it has just succeeded; the default)
  MLSTACK_FAULT_CMD   shell command run on the controller, synchronously, before the play goes on
  MLSTACK_FAULT_MARK  file that records when the fault fired (and the command's exit code)
  MLSTACK_FAULT_RETRY_CMD  optional: run once when that task is retried (the fault healed after the
                      first failed attempt, whatever the machine's load)
Callbacks run in the controller's main process, between tasks of the linear strategy, so the fault
lands after the trigger task and before the next task starts: no timing guesswork.
"""

from __future__ import annotations

import os
import subprocess
import time

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = r"""
name: mlstack_fault
type: aggregate
short_description: Inject a fault after (or before) a named task (tests only)
description:
  - Runs MLSTACK_FAULT_CMD once when a task whose name contains MLSTACK_FAULT_TASK starts or succeeds.
requirements:
  - enabled in the fault suite's environment only
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "mlstack_fault"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self._task = os.environ.get("MLSTACK_FAULT_TASK", "")
        self._when = os.environ.get("MLSTACK_FAULT_WHEN", "ok")
        self._cmd = os.environ.get("MLSTACK_FAULT_CMD", "")
        self._mark = os.environ.get("MLSTACK_FAULT_MARK", "")
        self._retry_cmd = os.environ.get("MLSTACK_FAULT_RETRY_CMD", "")
        self._fired = False
        self._retried = False

    def _fire(self, name: str) -> None:
        if self._fired or not self._task or not self._cmd or self._task not in name:
            return
        self._fired = True
        self._run(self._cmd, name)

    def _run(self, cmd: str, name: str) -> None:
        rc = subprocess.run(cmd, shell=True, check=False, timeout=120).returncode
        if self._mark:
            with open(self._mark, "a", encoding="utf-8") as f:
                f.write(f"{time.time():.3f} {rc} {name}\n")

    def v2_runner_retry(self, result):  # type: ignore[no-untyped-def]
        name = result._task.get_name()
        if self._fired and not self._retried and self._retry_cmd and self._task in name:
            self._retried = True
            self._run(self._retry_cmd, f"retry: {name}")

    def v2_playbook_on_task_start(self, task, is_conditional):  # type: ignore[no-untyped-def]
        if self._when == "start":
            self._fire(task.get_name())

    def v2_runner_on_ok(self, result):  # type: ignore[no-untyped-def]
        if self._when == "ok":
            self._fire(result._task.get_name())
