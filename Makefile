# Entry points; README.md documents them. Everything runs from the controller venv in .venv.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg

.PHONY: venv testbed provision verify test lint unit down purge

$(VENV)/.done: requirements-controller.txt requirements-controller.lock verify/pyproject.toml
	python3 -m venv $(VENV) || { apt-get update -qq && apt-get install -y -qq python3-venv && python3 -m venv $(VENV); }
	$(VENV)/bin/pip install -q -r requirements-controller.txt -c requirements-controller.lock
	$(VENV)/bin/pip install -q -e ./verify
	# Make this checkout resolvable as the collection mlstack.pve (ansible.cfg collections_path).
	mkdir -p $(VENV)/collections/ansible_collections/mlstack
	ln -sfn $(CURDIR) $(VENV)/collections/ansible_collections/mlstack/pve
	touch $@

venv: $(VENV)/.done

testbed: venv
	testbed/testbed up --gpu-nodes 2

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

# Command 2: lint, unit tests, then the suites that run on the real testbed.
test: lint testbed
	pytest -q verify/tests tests
	molecule test -s default

down:
	testbed/testbed down

# Also destroy the testbed's containers and its cached template.
purge:
	testbed/testbed down --purge
