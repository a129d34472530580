"""JobStore.save from the event loop and from a thread at once (the submitter's on_attempt saves in a
thread): no half-replaced temporary file, and memory and disk end with the same record."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from pathlib import Path

from frenzyd.jobs.model import JobRecord, JobSpec, new_record
from frenzyd.jobs.store import JobStore


def test_concurrent_saves_of_one_record_agree_on_disk(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    spec = JobSpec(argv=("t.py",), payload_sha256="0" * 64, payload_size=1, python_version="3.11.7",
                   torch_version="2.13.0", nproc=1, mem_per_rank=1)
    rec = new_record("j-1", spec, "node", "n0", 1.0)
    store.create(rec, b"payload")
    errors: list[BaseException] = []

    def writer(tag: str) -> None:
        try:
            for i in range(200):
                store.save(replace(rec, message=f"{tag}-{i}"))
        except BaseException as exc:  # collected: the test fails below with it
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(t,)) for t in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    on_disk = JobRecord.from_dict(json.loads((store.dir("j-1") / "record.json").read_text()))
    assert on_disk == store.get("j-1")
    assert not list(store.dir("j-1").glob("*.tmp"))
