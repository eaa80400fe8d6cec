"""mlstack.pve.ct_state's checks on real files, and the venv rule against the venv builder's own shell
functions (rendered from roles/ml_venv/templates/build-venv.sh.j2): the role's fast path and the
builder must agree on which venvs are intact, or a rerun would skip a venv the builder would rebuild."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import jinja2
import pytest
from ansible_collections.mlstack.pve.plugins.module_utils import ct_state
from localplay import run_module

ROOT = Path(__file__).resolve().parents[4]
BUILDER = ROOT / "roles" / "ml_venv" / "templates" / "build-venv.sh.j2"


def sha1(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


def builder_functions() -> str:
    """manifest() and complete() as the builder defines them."""
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters["quote"] = shlex.quote
    text = env.from_string(BUILDER.read_text()).render(
        ansible_managed="managed", _ml_venv_uv="/nonexistent/uv", ml_venv_uv_cache_dir="/nonexistent"
    )
    found = re.findall(r"^((?:manifest|complete)\(\) \{\n.*?\n\})$", text, re.M | re.S)
    assert len(found) == 2, "the builder no longer defines manifest() and complete()"
    return "\n".join(found)


def builder_says_complete(venv: Path) -> bool:
    script = f"{builder_functions()}\nvenv={shlex.quote(str(venv))}\ncomplete"
    return subprocess.run(["/bin/sh", "-c", script], check=False).returncode == 0


def make_venv(tmp_path: Path) -> Path:
    """A venv as the builder leaves it: packages, the lock it was built from, the completion marker and
    the manifest written by the builder's own manifest()."""
    lock = tmp_path / "profile" / "uv.lock"
    lock.parent.mkdir()
    lock.write_text("version = 1\n")
    venv = tmp_path / "venv"
    site = venv / "lib" / "python3.11" / "site-packages"
    for name in ("torch", "torch-2.11.0.dist-info", "triton", "triton-3.7.1.dist-info", "_virtualenv.pth"):
        (site / name).mkdir(parents=True) if "." not in name or name.endswith("dist-info") else (
            site / name
        ).write_text("")
    (venv / "uv.lock").write_text(lock.read_text())
    digest = hashlib.sha256(lock.read_bytes()).hexdigest()
    (venv / ".mlstack-complete").write_text(f"{digest}  {lock}\n")
    quoted = shlex.quote(str(venv))
    script = f"{builder_functions()}\nmanifest {quoted} > {quoted}/.mlstack-manifest"
    subprocess.run(["/bin/sh", "-c", script], check=True)
    return venv


def site_of(venv: Path) -> Path:
    return venv / "lib" / "python3.11" / "site-packages"


def pip_install_over(venv: Path) -> None:
    """What `pip install triton==3.6.0` over the venv leaves: another version's dist-info."""
    (site_of(venv) / "triton-3.7.1.dist-info").rename(site_of(venv) / "triton-3.6.0.dist-info")


def pip_install_extra(venv: Path) -> None:
    (site_of(venv) / "requests").mkdir()
    (site_of(venv) / "requests-2.32.0.dist-info").mkdir()


def remove_package(venv: Path) -> None:
    for name in ("triton", "triton-3.7.1.dist-info"):
        (site_of(venv) / name).rename(venv / name)


def change_lock(venv: Path) -> None:
    (venv.parent / "profile" / "uv.lock").write_text("version = 2\n")


def drop_manifest(venv: Path) -> None:
    (venv / ".mlstack-manifest").unlink()


TAMPERED: dict[str, tuple[Callable[[Path], None], str]] = {
    "pip install of another version": (
        pip_install_over,
        "added triton-3.6.0.dist-info gone triton-3.7.1.dist-info",
    ),
    "pip install of an extra package": (pip_install_extra, "added requests requests-2.32.0.dist-info"),
    "a package removed": (remove_package, "gone triton triton-3.7.1.dist-info"),
    "the lock changed": (change_lock, "incomplete"),
    "built without a manifest": (drop_manifest, "without a manifest"),
}


