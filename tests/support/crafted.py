"""A checkpoint whose state asks to run a command when it is unpickled: what an attacker with write access to a save
root would leave there."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch


class RunsACommand:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def crafted_state(ckpt: Path, marker: Path) -> Path:
    """Replace a checkpoint's state by a state.pt whose pickle runs `touch marker`, manifest updated to match."""
    for f in ("state.json", "state.safetensors"):
        (ckpt / f).unlink()
    torch.save({"rollout_id": 5, "x": RunsACommand(marker)}, ckpt / "state.pt")
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["files"] = {str(p.relative_to(ckpt)): p.stat().st_size for p in sorted(ckpt.rglob("*"))
                         if p.is_file() and p.name != "manifest.json"}
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    return ckpt / "state.pt"
