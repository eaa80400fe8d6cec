"""Each role's meta/argument_specs.yml and defaults/main.yml describe the same variables."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROLES = sorted(p for p in (Path(__file__).resolve().parents[3] / "roles").iterdir() if p.is_dir())


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_every_default_is_in_the_spec(role: Path) -> None:
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text()) or {}
    spec = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]
    options = spec.get("options", {})
    assert sorted(set(defaults) - set(options)) == []
    for name, value in defaults.items():
        documented = options[name].get("default")
        # Templated defaults depend on the play; literal ones must match the spec.
        if documented is not None and not (isinstance(value, str) and "{{" in value):
            assert documented == value, name


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_every_option_is_prefixed_with_the_role(role: Path) -> None:
    spec = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    for entry in spec.values():
        for name in entry.get("options", {}):
            assert name.startswith(role.name + "_"), name