def test_an_untouched_venv_is_intact(tmp_path: Path) -> None:
    venv = make_venv(tmp_path)
    found, why = ct_state.check_venv({"path": str(venv)})
    assert why is None and found == str(venv)
    assert builder_says_complete(venv)


@pytest.mark.parametrize("tamper", TAMPERED, ids=list(TAMPERED))
def test_a_tampered_venv_differs_for_the_role_and_the_builder(tmp_path: Path, tamper: str) -> None:
    venv = make_venv(tmp_path)
    change, said = TAMPERED[tamper]
    change(venv)
    _, why = ct_state.check_venv({"path": str(venv)})
    assert why is not None and said in why
    # The builder, run by the role for an item that differs, must then build it again.
    assert not builder_says_complete(venv)


@pytest.mark.parametrize("added", ["__pycache__", "mlstack_doctor", "mlstack_doctor-0.1.0.dist-info"])
def test_what_python_and_the_doctor_role_add_later_is_not_a_tamper(tmp_path: Path, added: str) -> None:
    venv = make_venv(tmp_path)
    (site_of(venv) / added).mkdir()
    assert ct_state.check_venv({"path": str(venv)})[1] is None
    assert builder_says_complete(venv)


def test_a_missing_venv_differs(tmp_path: Path) -> None:
    assert ct_state.check_venv({"path": str(tmp_path / "nope")}) == (None, "missing")


@pytest.mark.parametrize(
    ("item", "why"),
    [
        ({}, None),
        ({"sha1": sha1(b"other\n")}, "content differs"),
        ({"mode": "0600"}, "mode 0644, not 0600"),
        ({"path": "/nonexistent/file"}, "missing"),
        ({"path": "/"}, "not a regular file"),
    ],
)
def test_file(tmp_path: Path, item: dict[str, str], why: str | None) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"content\n")
    path.chmod(0o644)
    wanted = {"path": str(path), "sha1": sha1(b"content\n"), "mode": "0644"} | item
    assert ct_state.check_file(wanted)[1] == why


@pytest.mark.parametrize(("src", "why"), [("/opt/a", None), ("/opt/b", "points at /opt/a"), (None, None)])
def test_link(tmp_path: Path, src: str | None, why: str | None) -> None:
    (tmp_path / "venv").symlink_to("/opt/a")
    assert ct_state.check_link({"path": str(tmp_path / "venv"), "src": src}) == ("/opt/a", why)


def test_link_missing_or_not_a_link(tmp_path: Path) -> None:
    assert ct_state.check_link({"path": str(tmp_path / "no"), "src": "/opt/a"}) == (None, "missing")
    assert ct_state.check_link({"path": str(tmp_path), "src": "/opt/a"}) == (None, "not a symlink")
    # Only read (venv.previous before a first switch): nothing to fix.
    assert ct_state.check_link({"path": str(tmp_path / "no")}) == (None, None)


