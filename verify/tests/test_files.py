"""Reports and warm stamps are written whole: a reader (provisioning's slurp of the report) never sees
half a file while another doctor run writes the same path, and writers never interleave."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

from doctor_testlib import SRC  # noqa: F401  (puts the doctor's source on sys.path)
from mlstack_doctor.files import write_atomic


def _write_often(path: Path, text: str) -> None:
    for _ in range(300):
        write_atomic(path, text)


def test_readers_see_only_whole_documents_while_others_write(tmp_path: Path) -> None:
    # Reports of different lengths, as two provision runs' doctors write them to the same path.
    path = tmp_path / "reports" / "doctor.json"
    docs = [json.dumps({"writer": i, "probes": ["x" * 4096] * (i + 1)}) for i in range(4)]
    write_atomic(path, docs[0])
    # Separate processes, as separate doctor runs are.
    procs = [multiprocessing.get_context("fork").Process(target=_write_often, args=(path, d)) for d in docs]
    for p in procs:
        p.start()
    while any(p.is_alive() for p in procs):
        text = path.read_text()
        assert text in docs, f"a reader saw {len(text)} characters that are no whole report"
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * len(procs)
    assert path.read_text() in docs
    assert [p.name for p in path.parent.iterdir()] == ["doctor.json"]  # no temporary file left
    assert path.stat().st_mode & 0o777 == 0o644
