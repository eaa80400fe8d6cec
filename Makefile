# Entry points; README.md and docs/ document them. Everything runs from the controller venv in .venv.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
# The machine's python3 (the venv's bin comes first on PATH below): it builds the venv and decides its stack.
PYTHON3 := $(or $(shell command -v python3),python3)
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg

.PHONY: venv host-packages testbed provision verify test test-other-stack lint unit down purge FORCE

# The controller's Ansible (tools/controller_stack.py decides, from python3's version): ansible-core 2.21
# (ansible 14) where python3 is 3.12 or newer, ansible-core 2.19 (ansible 12) on 3.11. CONTROLLER_STACK=core219
# or core221 asks for one; core221 on Python 3.11 is refused, with the reason, when the venv is built.
CONTROLLER_STACK ?=
# `NAME REQUIREMENTS LOCK`; empty where python3 cannot run the stack asked for.
STACK := $(shell $(PYTHON3) tools/controller_stack.py $(CONTROLLER_STACK) 2>/dev/null)
STACK_NAME := $(word 1,$(STACK))
# The stack the venv holds: its stamp's text (empty in venvs made before it named one: core219's).
VENV_STACK := $(if $(wildcard $(VENV)/.done),$(or $(shell cat $(VENV)/.done),core219))

# Another stack than the venv holds remakes it from nothing, not over the other's packages.
$(VENV)/.done: $(wordlist 2,3,$(STACK)) verify/pyproject.toml tools/venv-install tools/controller_stack.py $(if $(filter-out $(STACK_NAME),$(VENV_STACK)),FORCE)
	@$(PYTHON3) tools/controller_stack.py $(CONTROLLER_STACK) >/dev/null
	$(if $(filter-out $(STACK_NAME),$(VENV_STACK)),rm -rf $(VENV))
	$(PYTHON3) -m venv $(VENV) || { apt-get update -qq && apt-get install -y -qq python3-venv && $(PYTHON3) -m venv $(VENV); }
	tools/venv-install $(VENV) $(wordlist 2,3,$(STACK)) -e ./verify
	# Make this checkout resolvable as the collection mlstack.pve (ansible.cfg collections_path).
	mkdir -p $(VENV)/collections/ansible_collections/mlstack
	ln -sfn $(CURDIR) $(VENV)/collections/ansible_collections/mlstack/pve
	echo $(STACK_NAME) >$@

FORCE:

venv: $(VENV)/.done

# The machine's Debian packages the testbed and the test suites need, from one list
# (testbed/mlstack_testbed/node/host_setup.py); `testbed up` installs the testbed's part itself.
host-packages: venv
	testbed/testbed packages --tests

# The testbed: 3 PVE nodes (testbed, testbed2, testbed3) and 2 dummy GPUs (/dev/nvidia0, /dev/nvidia1, ctl, uvm,
# caps: no driver); docs/testbed.md.
testbed: venv
	testbed/testbed up --gpu-nodes 2 --nodes 3

# Command 1: a real container on the testbed, provisioned and verified.
provision: testbed
	ansible-playbook playbooks/provision.yml

verify: venv
	ansible-playbook playbooks/verify.yml

lint: venv
	ruff check .
	ruff format --check .
	ansible-lint --profile production

unit: venv
	pytest -q verify/tests tests/unit

# Command 2: lint and every suite (unit, the testbed's, molecule, the other stack's provisioning) as
# steps of tests/lanes.py: side by side where they only wait on I/O, each on its own vmids and reports/;
# progress on the console, each step's log and --durations in build/test-lanes/. MLSTACK_TEST_LANES=1
# runs them one after the other. Its first step is `make testbed`, with the unit tests and lint beside it.
test: venv host-packages
	OTHER_STACK_TESTS="$(OTHER_STACK_TESTS)" $(PY) tests/lanes.py

# Provisioning again on the controller stack beside .venv's (`tools/controller_stack.py --beside .venv`):
# ansible-core 2.21 where .venv holds 2.19 (Debian 12: in a Debian trixie controller container, since 2.21
# needs Python >= 3.12), ansible-core 2.19 where .venv holds 2.21 (a venv .venv-core219); testbed/README.md.
# `make test` runs the lifecycle (create, rerun with changed=0, verify, destroy), API tokens and bad input
# there, within CI's time, as its steps <stack>-controller and <stack>-<file> (tests/lanes.py); the rest of
# the provisioning suite: the command in docs/tests.md (README's own commands run .venv's Ansible only, and
# four files change the node from where pytest runs, which the controller container cannot).
OTHER_STACK_TESTS ?= tests/provision/test_lifecycle.py tests/provision/test_api_token.py tests/provision/test_bad_input.py
test-other-stack: testbed
	testbed/testbed controller up
	testbed/testbed controller run -- ansible --version
	testbed/testbed controller run -- pytest -q --durations=10 $(OTHER_STACK_TESTS)

down:
	testbed/testbed down

# Also destroy the testbed's containers (with their venvs in the nodes' uv store) and its cached template.
purge:
	testbed/testbed down --purge
