"""Is a checkpoint directory whole? Each problem found names the file, so the error can say which one is broken.

Checked without loading the model: every file the save's manifest lists is there with the recorded size
(a save leaves `manifest.json` last, so a copy cut short or a file truncated later shows here); every
top-level JSON file parses; every safetensors file's header parses and the file is as long as the header
says; the state (checkpoint_state.py) is there: state.json parses and state.safetensors' header does, or an older
release's state.pt loads with torch's weights-only unpickler (its tensors memory-mapped, not read), and one that
asks to run code raises checkpoint_state.UnsafeState instead of being reported as broken; megatron's
`metadata.json` parses and its `common.pt` loads (weights only). Not checked: the bytes inside a tensor (no checksums: hashing tens of GB at every save
costs more than the failures it would catch; a flipped bit in the weights loads). Checkpoints written before
manifests existed get the format checks alone.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

from slime_hydra.engine import checkpoint_state

MANIFEST = "manifest.json"
STATE_FILES = (checkpoint_state.TREE, checkpoint_state.TENSORS, checkpoint_state.LEGACY)


def problems(ckpt: Path) -> list[str]:
    """What is wrong with checkpoint `ckpt`, one `file: what` per problem; [] when it looks whole."""
    if not ckpt.is_dir():
        return [f"{ckpt}: no such directory"]
    found = manifest_problems(ckpt)
    if found:  # a missing or truncated file: the format checks below would only repeat it
        return found
    for f in sorted(ckpt.glob("*.json")):
        if f.name != MANIFEST and (p := json_problem(f)):
            found.append(p)
    for f in sorted(ckpt.glob("*.safetensors")):
        if p := safetensors_problem(f):
            found.append(p)
    megatron = ckpt / "megatron"
    if megatron.is_dir():
        found += [p for p in (json_problem(megatron / "metadata.json"), torch_problem(megatron / "common.pt")) if p]
    return found + state_problems(ckpt)


def state_problems(ckpt: Path) -> list[str]:
    """The resume state's files (their format was checked with every JSON and safetensors file above)."""
    paths = checkpoint_state.files(ckpt)
    if paths[0].name == checkpoint_state.LEGACY:
        try:
            checkpoint_state.read_legacy(paths[0], mmap=True)
        except checkpoint_state.UnsafeState:
            raise
        except Exception as e:  # zip, pickle and storage errors all mean the same here: it does not load
            return [f"{paths[0]}: does not load ({type(e).__name__}: {str(e)[:200]})"]
        return []
    return [f"{p}: missing (every checkpoint has one: the state to resume)" for p in paths if not p.is_file()]


def manifest_problems(ckpt: Path) -> list[str]:
    path = ckpt / MANIFEST
    if not path.is_file():
        return []  # written before manifests: the format checks alone
    try:
        files = json.loads(path.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return [f"{path}: unreadable ({e})"]
    out = []
    for rel, size in sorted(files.items()):
        f = ckpt / rel
        if not f.is_file():
            out.append(f"{f}: missing (the manifest lists {size} bytes)")
        elif (got := f.stat().st_size) != size:
            out.append(f"{f}: {got} bytes, the manifest records {size} ({'truncated' if got < size else 'changed'})")
    return out


def json_problem(f: Path) -> str | None:
    try:
        json.loads(f.read_text())
    except (OSError, ValueError) as e:
        return f"{f}: not valid JSON ({e})"
    return None


def safetensors_problem(f: Path) -> str | None:
    """The header is 8 bytes of length, then JSON whose data_offsets say how long the file must be."""
    size = f.stat().st_size
    try:
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            if n > size:
                return f"{f}: {size} bytes, shorter than its own header ({n} bytes): truncated"
            header = json.loads(fh.read(n))
        need = 8 + n + max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    except (OSError, ValueError, KeyError, TypeError, struct.error) as e:
        return f"{f}: not a readable safetensors file ({e})"
    if size != need:
        return f"{f}: {size} bytes, its header needs {need} ({'truncated' if size < need else 'trailing bytes'})"
    return None


def torch_problem(f: Path) -> str | None:
    if not f.is_file():
        return f"{f}: missing"
    try:
        torch.load(f, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # zip, pickle and storage errors all mean the same here: it does not load
        return f"{f}: does not load ({type(e).__name__}: {str(e)[:200]})"
    return None
