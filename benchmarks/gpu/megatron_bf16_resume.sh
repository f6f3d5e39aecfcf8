#!/usr/bin/env bash
# On one GPU: the Qwen3-0.6B shape in bf16 through train=megatron saves, resumes, and the resumed rollouts
# match the uninterrupted ones (local rollout: no SGLang needed). Needs .whl (megatron-core 0.16.1 cp312) and .gpuwhl in the repo root.
#   usage: bash benchmarks/gpu/megatron_bf16_resume.sh [extra overrides]
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpuwhl/*.whl .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
out=${OUT:-/tmp/out}
A="train=megatron model=qwen3_0_6b model.dtype=bfloat16 cluster.device=cuda logger=none logger.progress_bar=false
   warmstart.steps=0 eval=none rollout.rollout_max_response_len=6 num_rollout=4 save_interval=2 train.lr=1e-6 train.min_lr=0 $*"
t0=$SECONDS
python3 -m slime_hydra $A output_dir=/tmp/full > $out/full.log 2>&1; echo "full: exit $? in $((SECONDS - t0)) s"
t0=$SECONDS
python3 -m slime_hydra $A load=/tmp/full/checkpoints/rollout_000001 output_dir=/tmp/res > $out/res.log 2>&1; echo "resume: exit $? in $((SECONDS - t0)) s"
tail -5 $out/full.log; tail -3 $out/res.log
python3 - <<'PY'
from slime_hydra.engine.checkpoint import load_state
a, b = (load_state(__import__("pathlib").Path(f"/tmp/{d}/checkpoints/rollout_000003"))["history"] for d in ("full", "res"))
for (s, x), (t, y) in zip(a[-2:], b[-2:]):
    keys = [k for k in x if k.startswith("train/") or k.startswith("rollout/reward")]
    diff = {k: (x[k], y.get(k)) for k in keys if x[k] != y.get(k)}
    print("step", s, t, "equal keys", len(keys) - len(diff), "of", len(keys), "max abs diff",
          max([abs(p - q) for p, q in diff.values() if q is not None] or [0.0]))
    print({k: x[k] for k in keys[:6]})
PY
