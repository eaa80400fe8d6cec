# Entry points; README.md and docs/ document them. Everything runs from the controller venv in .venv.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg

.PHONY: venv host-packages testbed provision verify test test-core221 lint unit down purge

$(VENV)/.done: requirements-controller.txt requirements-controller.lock verify/pyproject.toml tools/venv-install
	python3 -m venv $(VENV) || { apt-get update -qq && apt-get install -y -qq python3-venv && python3 -m venv $(VENV); }
	tools/venv-install $(VENV) requirements-controller.txt requirements-controller.lock -e ./verify
	# Make this checkout resolvable as the collection mlstack.pve (ansible.cfg collections_path).
	mkdir -p $(VENV)/collections/ansible_collections/mlstack
	ln -sfn $(CURDIR) $(VENV)/collections/ansible_collections/mlstack/pve
	touch $@

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

# Command 2: lint and every suite (unit, the testbed's, molecule, ansible-core 2.21's provisioning) as
# steps of tests/lanes.py: side by side where they only wait on I/O, each on its own vmids and reports/;
# progress on the console, each step's log and --durations in build/test-lanes/. MLSTACK_TEST_LANES=1
# runs them one after the other. Its first step is `make testbed`, with the unit tests and lint beside it.
test: venv host-packages
	CORE221_TESTS="$(CORE221_TESTS)" $(PY) tests/lanes.py

# Provisioning again with ansible-core 2.21 (ansible 14.x, community.proxmox 2.x), which needs Python >= 3.12:
# the machine's python3 on Debian 13, a Debian trixie controller container on Debian 12 (testbed/README.md).
# `make test` runs the lifecycle (create, rerun with changed=0, verify, destroy), API tokens and bad input
# there, within CI's time; the whole provisioning suite: make test-core221 CORE221_TESTS="tests/provision
# --deselect tests/provision/test_readme_commands.py" (README's own commands run .venv's Ansible, 2.19, only).
# `make test` runs the same as its steps core221-controller and core221-<file> (tests/lanes.py).
CORE221_TESTS ?= tests/provision/test_lifecycle.py tests/provision/test_api_token.py tests/provision/test_bad_input.py
test-core221: testbed
	testbed/testbed controller up
	testbed/testbed controller run -- ansible --version
	testbed/testbed controller run -- pytest -q --durations=10 $(CORE221_TESTS)

down:
	testbed/testbed down

# Also destroy the testbed's containers (with their venvs in the nodes' uv store) and its cached template.
purge:
	testbed/testbed down --purge
