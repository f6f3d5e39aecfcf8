"""Rollout dumps (slime's save/load_debug_rollout_data): each rollout's samples as jsonl, and the replay buffer.

Format version 2, one file per rollout: a header line
`{"format": "slime_hydra.rollout_dump", "version": 2, "rollout_id", "num_kept", "n_samples_per_prompt",
"model": {"name", "hf_checkpoint"}, "tokenizer": {"vocab_size", "fingerprint"}}`, then one line per sample:
the whole Sample (prompt and response tokens, rollout log-probs, loss mask, reward, status, weight version,
metadata) plus `rollout_id`, `kept` and `dropped_reason`. The trained (kept) samples come first, group after
group in the order they were trained; the groups the dynamic-sampling filter dropped follow. Version 1 (before
this module) held text, reward and counts only, not enough to train on.

A replay reads the headers at start (what rollouts the dump holds and what model wrote it) and each rollout's
samples when the loop reaches it. What it leaves out: groups aborted mid-generation and returned to the buffer
are not in the dump (only what a rollout finished with), so a replay serves the kept groups only.
"""

from __future__ import annotations

import glob
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from slime_hydra.data.buffer import Group, reset_sample, sample_from_dict, sample_to_dict
from slime_hydra.data.source import PromptSource
from slime_hydra.errors import RunError
from slime_hydra.types import Sample

FORMAT, VERSION = "slime_hydra.rollout_dump", 2
KEY = "load_debug_rollout_data"


def dump_meta(model_name: str, hf_checkpoint: Optional[str], tokenizer, n_samples_per_prompt: int) -> dict:
    """What a replay checks the dump against: the model and tokenizer that wrote it."""
    vocab = sorted(tokenizer.get_vocab().items())
    return {"model": {"name": model_name, "hf_checkpoint": hf_checkpoint},
            "tokenizer": {"vocab_size": len(vocab), "fingerprint": hashlib.sha256(json.dumps(vocab).encode()).hexdigest()[:16]},
            "n_samples_per_prompt": n_samples_per_prompt}


def dump_path(template: str, rollout_id: int) -> Path:
    """save_debug_rollout_data: a directory (rollout_NNNNNN.jsonl in it), or a path with "{rollout_id}"."""
    if "{rollout_id}" in template:
        return Path(template.replace("{rollout_id}", str(rollout_id)))
    return Path(template) / f"rollout_{rollout_id:06d}.jsonl"


