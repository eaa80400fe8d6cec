"""The collection's copies of the doctor's facts (plugins/module_utils/*_facts.py, stack_packages.py) are
the doctor's files (verify/src/mlstack_doctor/facts/) byte for byte after their one header line, so the
node, the container and the doctor read a fact with one parser that cannot drift. And the doctor's facts
stay copyable: standard library only, no import of the rest of the doctor."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[4]
FACTS = ROOT / "verify" / "src" / "mlstack_doctor" / "facts"
MODULE_UTILS = ROOT / "plugins" / "module_utils"
# Each of the doctor's facts and its copy in the collection.
COPIES = {
    "nvidia.py": "nvidia_facts.py",
    "libcuda.py": "libcuda_facts.py",
    "packages.py": "stack_packages.py",
    "stack.py": "stack_facts.py",
}


def header(source: str) -> str:
    """The copy's first line, naming its source."""
    where = f"verify/src/mlstack_doctor/facts/{source}"
    return f"# Copied from {where} (the source; a unit test keeps both equal).\n"


@pytest.mark.parametrize(("source", "copy"), COPIES.items())
def test_the_copy_is_the_doctors_file(source: str, copy: str) -> None:
    expected = header(source) + (FACTS / source).read_text()
    copy_it = (
        'python3 -c "import pathlib as p;'
        f" s = p.Path('verify/src/mlstack_doctor/facts/{source}').read_text();"
        f" p.Path('plugins/module_utils/{copy}').write_text({header(source)!r} + s)\""
    )
    assert (MODULE_UTILS / copy).read_text() == expected, (
        f"plugins/module_utils/{copy} differs from the doctor's verify/src/mlstack_doctor/facts/{source}, its"
        f" source: make the change there, then copy it with {copy_it}"
    )


def test_every_fact_of_the_doctor_has_its_copy() -> None:
    facts = {p.name for p in FACTS.glob("*.py") if p.name != "__init__.py"}
    assert facts == set(COPIES)


@pytest.mark.parametrize("source", sorted(COPIES))
def test_a_fact_imports_the_standard_library_only(source: str) -> None:
    tree = ast.parse((FACTS / source).read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {
        n.module.split(".")[0]
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.module and not n.level
    }
    relative = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level]
    assert relative == [] and imported <= set(sys.stdlib_module_names), sorted(imported)
