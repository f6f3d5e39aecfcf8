"""What `data.prompt_data` names: the files a reader walks, in one fixed order.

A spec is a jsonl or parquet file; a glob (its matches, sorted); a directory (its *.jsonl and *.parquet
files below it, sorted); a Hugging Face dataset directory written by `save_to_disk`, or an `.arrow`
file (both read through `datasets`, memory-mapped); or several of these joined by commas (quote the
value on the command line: Hydra reads a bare comma as a sweep). Any other file is read as jsonl.
Pure path logic (no reader is imported), so validation can name a bad spec before anything loads; rows are counted
only for `num_epoch` (jsonl lines, parquet metadata). Also here: each `eval.eval_prompt_data` entry resolved
against the keys it falls back to.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from slime_hydra.config.schema import EvalDatasetConfig, RunConfig
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


def count_prompts(spec: str, needs: str) -> tuple[Optional[int], list[str]]:
    """(the rows of the files `spec` names, or None; the problems that leave it uncounted, each saying that `needs`
    needs the count). A spec whose files are missing counts None with no problem: the data check names it."""
    files, missing = resolve(spec)
    if missing or not files:
        return None, []
    if any(f.kind not in ("jsonl", "parquet") for f in files):
        return None, [f"{needs} needs the row count of data.prompt_data={spec}, which is counted for jsonl and parquet "
                      "files only; set num_rollout instead"]
    problems: list[str] = []
    counts = [count_rows(f.path, problems) for f in files]
    return (None if None in counts else sum(counts)), problems


def count_rows(path: str, problems: list[str]) -> Optional[int]:
    """Rows of a jsonl (non-blank lines, read as bytes: the loader reports bad encodings) or parquet file."""
    if not path.endswith(".parquet"):
        with open(path, "rb") as f:
            return sum(1 for line in f if line.strip())
    try:
        import pyarrow.parquet as pq  # lazy: only parquet files need it

        return pq.ParquetFile(path).metadata.num_rows
    except Exception as e:  # noqa: BLE001 - any reader failure is the same fix
        problems.append(f"data.prompt_data={path}: not a readable parquet file ({e}); rewrite it, or give a jsonl file")
        return None


def eval_datasets(cfg: RunConfig, problems: Optional[list[str]] = None) -> dict[str, EvalDatasetConfig]:
    """eval.eval_prompt_data -> one fully resolved EvalDatasetConfig per name (fallbacks filled in); an unknown key of
    an entry is appended to `problems` when given."""
    e, r = cfg.eval, cfg.rollout
    fields = {f.name for f in dataclasses.fields(EvalDatasetConfig)}
    out = {}
    for name, spec in e.eval_prompt_data.items():
        spec = {"path": spec} if isinstance(spec, str) else dict(spec or {})
        unknown = sorted(set(spec) - fields)
        if unknown and problems is not None:
            problems.append(f"eval.eval_prompt_data.{name}: unknown key(s) {unknown}; valid keys: {sorted(fields)}")
        spec = {k: v for k, v in spec.items() if k in fields}
        ds = EvalDatasetConfig(**{"path": None, **spec})
        pick = lambda v, *fallbacks: next((x for x in (v, *fallbacks) if x is not None), None)  # noqa: E731
        out[name] = EvalDatasetConfig(
            path=ds.path, input_key=pick(ds.input_key, cfg.data.input_key), label_key=pick(ds.label_key, cfg.data.label_key),
            metadata_key=pick(ds.metadata_key, cfg.data.metadata_key),
            rm_type=pick(ds.rm_type, cfg.reward.rm_type),
            n_samples_per_eval_prompt=pick(ds.n_samples_per_eval_prompt, e.n_samples_per_eval_prompt),
            eval_temperature=pick(ds.eval_temperature, e.eval_temperature, r.rollout_temperature),
            eval_top_p=pick(ds.eval_top_p, e.eval_top_p, r.rollout_top_p),
            eval_top_k=pick(ds.eval_top_k, e.eval_top_k, r.rollout_top_k),
            eval_max_response_len=pick(ds.eval_max_response_len, e.eval_max_response_len, r.rollout_max_response_len))
    return out


def blank_file(path: str, chunk: int = 1 << 16) -> bool:
    """Whether a file holds only whitespace, read a chunk at a time up to its first other byte (never a line whole:
    a file may be one line of gigabytes)."""
    with open(path, "rb") as f:
        while data := f.read(chunk):
            if data.strip():
                return False
    return True
