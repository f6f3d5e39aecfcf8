#!/usr/bin/env bash
# On the H200 machine, from the repo root: install sglang 0.5.17 (if the call carries .sgl/10 and the parts
# are in /tmp/sgl-parts; ../shared/tools/sglang-h200/README.md) and the project's missing pure-Python
# dependencies (.gpuwhl: hydra-core, omegaconf, antlr4, math-verify, latex2sympy2_extended), then run
# `benchmarks.bench_sglang_gpu all` until the call's time is nearly spent. Parts done in an earlier call on
# the same (still warm) machine are skipped, so calling this again finishes the rest.
#   usage: [PARTS=grpo,sync,async,pair] bash benchmarks/gpu/h200.sh [call seconds, default 600]
#   issue 8's sync vs async in one process, one engine start: PARTS=pair (benchmarks/bench_async_sglang.py)
set -uo pipefail
limit=${1:-600}
out=${OUT:-bench_out/sglang_gpu}
mkdir -p "$out"
if ! [ -f /tmp/sgl-site/sglang/version.py ]; then
  [ -f .sgl/10/install.sh ] || { echo "sglang is not installed and .sgl/10 was not carried"; exit 3; }
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
