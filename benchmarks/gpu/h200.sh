#!/usr/bin/env bash
# On one GPU (written for an H200), from the repo root: install sglang 0.5.17 unless it is already in /tmp/sgl-site
# (with .sgl/10/install.sh, which reassembles the parts in /tmp/sgl-parts) and the project's missing pure-Python
# dependencies (.gpuwhl: hydra-core, omegaconf, antlr4, math-verify, latex2sympy2_extended), then run
# `benchmarks.bench_sglang_gpu all` until the given seconds are nearly spent. Parts already done on this machine
# (results kept in /tmp/slime_gpu_state) are skipped, so running this again finishes the rest.
#   usage: [PARTS=grpo,sync,async,pair] bash benchmarks/gpu/h200.sh [seconds, default 600]
#   train_mode=sync vs async in one process, one engine start: PARTS=pair (benchmarks/bench_async_sglang.py)
set -uo pipefail
limit=${1:-600}
out=${OUT:-bench_out/sglang_gpu}
mkdir -p "$out"
if ! [ -f /tmp/sgl-site/sglang/version.py ]; then
  [ -f .sgl/10/install.sh ] || { echo "sglang is not installed and .sgl/10/install.sh is missing"; exit 3; }
  bash .sgl/10/install.sh || exit 3
fi
if ! [ -d /tmp/site/hydra ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpuwhl/*.whl || exit 3
fi
export PYTHONPATH=/tmp/sgl-site:/tmp/sgl-sc:/tmp/site:$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader
python3 -c "import torch, transformers, sglang; print('torch', torch.__version__, 'transformers', transformers.__version__, 'sglang', sglang.__version__)"
left=$((limit - SECONDS - 25))
timeout "$left" python3 -m benchmarks.bench_sglang_gpu all --out "$out" --deadline-s "$((left - 15))" ${PARTS:+--parts "$PARTS"} 2>&1 | tee "$out/bench.log"
ls -la "$out"
