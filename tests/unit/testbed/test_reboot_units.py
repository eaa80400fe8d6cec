"""`testbed reboot NODE`'s boot: which of /etc/systemd/system's units run before the onboot containers (the
enabled ones ordered Before=pve-guests.service, their After= among them first), and in which order PVE's
pve-guests starts the onboot containers (startup order=, then vmid)."""

from __future__ import annotations

from pathlib import Path

from mlstack_testbed.node import reboot


def unit(folder: Path, name: str, before: str, after: str = "", enabled: bool = True) -> None:
    (folder / name).write_text(
        f"[Unit]\nDescription=x\nAfter={after}\nBefore={before}\n\n[Service]\nType=oneshot\n"
        f"ExecStart=-/bin/echo {name}\nExecStart=/bin/true\n\n[Install]\nWantedBy=multi-user.target\n"
    )
    if enabled:
        wants = folder / "multi-user.target.wants"
        wants.mkdir(exist_ok=True)
        (wants / name).symlink_to(folder / name)


def test_only_enabled_units_before_pve_guests_run_dependencies_first(tmp_path: Path) -> None:
    unit(tmp_path, "a-late.service", "pve-guests.service", after="z-early.service")
    unit(tmp_path, "z-early.service", "pve-guests.service network.target")
    unit(tmp_path, "other.service", "network.target")
    unit(tmp_path, "disabled.service", "pve-guests.service", enabled=False)
    units = reboot.boot_units(tmp_path)
    assert [u.name for u in units] == ["z-early.service", "a-late.service"]
    assert units[0].exec_start == ["-/bin/echo z-early.service", "/bin/true"]


def test_onboot_containers_start_in_pve_guests_order() -> None:
    cts = [{"vmid": v} for v in (304, 303, 302, 301, 300)]
    configs = {
        300: {"onboot": 1},
        301: {"onboot": 1, "startup": "order=2,up=30"},
        302: {"onboot": 0, "startup": "order=1"},
        303: {"onboot": 1, "startup": "order=1"},
        304: {},
    }
    assert reboot.start_order(cts, configs) == [303, 301, 300]
