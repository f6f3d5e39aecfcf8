"""What an offline W&B run wrote, read back from its `run-<id>.wandb` file without W&B's service or the network.

The file is W&B's record log: a 7-byte header (`:W&B`, a magic number, a version), then 32 KiB blocks of chunks,
each a 4-byte checksum, a 2-byte little-endian length, a 1-byte type (1 whole, 2 first, 3 middle, 4 last) and the
bytes of a protobuf `Record` (or part of one); a block's tail shorter than a chunk header is padding.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

BLOCK = 1 << 15
HEADER = 7


@dataclass
class OfflineRun:
    run_id: str
    project: str = ""
    group: str = ""
    name: str = ""
    config: dict = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)  # one dict per logged row, W&B's own `_step`, ... included
    files: list[str] = field(default_factory=list)  # paths recorded for upload, relative to the run's files/

    def series(self, key: str, step: str = "step") -> list[tuple[int, float]]:
        """(step, value) of a metric, in the order logged."""
        return [(int(row[step]), row[key]) for row in self.history if key in row]


def chunks(data: bytes) -> list[bytes]:
    assert data[:4] == b":W&B", "not a W&B run file"
    pos, part, out = HEADER, b"", []
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        if pos + HEADER + length > len(data):  # a chunk still being written
            break
        payload, pos = data[pos + HEADER:pos + HEADER + length], pos + HEADER + length
        if kind == 1:
            out.append(payload)
        elif kind == 2:
            part = payload
        elif kind == 3:
            part += payload
        elif kind == 4:
            out.append(part + payload)
    return out


def records(path: Path, timeout_s: float = 20.0) -> list:
    """The file's records once it holds the run's exit record: W&B's service writes the file in its own process and
    may finish after `run.finish()` has returned (seen on a loaded machine: a resumed run's file still empty)."""
    from wandb.proto import wandb_internal_pb2 as pb

    deadline = time.monotonic() + timeout_s
    while True:
        out = []
        for raw in chunks(Path(path).read_bytes() if Path(path).exists() else b":W&B"):
            rec = pb.Record()
            rec.ParseFromString(raw)
            out.append(rec)
        if any(r.WhichOneof("record_type") == "exit" for r in out) or time.monotonic() > deadline:
            return out
        time.sleep(0.1)


def read_run(path: Path) -> OfflineRun:
    run = OfflineRun(run_id="")
    for rec in records(path):
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            run.run_id, run.project, run.group, run.name = (rec.run.run_id, rec.run.project, rec.run.run_group,
                                                            rec.run.display_name)
            run.config |= {u.key: json.loads(u.value_json) for u in rec.run.config.update}
        elif kind == "config":
            run.config |= {u.key: json.loads(u.value_json) for u in rec.config.update}
        elif kind == "history":
            run.history.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in rec.history.item})
        elif kind == "files":
            run.files += [f.path for f in rec.files.files]
    run.config.pop("_wandb", None)
    assert run.run_id, f"{path}: no run record (the file is missing or was never finished)"
    return run


def offline_runs(save_dir: Path) -> list[OfflineRun]:
    """Every offline run under a W&B directory (`<save_dir>/wandb/offline-run-<time>-<id>[-<n>]/run-<id>.wandb`), in
    the order they started (a second run of the same id in the same second gets the folder `...-<id>-1`)."""
    folders = []
    for folder in Path(save_dir).glob("wandb/offline-run-*"):
        _, _, stamp, run_id, *n = folder.name.split("-")
        folders.append(((stamp, int(n[0]) if n else 0), folder / f"run-{run_id}.wandb"))
    return [read_run(path) for _, path in sorted(folders)]
