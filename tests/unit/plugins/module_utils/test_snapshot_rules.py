from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from ansible_collections.mlstack.pve.plugins.module_utils import snapshots

NOW = datetime(2026, 12, 2, 7, 30, 59, tzinfo=UTC)


def ours(venv: str, minutes_ago: int, name: str = "") -> dict[str, object]:
    when = NOW - timedelta(minutes=minutes_ago)
    return {
        "name": name or snapshots.snapshot_name(venv, when),
        "snaptime": int(when.timestamp()),
        "description": snapshots.description(venv, when),
    }


@pytest.mark.parametrize(
    ("venv", "name"),
    [
        ("torch211-triton36-0123456789ab", "mlstack-torch211-triton36-202612020730"),
        # Trimmed to PVE's 40 characters, never ending in a separator.
        ("torch211-triton37-fla06-0123456789ab", "mlstack-torch211-triton37-f-202612020730"),
        ("cu12.8/torch+x-0123456789ab", "mlstack-cu12-8-torch-x-202612020730"),
        ("", "mlstack-none-202612020730"),
    ],
)
def test_the_name_is_the_profile_it_leaves_and_the_utc_minute(venv: str, name: str) -> None:
    assert snapshots.snapshot_name(venv, NOW) == name
    assert snapshots.VALID_NAME.match(name) and len(name) <= snapshots.MAX_NAME


def test_the_name_is_in_utc_whatever_the_clock_zone() -> None:
    local = NOW.astimezone(timezone(timedelta(hours=2)))
    assert snapshots.snapshot_name("p-0123456789ab", local) == "mlstack-p-202612020730"


def test_the_description_holds_the_full_venv_and_time() -> None:
    listed = snapshots.ours([ours("torch211-triton36-0123456789ab", 0)])
    assert listed[0]["venv"] == "torch211-triton36-0123456789ab"
    assert listed[0]["taken"] == "2026-12-02T07:30:59Z"


@pytest.mark.parametrize(
    "snap",
    [
        {"name": "mlstack-by-hand", "snaptime": 1, "description": "before my change"},
        {
            "name": "before-upgrade",
            "snaptime": 1,
            "description": snapshots.description("p-0123456789ab", NOW),
        },
        {"name": "current", "description": "You are here!"},
    ],
)
def test_a_snapshot_is_ours_by_name_and_description_together(snap: dict[str, object]) -> None:
    assert not snapshots.is_ours(snap)
    assert snapshots.to_prune([snap, ours("a-0123456789ab", 1)], 1) == []


def test_prune_keeps_the_newest_and_never_touches_others() -> None:
    mine = [ours("a-0123456789ab", m) for m in (5, 1, 9, 3)]
    foreign = {"name": "mlstack-mine", "snaptime": 0, "description": "hand made"}
    assert snapshots.to_prune([*mine, foreign], 2) == [mine[2]["name"], mine[0]["name"]]
    assert snapshots.to_prune(mine, 4) == []
    with pytest.raises(ValueError):
        snapshots.to_prune(mine, 0)


def test_a_rollback_chooses_our_newest_or_the_named_one() -> None:
    old, new = ours("a-0123456789ab", 9), ours("b-0123456789ab", 1)
    foreign = {"name": "mlstack-x", "snaptime": 99999999999, "description": "not ours"}
    pick = snapshots.chosen([old, new, foreign], "")
    assert isinstance(pick, dict) and pick["name"] == new["name"] and pick["venv"] == "b-0123456789ab"
    pick = snapshots.chosen([old, new], str(old["name"]))
    assert isinstance(pick, dict) and pick["name"] == old["name"]
    assert "not made by this project" in str(snapshots.chosen([foreign], "mlstack-x"))
    assert str(snapshots.chosen([old], "gone")) == "it has no snapshot gone"
    assert "no snapshot made by this project" in str(snapshots.chosen([foreign], ""))


def test_a_storage_that_cannot_snapshot_is_explained_with_pves_words() -> None:
    msg = snapshots.explain("snapshot CT 261 as mlstack-a-202612020730", "snapshot feature is not available")
    assert msg.startswith(
        "PVE refused to snapshot CT 261 as mlstack-a-202612020730: snapshot feature is not available."
    )
    assert "zfspool, lvmthin, btrfs or rbd" in msg and "mlstack_upgrade_snapshot" in msg
    assert (
        snapshots.explain("snapshot CT 1", "CT is locked (backup)")
        == "PVE refused to snapshot CT 1: CT is locked (backup)."
    )
