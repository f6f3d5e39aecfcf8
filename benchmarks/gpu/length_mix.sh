#!/usr/bin/env bash
# Packed sequences and token-budget micro-batches on one GPU, in one command: packed attention's GPU kernel checked
# against the per-sample loop (tests/training/megatron/test_gpu.py -k varlen), then `bench_megatron --mix`: padded vs packed vs packed + token
# budget on the realistic RL length mix, 4B first, then the addition experiments' shape and 0.6B (the mix, the
# micro-batch sizes and budgets: benchmarks/bench_megatron_mix.py). Each part under its own time cap; the bench prints
# each row as it finishes and rewrites $OUT/bench_megatron_mix.json, and the table is printed from that JSON at the end
# even when the cap cut the bench short. Needs .whl (the megatron-core 0.16.1 cp312 wheel) and .gpuwhl in the
# repo root (installed into /tmp/site).
#   usage: bash benchmarks/gpu/length_mix.sh [seconds for the whole script, default 340] [extra bench_megatron args]
set -uo pipefail
limit=${1:-340}
shift || true
out=${OUT:-bench_out/length_mix}
mkdir -p "$out"
ls .whl/*.whl .gpuwhl/*.whl > /dev/null || { echo "put the megatron-core wheel in .whl/ and the project's wheels in .gpuwhl/"; exit 3; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpuwhl/*.whl .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false \
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader
python3 -c "import inspect, torch; from torch.nn.attention import varlen
print('torch', torch.__version__, 'varlen_attn', inspect.signature(varlen.varlen_attn))" 2>&1 | tail -2
echo "== setup done at $SECONDS s"
timeout -k 5 100 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/training/megatron/test_gpu.py -k varlen \
  > "$out/test_varlen.log" 2>&1
echo "== varlen test: exit $? at $SECONDS s"; grep -E "GPU varlen|passed|failed|Error|assert" "$out/test_varlen.log" | tail -8
left=$((limit - SECONDS - 12))
timeout -k 5 "$left" python3 -m benchmarks.bench_megatron --mix --out "$out/bench_megatron_mix.json" "$@" \
  > "$out/bench.log" 2>&1
echo "== bench: exit $? at $SECONDS s (124: cut at ${left} s)"
grep -E "^# |Traceback|Error" "$out/bench.log" | tail -6
python3 -c "import json, sys; from benchmarks.bench_megatron_mix import report
report(json.load(open(sys.argv[1]))['rows'])" "$out/bench_megatron_mix.json"
echo "== done at $SECONDS s"