def test_directory(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir(mode=0o700)
    os.chmod(tmp_path / "d", 0o700)
    assert ct_state.check_directory({"path": str(tmp_path / "d"), "mode": "0700"})[1] is None
    assert ct_state.check_directory({"path": str(tmp_path / "d"), "mode": "0755"})[1] == "mode 0700, not 0755"
    assert ct_state.check_directory({"path": str(tmp_path / "x")})[1] == "missing"


DPKG = "gcc\tii \npython3-dev\tii \nbuild-essential\trc \n"


@pytest.mark.parametrize(
    ("names", "found", "why"),
    [
        (["gcc", "python3-dev"], [], None),
        (["gcc", "build-essential"], ["build-essential"], "not installed: build-essential"),
        (["gcc", "g++"], ["g++"], "not installed: g++"),
        (["gcc=4:12.2.0-3"], ["gcc=4:12.2.0-3"], "not checked (apt resolves them): gcc=4:12.2.0-3"),
    ],
)
def test_packages(names: list[str], found: list[str], why: str | None) -> None:
    def dpkg(argv: list[str]) -> tuple[int, str, str]:
        assert argv[:2] == ["dpkg-query", "-W"]
        listed = [line for line in DPKG.splitlines() if line.split("\t")[0] in argv]
        return (0 if len(listed) == len(argv) - 4 else 1), "\n".join(listed), ""

    assert ct_state.check_packages({"names": names}, dpkg) == (found, why)


@pytest.mark.parametrize(
    ("rc", "out", "why"),
    [
        (0, "uv 0.13.9 (abc 2026-11-01)\n", None),
        (0, "uv 0.13.9\n", None),
        (0, "uv 0.13.10\n", "is uv 0.13.10"),
        (127, "", "missing"),
    ],
)
def test_version(rc: int, out: str, why: str | None) -> None:
    item = {"argv": ["/opt/mlstack/tools/bin/uv", "--version"], "expect": "uv 0.13.9"}
    assert ct_state.check_version(item, lambda argv: (rc, out, ""))[1] == why


def test_dist(tmp_path: Path) -> None:
    venv = make_venv(tmp_path)
    (site_of(venv) / "mlstack_doctor-0.1.0.dist-info").mkdir()
    assert ct_state.check_dist({"venv": str(venv), "name": "mlstack_doctor", "version": "0.1.0"}) == (
        ["0.1.0"],
        None,
    )
    assert ct_state.check_dist({"venv": str(venv), "name": "mlstack_doctor", "version": "0.2.0"})[1] == (
        "installed 0.1.0, not 0.2.0"
    )
    assert ct_state.check_dist({"venv": str(venv), "name": "fla", "version": "1"}) == (None, "not installed")


def test_read_state_keys_every_item_and_fails_closed(tmp_path: Path) -> None:
    (tmp_path / "venvs" / "a").mkdir(parents=True)
    (tmp_path / "venvs" / "a.lock").write_text("")
    state = ct_state.read_state(
        {
            "venvs": {"type": "subdirs", "path": str(tmp_path / "venvs")},
            "odd": {"type": "socket", "path": "/"},
            "gone": {"type": "file", "path": str(tmp_path / "gone")},
        }
    )
    assert state["found"]["venvs"] == [str(tmp_path / "venvs" / "a")]
    assert state["differs"] == {"odd": "unknown check type 'socket'", "gone": "missing"}


def test_the_module_through_ansible(tmp_path: Path) -> None:
    """The module as a play runs it (argument spec, module_utils packed with it, JSON out)."""
    venv = make_venv(tmp_path)
    pip_install_over(venv)
    items = {
        "venv": {"type": "venv", "path": str(venv)},
        "gone": {"type": "directory", "path": "/nonexistent"},
        # This machine's own linker cache (no NVIDIA driver here): read, no libcuda, no difference.
        "libcuda": {"type": "libcuda"},
    }
    result = run_module("mlstack.pve.ct_state", {"items": items})
    assert result.get("failed") is not True, result
    assert result["changed"] is False
    assert result["differs"]["gone"] == "missing"
    assert "added triton-3.6.0.dist-info" in result["differs"]["venv"]
    assert result["found"]["libcuda"] is None and "libcuda" not in result["differs"]


@pytest.fixture
def linker_cache(tmp_path: Path) -> Callable[[str | None], Callable[[list[str]], tuple[int, str, str]]]:
    """A real linker cache (ldconfig -C) holding a libcuda.so.1 of a given version, or none, as the
    driver's installer leaves it (libcuda.so.<version>, its soname link made by ldconfig); the runner
    answers `ldconfig -p` from that cache."""
    if shutil.which("gcc") is None or not os.path.exists("/sbin/ldconfig"):
        pytest.skip("needs gcc and /sbin/ldconfig")

    def make(version: str | None) -> Callable[[list[str]], tuple[int, str, str]]:
        lib = tmp_path / f"lib-{version}"
        lib.mkdir()
        cache = tmp_path / f"cache-{version}"
        if version:
            (tmp_path / "c.c").write_text("int cuInit(int f) { return 100; }\n")
            out = lib / f"libcuda.so.{version}"
            cc = ["gcc", "-shared", "-fPIC", "-nostdlib", "-Wl,-soname,libcuda.so.1", "-o", str(out)]
            subprocess.run([*cc, str(tmp_path / "c.c")], check=True)
        subprocess.run(["/sbin/ldconfig", "-C", str(cache), "-f", "/dev/null", str(lib)], check=True)

        def run(argv: list[str]) -> tuple[int, str, str]:
            assert argv[-1] == "-p"
            p = subprocess.run([*argv, "-C", str(cache)], capture_output=True, text=True, check=False)
            return p.returncode, p.stdout, p.stderr

        return run

    return make


@pytest.mark.parametrize(
    ("installed", "item", "found", "why"),
    [
        ("580.95.05", {}, "580.95.05", None),
        ("580.95.05", {"version": "580.95.05"}, "580.95.05", None),
        ("550.54.14", {"version": "580.95.05"}, "550.54.14", "is 550.54.14"),
        (None, {}, None, None),
        (None, {"version": "580.95.05"}, None, "missing"),
    ],
    ids=["read", "wanted", "other-version", "none-read", "none-wanted"],
)
def test_libcuda_as_the_linker_cache_resolves_it(
    linker_cache: Callable[[str | None], Callable[[list[str]], tuple[int, str, str]]],
    installed: str | None,
    item: dict[str, str],
    found: str | None,
    why: str | None,
) -> None:
    assert ct_state.check_libcuda(item, linker_cache(installed)) == (found, why)


def test_libcuda_unreadable_cache_differs() -> None:
    found, why = ct_state.check_libcuda({}, lambda argv: (1, "", "ldconfig: Can't open cache file\n"))
    assert found is None and why is not None and why.endswith("exited 1: ldconfig: Can't open cache file")


def test_free_adds_up_the_needs_of_one_filesystem(tmp_path: Path) -> None:
    st = os.statvfs(tmp_path)
    free = st.f_bavail * st.f_frsize
    (tmp_path / "a").mkdir()
    # Two folders of one filesystem, and one not made yet (measured at its nearest existing folder).
    fits = {"paths": {str(tmp_path / "a"): 1, str(tmp_path / "not" / "yet"): 1}}
    found, why = ct_state.check_free(fits)
    assert why is None and found["short"] == []
    assert set(found["free"]) == set(fits["paths"])
    lacks = {"paths": {str(tmp_path / "a"): free, str(tmp_path / "not" / "yet"): free}}
    found, why = ct_state.check_free(lacks)
    assert why is None, "never a difference: the role decides"
    [short] = found["short"]
    assert short["path"] == f"{tmp_path / 'a'} and {tmp_path / 'not' / 'yet'}"
    assert short["need"] == 2 * free and 0 < short["free"] <= free * 1.01 + 1048576


AUDIT = """\
The following packages have been unpacked but not yet configured.
They must be configured using dpkg --configure or the configure
menu option in dselect for them to work:
 g++                  GNU C++ compiler
The following packages are only half installed, due to problems during
installation.  The installation can probably be completed by retrying it;
the packages can be removed using dselect or dpkg --remove:
 g++-12               GNU C++ compiler
"""


@pytest.mark.parametrize(
    ("out", "found", "why"),
    [
        ("", [], None),
        (AUDIT, ["g++", "g++-12"], "left half-done by an interrupted dpkg: g++ g++-12"),
    ],
)
def test_dpkg_audit(out: str, found: list[str], why: str | None) -> None:
    def dpkg(argv: list[str]) -> tuple[int, str, str]:
        assert argv == ["dpkg", "--audit"]
        return (1 if out else 0), out, ""

    assert ct_state.check_dpkg_audit({}, dpkg) == (found, why)
