"""A checkpoint's resume state as plain data: `state.json` (the tree) and `state.safetensors` (its tensors).

Loading a checkpoint never runs code named by its files. A pickle can name any function to call while it is
read (torch.load without weights_only calls it), so anyone who can write into a save root could run commands
as the trainer's user; JSON and safetensors can only describe data. The tree holds dicts (ordered ones with a module's
`_metadata`), lists, tuples, numbers, strings, None and the dataclasses of DATA_TYPES; each tensor is stored in state.safetensors under a
name the tree keeps in its place, and comes back on the CPU (the optimizer and the modules that load it move
it to their own device; values are bit-exact).

A `state.pt` written by an older release is read with torch's weights-only unpickler (containers, tensors and
DATA_TYPES, nothing else); a pickle that asks for anything else is refused with UnsafeState, naming the file,
before any of it runs. Megatron's own checkpoint directory (`<ckpt>/megatron/`, torch DCP) is not covered:
its metadata is a pickle that megatron-core loads, so that directory is trusted (docs/security.md).
"""

from __future__ import annotations

import dataclasses
import json
import math
import pickle
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from slime_hydra.data.dataset import Prompt
from slime_hydra.data.readers import Pending
from slime_hydra.errors import UserError

TREE = "state.json"
TENSORS = "state.safetensors"
LEGACY = "state.pt"
# dataclasses a state may hold, rebuilt from their fields: a streamed source's buffer holds Prompts, and Pendings (rows
# read ahead whose template and tokens are still to come) where data workers defer them
DATA_TYPES = {"Prompt": Prompt, "Pending": Pending}
TAG = "__state__"  # the key of an encoded node; a dict of the data that has it is stored as items


class UnsafeState(UserError):
    """A state file asks to run code when loaded: it is not loaded, and the run stops naming it (exit 2)."""


def encode(state: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """-> (a JSON-able tree, {name: tensor}); a tensor seen twice (the same object) is stored once."""
    tensors: dict[str, torch.Tensor] = {}
    names: dict[int, str] = {}
    storages: set[tuple[int, int]] = set()

    def tensor(x: torch.Tensor) -> dict:
        if id(x) not in names:
            t = x.detach().cpu().contiguous()
            where = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
            if t.numel() and where in storages:  # safetensors refuses shared memory (a tied weight): a copy
                t = t.clone()
            storages.add(where)
            names[id(x)] = name = str(len(tensors))
            tensors[name] = t
        return {TAG: "tensor", "name": names[id(x)]}

    def walk(x: Any) -> Any:
        if x is None or isinstance(x, (bool, int, str)):
            return x
        if isinstance(x, float):
            return x if math.isfinite(x) else {TAG: "float", "repr": repr(x)}
        if isinstance(x, torch.Tensor):
            return tensor(x)
        if isinstance(x, (list, tuple)):
            items = [walk(v) for v in x]
            return items if type(x) is list else {TAG: "tuple", "items": items}
        if isinstance(x, OrderedDict):  # a module's state_dict, with the versions load_state_dict reads
            meta = getattr(x, "_metadata", None)
            return {TAG: "odict", "items": [[walk(k), walk(v)] for k, v in x.items()],
                    "metadata": None if meta is None else walk(dict(meta))}
        if isinstance(x, dict):
            if all(isinstance(k, str) for k in x) and TAG not in x:
                return {k: walk(v) for k, v in x.items()}
            return {TAG: "dict", "items": [[walk(k), walk(v)] for k, v in x.items()]}
        if dataclasses.is_dataclass(x) and DATA_TYPES.get(type(x).__name__) is type(x):
            return {TAG: type(x).__name__, "fields": {f.name: walk(getattr(x, f.name)) for f in dataclasses.fields(x)}}
        if hasattr(x, "item") and type(x).__module__ == "numpy":  # a numpy scalar: the Python number of the same value
            return walk(x.item())
        raise TypeError(f"a checkpoint's state holds plain data only, not {type(x).__module__}.{type(x).__qualname__}; "
                        "turn it into dicts, lists and numbers (or add a dataclass to checkpoint_state.DATA_TYPES)")

    return walk(state), tensors


def decode(tree: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(tree, list):
        return [decode(v, tensors) for v in tree]
    if not isinstance(tree, dict):
        return tree
    kind = tree.get(TAG)
    if kind is None:
        return {k: decode(v, tensors) for k, v in tree.items()}
    if kind == "tensor":
        return tensors[tree["name"]]
    if kind == "float":
        return float(tree["repr"])
    if kind == "tuple":
        return tuple(decode(v, tensors) for v in tree["items"])
    if kind == "dict":
        return {_hashable(decode(k, tensors)): decode(v, tensors) for k, v in tree["items"]}
    if kind == "odict":
        out = OrderedDict((_hashable(decode(k, tensors)), decode(v, tensors)) for k, v in tree["items"])
        if tree["metadata"] is not None:
            out._metadata = OrderedDict(decode(tree["metadata"], tensors))  # type: ignore[attr-defined]
        return out
    if kind in DATA_TYPES:
        return DATA_TYPES[kind](**{k: decode(v, tensors) for k, v in tree["fields"].items()})
    raise ValueError(f"unknown node {kind!r}")


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, (list, tuple)) else key


def write(directory: Path, state: Any) -> None:
    """state.json and state.safetensors into `directory` (a full disk: OSError, or safetensors' error naming it)."""
    from safetensors.torch import save_file

    tree, tensors = encode(state)
    save_file(tensors, str(directory / TENSORS))
    with open(directory / TREE, "w") as f:  # a file object: a full disk surfaces as OSError(ENOSPC)
        json.dump({"format": 1, "tree": tree}, f)


def read(directory: Path) -> Any:
    """The state written by `write`, or an older release's state.pt (weights-only); raises UnsafeState for a
    pickle that names code, any other exception for a file that does not load."""
    if not (directory / TREE).is_file() and (directory / LEGACY).is_file():
        return read_legacy(directory / LEGACY)
    from safetensors.torch import load_file

    tree = json.loads((directory / TREE).read_text())["tree"]
    return decode(tree, load_file(directory / TENSORS, device="cpu"))


def read_legacy(path: Path, mmap: bool = False) -> Any:
    try:
        with torch.serialization.safe_globals(list(DATA_TYPES.values())):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        if "weights_only" in str(e) or "Weights only" in str(e):
            raise UnsafeState(f"{path}: refused: its pickle asks to run code when loaded ({unsafe_reason(e)}); a "
                              "checkpoint's state is plain data. Nothing of it was run. Delete this checkpoint if you "
                              "did not write it, or point load at one you trust") from None
        raise


def unsafe_reason(e: Exception) -> str:
    """torch's message names what the pickle asked for ("Unsupported global: GLOBAL posix.system ..."): that line."""
    for line in str(e).splitlines():
        if "Unsupported" in line or "GLOBAL" in line:
            return line.strip()[:200]
    return str(e).splitlines()[0][:200] if str(e) else type(e).__name__


def files(directory: Path) -> list[Path]:
    """The state files a checkpoint directory holds (the new pair, else a legacy state.pt)."""
    if (directory / TREE).exists() or not (directory / LEGACY).exists():
        return [directory / TREE, directory / TENSORS]
    return [directory / LEGACY]