def write_rollout_dump(template: str, rollout_id: int, kept: list[Sample], dropped: list[tuple[Group, str]],
                       meta: dict) -> Path:
    path = dump_path(template, rollout_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [(s, "") for s in kept] + [(s, reason) for g, reason in dropped for s in g]
    header = {"format": FORMAT, "version": VERSION, "rollout_id": rollout_id, "num_kept": len(kept), **meta}
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(json.dumps(header) + "\n")
        for s, reason in rows:
            f.write(json.dumps({"rollout_id": rollout_id, **sample_to_dict(s), "kept": not reason,
                                "dropped_reason": reason}) + "\n")
    tmp.replace(path)  # a reader never sees half a rollout
    return path


def dump_files(spec: str) -> list[Path]:
    """A directory (its *.jsonl files) or a glob."""
    p = Path(spec)
    if p.is_dir():
        return sorted(p.glob("*.jsonl"))
    return sorted(Path(f) for f in glob.glob(spec, recursive=True) if Path(f).is_file())


@dataclass
class RolloutDump:
    """The headers of a dump, by rollout id; `served` holds the samples the buffer handed out, by index, until
    the replay rollout backend fills the placeholders from them."""

    spec: str
    files: dict[int, Path]
    headers: dict[int, dict]
    served: dict[int, Sample] = field(default_factory=dict)

    def kept_groups(self, rollout_id: int) -> list[Group]:
        path, n = self.files[rollout_id], self.headers[rollout_id]["n_samples_per_prompt"]
        with open(path) as f:
            next(f)
            rows = [json.loads(line) for line in f if line.strip()]
        kept = [sample_from_dict(strip(r)) for r in rows if r["kept"]]
        return [kept[i:i + n] for i in range(0, len(kept), n)]


def strip(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in ("rollout_id", "kept", "dropped_reason")}


def read_dump(spec: str) -> tuple[Optional[RolloutDump], list[str]]:
    """The dump's headers, or the problems that make it unreadable (each naming the file and the key)."""
    files = dump_files(spec)
    if not files:
        return None, [f"{KEY}={spec}: no dump files match (a directory of rollout_NNNNNN.jsonl written by "
                      "save_debug_rollout_data, or a glob of such files)"]
    problems, by_id, headers = [], {}, {}
    for path in files:
        try:
            with open(path) as f:
                head = json.loads(f.readline() or "null")
        except (OSError, UnicodeDecodeError, ValueError) as e:
            problems.append(f"{KEY}: {path}:1: not a rollout dump ({e})")
            continue
        if not isinstance(head, dict) or head.get("format") != FORMAT:
            old = isinstance(head, dict) and "response" in head and "rollout_id" in head
            problems.append(f"{KEY}: {path}: " + ("a version-1 dump (text and rewards only, no tokens or log-probs); "
                            "regenerate it with save_debug_rollout_data" if old else "not a rollout dump (no header line)"))
            continue
        if head.get("version") != VERSION:
            problems.append(f"{KEY}: {path}: dump format version {head.get('version')}, this slime_hydra reads {VERSION}; "
                            "regenerate it with save_debug_rollout_data")
            continue
        rid = head["rollout_id"]
        if rid in by_id:
            problems.append(f"{KEY}={spec}: rollout {rid} is in both {by_id[rid]} and {path}; point {KEY} at one run's dump")
            continue
        by_id[rid], headers[rid] = path, head
    return (RolloutDump(spec, by_id, headers) if not problems else None), problems


def check_dump(dump: RolloutDump, meta: dict, start: int, num_rollout: int, rollout_batch_size: int) -> list[str]:
    """The dump against this run: same model and tokenizer, every rollout start..num_rollout-1 present, and each
    holding rollout_batch_size groups of n_samples_per_prompt."""
    problems = []
    rid = next((r for r, h in sorted(dump.headers.items()) if (h["model"]["name"], h["tokenizer"]) !=
                (meta["model"]["name"], meta["tokenizer"])), min(dump.headers))
    head = dump.headers[rid]  # the first file that differs from this run, if any
    if head["model"]["name"] != meta["model"]["name"]:
        problems.append(f"{KEY}={dump.spec} was written by model {head['model']['name']!r} "
                        f"(hf_checkpoint {head['model']['hf_checkpoint']}); this run's model.name is "
                        f"{meta['model']['name']!r}: set model= to the dump's model, or point {KEY} at a dump of this model")
    if head["tokenizer"] != meta["tokenizer"]:
        problems.append(f"{KEY}={dump.spec} was written with another tokenizer (vocab {head['tokenizer']['vocab_size']}, "
                        f"this run's {meta['tokenizer']['vocab_size']}); its token ids mean other text here: set "
                        f"model.hf_checkpoint / model.tokenizer to the dump's, or point {KEY} at a dump of this model")
    if head["n_samples_per_prompt"] != meta["n_samples_per_prompt"]:
        problems.append(f"{KEY}={dump.spec} has groups of {head['n_samples_per_prompt']} samples; set "
                        f"rollout.n_samples_per_prompt={head['n_samples_per_prompt']}")
    missing = [r for r in range(start, num_rollout) if r not in dump.files]
    if missing:
        upto = start
        while upto in dump.files:
            upto += 1
        fix = f"set num_rollout={upto}" if upto > start else f"point {KEY} at the dump of rollouts {start}-{num_rollout - 1}"
        problems.append(f"{KEY}={dump.spec} holds no rollout {spans(missing)} (it holds {spans(sorted(dump.files))}); {fix}, "
                        "or dump those rollouts with save_debug_rollout_data")
    want = rollout_batch_size * meta["n_samples_per_prompt"]
    wrong = {r: dump.headers[r]["num_kept"] for r in range(start, num_rollout) if r in dump.headers
             and dump.headers[r]["num_kept"] != want}
    if wrong:
        r, got = next(iter(wrong.items()))
        problems.append(f"{KEY}={dump.spec}: rollout {r} trained {got} samples, this run's rollout.rollout_batch_size × "
                        f"rollout.n_samples_per_prompt is {want}; set rollout.rollout_batch_size="
                        f"{got // meta['n_samples_per_prompt']}")
    return problems


def spans(ids: list[int]) -> str:
    out, i = [], 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        out.append(f"{ids[i]}" if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ", ".join(out) or "none"


class ReplayBuffer:
    """The data buffer of a train-only replay: serves each rollout's kept groups, in their trained order, as
    fresh prompts; the replay rollout backend fills them from `dump.served`. A round never crosses into the next
    rollout's groups. The loop's rollout.dynamic_sampling_filter judges them again: they all passed it when the
    dump was written, so a filter that looks only at the group passes them again."""

    def __init__(self, dump: RolloutDump, source: PromptSource, start_rollout: int):
        self.dump, self.source = dump, source
        self.next_rollout = start_rollout
        self.queue: list[Group] = []
        self.by_index: dict[int, Sample] = {}  # the dumped samples served this rollout

    def get_groups(self, num_groups: int) -> list[Group]:
        if not self.queue:
            if self.next_rollout not in self.dump.files:
                raise RunError(f"{KEY}={self.dump.spec}: the replay asked for rollout {self.next_rollout}, which the dump "
                               "does not hold (rollout.dynamic_sampling_filter dropped a replayed group, so the rollout "
                               "took the next one's); replay with a filter that judges a group alone")
            self.queue = self.dump.kept_groups(self.next_rollout)
            self.by_index = {s.index: s for g in self.queue for s in g}
            self.next_rollout += 1
        served, self.queue = self.queue[:num_groups], self.queue[num_groups:]
        out = []
        for g in served:
            group = []
            for s in g:
                self.dump.served[s.index] = s
                fresh = sample_from_dict(sample_to_dict(s))
                reset_sample(fresh)  # the prompt as the source served it; generate() fills the rest
                group.append(fresh)
            out.append(group)
        return out

    def add_groups(self, groups: list[Group], keep_generation: bool) -> None:
        """Unused groups (none in a replay that keeps what it serves) are served again first."""
        for g in groups:
            for s in g:
                self.dump.served.pop(s.index, None)
        self.queue = [[self.by_index[s.index] for s in g] for g in groups] + self.queue

    def __len__(self) -> int:
        return len(self.queue)

    def state_dict(self) -> dict:
        # groups/source as DataBuffer writes them, so a real run can load a replay's checkpoint
        return {"groups": [], "source": self.source.state_dict(), "replay_next_rollout": self.next_rollout - bool(self.queue)}

    def load_state_dict(self, state: dict) -> None:
        if "replay_next_rollout" in state:
            self.next_rollout, self.queue = state["replay_next_rollout"], []
        self.source.load_state_dict(state["source"])
