"""The controller's Ansible stack, chosen from the Python that runs it: the one place that names the
stacks, their requirements files and the Python each needs. `make venv` installs what it prints;
`testbed/testbed controller` and tests/lanes.py build and run the stack beside it.

    python3 tools/controller_stack.py [STACK]
        `NAME REQUIREMENTS LOCK` of STACK (core219 or core221), or where none is named, of the newest
        stack this Python runs
    python3 tools/controller_stack.py --beside VENV
        the same of the other stack than the one VENV holds

Exit status 2, with the reason and the way out on stderr, where this Python cannot run the stack named.
Stdlib only: it runs before any venv exists.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Stack:
    name: str
    ansible: str
    requirements: str
    lock: str
    # The oldest controller Python its ansible-core supports.
    min_python: tuple[int, int]
    support: str

    @property
    def python(self) -> str:
        return ".".join(map(str, self.min_python))


# Oldest first; the default is the newest one the Python runs.
STACKS = (
    Stack(
        "core219",
        "ansible-core 2.19 (ansible 12.3, community.proxmox 1.4.0)",
        "requirements-controller.txt",
        "requirements-controller.lock",
        (3, 11),
        "the ansible 12 package reached its end of life in December 2025, ansible-core 2.19 gets security "
        "fixes only until its end of life in May 2027",
    ),
    Stack(
        "core221",
        "ansible-core 2.21 (ansible 14.5, community.proxmox 2.0.0)",
        "requirements-controller-core221.txt",
        "requirements-controller-core221.lock",
        (3, 12),
        "current",
    ),
)
NAMES = tuple(s.name for s in STACKS)
# The stack execution-environment.yml builds on (tests/unit/test_execution_environment.py holds them equal).
EXECUTION_ENVIRONMENT = "core221"
# What `make venv` writes in the venv once it is built: the stack's name. Empty in venvs made before the
# stamp named it, which all held core219.
STAMP = ".done"


class StackError(Exception):
    """A stack this Python cannot run, or no such stack; the text says what to do instead."""


def by_name(name: str) -> Stack:
    for stack in STACKS:
        if stack.name == name:
            return stack
    raise StackError(f"CONTROLLER_STACK={name} is no controller stack: one of {', '.join(NAMES)}")


def runs_on(stack: Stack, version: tuple[int, int]) -> bool:
    return tuple(version[:2]) >= stack.min_python


def default(version: tuple[int, int]) -> Stack:
    """The newest stack whose ansible-core supports this controller Python."""
    fits = [s for s in STACKS if runs_on(s, version)]
    if not fits:
        oldest = STACKS[0]
        raise StackError(
            f"Python {version[0]}.{version[1]} is older than any controller stack supports "
            f"({oldest.ansible} needs Python >= {oldest.python})"
        )
    return fits[-1]


def choose(version: tuple[int, int], requested: str | None = None) -> Stack:
    """The stack `make venv` installs: the one asked for (CONTROLLER_STACK), else the default."""
    if not requested:
        return default(version)
    stack = by_name(requested)
    if not runs_on(stack, version):
        fallback = default(version)
        raise StackError(
            f"CONTROLLER_STACK={stack.name}: {stack.ansible} needs Python >= {stack.python} on the "
            f"controller; this python3 is {version[0]}.{version[1]}. Use a python3 >= {stack.python} "
            f"(Debian 13's), or CONTROLLER_STACK={fallback.name}, this Python's: {fallback.ansible}; "
            f"{fallback.support}."
        )
    return stack


def other(stack: Stack) -> Stack:
    """The stack beside this one (the provisioning suite runs on both)."""
    (found,) = [s for s in STACKS if s != stack]
    return found


def installed(venv: Path, version: tuple[int, int]) -> Stack:
    """The stack a venv `make venv` built holds (its stamp names it); without a venv, the default."""
    try:
        name = (venv / STAMP).read_text().strip()
    except OSError:
        return default(version)
    return by_name(name or STACKS[0].name)


def main(argv: list[str]) -> int:
    version = sys.version_info[:2]
    try:
        if len(argv) == 2 and argv[0] == "--beside":
            stack = other(installed(Path(argv[1]), version))
        elif len(argv) <= 1 and not any(a.startswith("-") for a in argv):
            stack = choose(version, argv[0] if argv else None)
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except StackError as e:
        print(f"controller stack: {e}", file=sys.stderr)
        return 2
    print(stack.name, stack.requirements, stack.lock)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
