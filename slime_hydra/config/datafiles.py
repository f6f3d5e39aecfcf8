"""What `data.prompt_data` names: the files a reader walks, in one fixed order.

A spec is a jsonl or parquet file; a glob (its matches, sorted); a directory (its *.jsonl and *.parquet
files below it, sorted); a Hugging Face dataset directory written by `save_to_disk`, or an `.arrow`
file (both read through `datasets`, memory-mapped); or several of these joined by commas (quote the
value on the command line: Hydra reads a bare comma as a sweep). Any other file is read as jsonl.
Pure path logic (no reader is imported), so validation can name a bad spec before anything loads.
"""

from __future__ import annotations

import glob
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from slime_hydra.errors import Missing

ROW_FILES = (".jsonl", ".parquet")


@dataclass(frozen=True)
class DataFile:
    path: str
    kind: str  # jsonl | parquet | hf (a save_to_disk directory) | arrow (one datasets .arrow file)


def _kind(path: Path) -> str:
    if path.is_dir():
        return "hf"
    return {".parquet": "parquet", ".arrow": "arrow"}.get(path.suffix, "jsonl")


def _one(spec: str, key: str) -> tuple[list[DataFile], list[str]]:
    p = Path(spec)
    if p.is_dir() and (p / "dataset_dict.json").is_file():
        splits = sorted(q.name for q in p.iterdir() if (q / "state.json").is_file())
        return [], [f"{key}={spec} is a Hugging Face DatasetDict with splits {splits}; point {key} at one split's "
                    f"directory, e.g. {key}={p / (splits[0] if splits else 'train')}"]
    if p.is_dir() and (p / "state.json").is_file():
        return [DataFile(spec, "hf")], []
    if p.is_dir():
        found = sorted(str(q) for q in p.rglob("*") if q.suffix in ROW_FILES and q.is_file())
        if not found:
            return [], [f"{key}={spec}: the directory holds no *.jsonl or *.parquet file and is not a Hugging Face "
                        "dataset directory (save_to_disk writes state.json); point it at the data files"]
        return [DataFile(f, _kind(Path(f))) for f in found], []
    if p.is_file():
        return [DataFile(spec, _kind(p))], []
    if glob.has_magic(spec):
        found = sorted(f for f in glob.glob(spec, recursive=True) if Path(f).is_file())
        if not found:
            return [], [Missing(f"{key}={spec}: the glob matches no file; fix the pattern", key, spec)]
        return [DataFile(f, _kind(Path(f))) for f in found], []
    return [], [Missing(f"{key}={spec}: file not found; set {key} to an existing jsonl or parquet file, a glob, or a directory",
                        key, spec)]


def resolve(spec: str, key: str = "data.prompt_data") -> tuple[list[DataFile], list[str]]:
    """(the files in reading order, problems naming `key` and the fix)."""
    parts = [spec] if Path(spec).exists() or "," not in spec else [s.strip() for s in spec.split(",") if s.strip()]
    files: list[DataFile] = []
    problems: list[str] = []
    for part in parts:
        f, p = _one(part, key)
        files += f
        problems += p
    if any(f.kind in ("hf", "arrow") for f in files) and importlib.util.find_spec("datasets") is None:
        problems.append(f"{key}={spec} names a Hugging Face dataset, which is read through the `datasets` package, "
                        "not installed here; pip install datasets, or write the rows as parquet/jsonl")
    return files, problems
