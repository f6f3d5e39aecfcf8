"""Write a randomly initialised Hugging Face checkpoint directory from a model option, as a user's
`model.hf_checkpoint` would hold one: config.json, model.safetensors (in model.dtype), generation_config.json and
the tokenizer files with a chat template (the project's character tokenizer, model.tokenizer).

    python -m slime_hydra.models.random_checkpoint DIR model=qwen3_0_6b [seed=1234] [more overrides]
    python -m slime_hydra.models.random_checkpoint experiment=grpo/qwen3-0.6b-addition-1n1g-torch-sglang-colocate-v1

Without DIR it writes to the composed config's `model.hf_checkpoint` (so an experiment that points there gets the
directory it expects). The weights are the ones a run with the same model fields and `seed` builds when
model.hf_checkpoint is unset (models/build.py: the same function, seeded on the CPU), so a run started from this
directory matches one started from the random init. transformers' `from_pretrained` / `AutoTokenizer`, the
megatron backend's HF -> Megatron conversion and SGLang load it offline. An existing, non-empty DIR is refused
(it might be a real checkpoint). Qwen3-0.6B: 596M parameters, 1.1 GiB in bf16, ~35-90 s on a CPU.

Left out: the tokenizer of a real model (this writes the character tokenizer: the embedded tasks' vocabulary in
the first ~70 rows of an embedding of model.vocab_size rows).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Optional

from slime_hydra.config.schema import ModelConfig
from slime_hydra.models.size import num_parameters

USAGE = ("usage: python -m slime_hydra.models.random_checkpoint [DIR] [model=<option>] [seed=N] [overrides...]\n"
         "  DIR: the directory to write (new or empty); default: the composed model.hf_checkpoint")


def write_random_checkpoint(model: ModelConfig, out_dir: str | Path, seed: int) -> Path:
    """model's fields (not its hf_checkpoint) -> a new HF directory at out_dir; returns it."""
    from slime_hydra.models.build import build_model, build_tokenizer

    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not an empty directory; remove it or pick another directory")
    fresh = dataclasses.replace(model, hf_checkpoint=None)
    tokenizer = build_tokenizer(fresh)
    net = build_model(fresh, tokenizer, seed)
    out.mkdir(parents=True, exist_ok=True)
    net.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0
    out = argv[0] if argv and "=" not in argv[0] else None
    overrides = argv[1:] if out is not None else argv
    from slime_hydra.config.compose import Composer, check_overrides, to_run_config

    with Composer() as composer:  # composed, not validated: the directory a config points at may not exist yet
        cfg, problems = check_overrides(composer, overrides)
    typed = None
    if cfg is not None and not problems:
        try:
            typed = to_run_config(cfg)
        except Exception as e:  # noqa: BLE001 - a wrong type or a missing value, named by OmegaConf
            problems.append(" ".join(str(e).split()).split(" full_key:")[0])
    if typed is not None:
        m = typed.model
        out = out or m.hf_checkpoint
        if out is None:
            problems.append("no directory to write: give DIR as the first argument or set model.hf_checkpoint=DIR")
        if m.dtype not in ("float32", "bfloat16", "float16"):
            problems.append(f"model.dtype={m.dtype!r} is not one of ['float32', 'bfloat16', 'float16']")
        if m.tokenizer not in ("char", "char_tools"):
            problems.append(f"model.tokenizer={m.tokenizer!r} is not one of ['char', 'char_tools']")
        if out is not None and Path(out).exists() and (not Path(out).is_dir() or any(Path(out).iterdir())):
            problems.append(f"{out} exists and is not an empty directory (it may be a real checkpoint); remove it or "
                            "give another DIR")
    if problems:
        print("error: " + "\n  ".join(problems) + "\n" + USAGE, file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    write_random_checkpoint(m, out, typed.seed)
    size = sum(f.stat().st_size for f in Path(out).iterdir())
    print(f"wrote {out}: model={m.name}, {num_parameters(m) / 1e6:,.1f}M parameters ({m.dtype}), seed {typed.seed}, "
          f"{size / 2**20:,.0f} MiB, {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
