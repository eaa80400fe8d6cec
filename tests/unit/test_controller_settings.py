"""The controller settings that cut Ansible's CPU are the same wherever this checkout runs Ansible: its
ansible.cfg (make provision, make test) and molecule's config (molecule test), so a figure measured with
one holds for the other."""

from __future__ import annotations

import configparser

import yaml
from localplay import ROOT

# What each forked worker and the main process spend per task (plugins/callback/worker_gc.py,
# bench/poll_bench.py).
SETTINGS = ("callbacks_enabled", "internal_poll_interval")


def test_molecule_runs_ansible_with_the_checkouts_cpu_settings() -> None:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "ansible.cfg")
    molecule = yaml.safe_load((ROOT / "molecule" / "default" / "molecule.yml").read_text())
    defaults = molecule["ansible"]["cfg"]["defaults"]
    for key in SETTINGS:
        assert str(defaults.get(key)) == cfg.get("defaults", key), key
