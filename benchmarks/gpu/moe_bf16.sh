#!/usr/bin/env bash
# On ONE GPU: a reduced Qwen3-30B-A3B through train=megatron in bf16 with real megatron-core (no CPU shim), EP=1: the
# model option's real shapes (hidden 2048, 32 query heads over 4 groups, 128 experts of width 768, top-8, vocab
# 151936, the alltoall dispatcher) with $LAYERS of its 48 layers (default 4: 3.11B parameters, 2.42B of them routed
# experts), the router's load-balancing loss at Qwen3-MoE's 1e-3. A random HF checkpoint is written first
# (slime_hydra.models.random_checkpoint, the character tokenizer) and loaded through the HF -> Megatron conversion;
# the local rollout samples (no SGLang), so the figures are the trainer's. Prints the memory plan of the same
# overrides, then per rollout train/moe_aux_loss, train/moe_expert_load_imbalance, train/grad_norm, perf/train_time_s
# and the peak allocated memory ($OUT/moe_metrics.jsonl holds every metric of every rollout).
# The random model earns reward 0, so every group's advantages are 0: train.skip_zero_advantage_samples=false keeps
# the samples in the backward pass (the gradient is then the router's load-balancing loss alone), and the prompt bound
# (the addition prompts are under 32 tokens) keeps the plan from sizing micro-batches of 40,928-token prompts. No
# checkpoint is written (benchmarks/gpu/cli_no_checkpoint.py: the last rollout's would be ~50 GB).
# Needs .whl (megatron-core 0.16.1 cp312) and .gpuwhl in the repo root, as benchmarks/gpu/megatron_bf16_resume.sh.
#   usage: LAYERS=4 ROLLOUTS=6 bash benchmarks/gpu/moe_bf16.sh [extra overrides]
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpuwhl/*.whl .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
out=${OUT:-/tmp/out}
mkdir -p "$out"
LAYERS=${LAYERS:-4}
M="model=qwen3_30b_a3b model.num_layers=$LAYERS model.dtype=bfloat16 model.moe_aux_loss_coeff=1e-3"
CKPT=/tmp/qwen3-30b-a3b-${LAYERS}l-random
t0=$SECONDS
[ -f "$CKPT/model.safetensors" ] || python3 -m slime_hydra.models.random_checkpoint "$CKPT" $M > "$out/ckpt.log" 2>&1 || {
  tail -20 "$out/ckpt.log"; exit 4; }
echo "checkpoint: $CKPT in $((SECONDS - t0)) s"
# 8 prompts x 8 samples, 2 optimizer steps per rollout, micro-batches of 8 rows
A="train=megatron $M model.hf_checkpoint=$CKPT cluster.device=cuda logger=none logger.progress_bar=false warmstart.steps=0
   eval=none rollout.rollout_batch_size=8 rollout.n_samples_per_prompt=8 rollout.rollout_max_response_len=32
   data.rollout_max_prompt_len=32 train.skip_zero_advantage_samples=false
   train.global_batch_size=32 train.micro_batch_size=8 num_rollout=${ROLLOUTS:-6} save_interval=null train.lr=1e-6 train.min_lr=0 $*"
python3 -m slime_hydra plan $A 2>&1 | grep -A6 "^memory:"
t0=$SECONDS
rm -f "$out/moe_metrics.jsonl"
python3 benchmarks/gpu/cli_no_checkpoint.py "$out/moe_metrics.jsonl" $A output_dir=/tmp/moe_bf16 > "$out/moe_bf16.log" 2>&1
echo "run: exit $? in $((SECONDS - t0)) s"
tail -5 "$out/moe_bf16.log"
python3 - "$out/moe_metrics.jsonl" <<'PY'
import json, sys
keys = ("train/moe_aux_loss", "train/moe_expert_load_imbalance", "train/grad_norm", "perf/train_time_s",
        "perf/train_peak_allocated_gib", "perf/train_peak_reserved_gib", "perf/step_time_s", "perf/rollout_time_s")
print("step " + " ".join(k.split("/")[1] for k in keys))
for line in open(sys.argv[1]):
    m = json.loads(line)
    print(m["step"], " ".join(f"{m[k]:.6g}" if k in m else "-" for k in keys))
PY
