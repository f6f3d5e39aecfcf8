#!/usr/bin/env bash
# slime_hydra against verl on one GPU: the same model (Qwen3-0.6B shape, one HF directory both load), data (the shipped
# addition prompts), reward (exact match), batch (32 prompts x 8 samples, 6 response tokens, one AdamW step of lr 1e-4
# per rollout, GRPO), STEPS rollouts each, one after the other on the same machine; then per-step figures side by side.
#   usage: bash benchmarks/gpu/peer_verl.sh PART...      (repo root; every part but `pack` on the GPU machine)
#   parts: pack      here: the wheels (sglang 0.5.17's set from $SGL_TOOL/wheels.txt, verl 0.9.1 and what it and
#                    slime_hydra need that the GPU machine lacks) installed for Python 3.12 into sgl-site/ and site/
#                    (+ $SGL_TOOL's sitecustomize.py in sgl-sc/), one zstd stream cut into .peer/01 ... (58 MiB each,
#                    one device call each: `mkdir -p /tmp/peer-parts && cp .peer/NN/* /tmp/peer-parts/`)
#          setup     there: join /tmp/peer-parts, unpack into /tmp/sgl-site, /tmp/site, /tmp/sgl-sc
#          data      the addition prompts as verl's parquet ($ROOT/data; benchmarks/gpu/verl_addition.py)
#          warm      the shared start: slime_hydra's SFT warm start of the torch experiment from its random init, one GRPO
#                    rollout, saved as an HF directory ($ROOT/warm/checkpoints/rollout_000000); both peers start there
#          verl      verl's GRPO trainer (FSDP actor, SGLang rollout, colocated; verl_addition.py overrides)
#          torch     slime_hydra's grpo/qwen3-0.6b-addition-1n1g-torch-sglang-colocate-v1, warm start off
#          megatron  slime_hydra's grpo/qwen3-0.6b-addition-1n1g-megatron-sglang-colocate-v1, warm start off
#          report    benchmarks/gpu/peer_report.py over $ROOT -> $OUT/report.md, report.json, logs.tgz
#          all       setup data warm torch verl megatron report, each run capped so that all end by DEADLINE_S
#          dry       here, on the CPU: data, warm and torch on the tiny model (local rollout), `verl_addition.py check`
#                    for verl (its config, dataset, prompt tokens and reward; verl's workers need a GPU), report
# Env: ROOT (/tmp/peer_verl), STEPS (15), DEADLINE_S (570: seconds after this script starts by which the runs end;
# a run that would get less than its floor is skipped and says so).
# Time (H200, 2026-12-05): setup 26 s, warm 71 s, torch 162 s for 12 rollouts (143 s of it start-up); verl had not
# finished its first step 222 s after launch (~185 s of start-up: Ray, the FSDP actor, SGLang's server and CUDA
# graphs). So `all` fits slime_hydra in one 600 s call but not verl too; on a warm machine, two calls in a row do:
#   STEPS=12 bash benchmarks/gpu/peer_verl.sh setup data warm verl     then     bash benchmarks/gpu/peer_verl.sh torch report
set -uo pipefail
ROOT=${ROOT:-/tmp/peer_verl}
STEPS=${STEPS:-15}
DEADLINE_S=${DEADLINE_S:-570}
SGL_TOOL=${SGL_TOOL:-../shared/tools/sglang-h200}
TOR=grpo/qwen3-0.6b-addition-1n1g-torch-sglang-colocate-v1
MEG=grpo/qwen3-0.6b-addition-1n1g-megatron-sglang-colocate-v1
CKPT=$ROOT/warm/checkpoints/rollout_000000
# the same task and measurement for both slime_hydra runs; no mlflow on the GPU machine: drop the sweep callback
SLIME="reward=exact_match eval=none logger=tensorboard logger.progress_bar=false ~hydra.callbacks.mlflow_sweep"
PEER_WHEELS="verl==0.9.1 ray==2.60.0 codetiming==1.4.0 pylatexenc==2.11 torchdata==0.11.0 tensordict==0.10.0 pyvers==0.1.0
  cachetools==8.0.2 importlib_metadata==10.2.0 datasets==5.2.0 hydra-core==1.3.8 omegaconf==2.3.1 math-verify==0.9.0
  latex2sympy2_extended==1.11.0 megatron-core==0.16.1"
export PYTHONPATH=/tmp/sgl-site:/tmp/sgl-sc:/tmp/site:$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false \
  RAY_AUTH_MODE=disabled NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$ROOT"
log() { echo "[$(date +%T) +${SECONDS}s] $*" | tee -a "$ROOT/progress.log"; }

gpu_free() {  # end what a run left on the GPU (this script's own children: sglang schedulers, ray workers), by pid
  local p
  for p in $(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
  sleep 2
}

capped() {  # capped NAME FLOOR CAP CMD...: run CMD into $ROOT/NAME/run.log for min(CAP, time left) seconds
  local name=$1 floor=$2 cap=$3 left start rc; shift 3
  left=$((DEADLINE_S - SECONDS - 25))
  [ "$left" -lt "$cap" ] && cap=$left
  if [ "$cap" -lt "$floor" ]; then log "$name: skipped, ${cap}s left (needs ${floor}s)"; return 0; fi
  rm -rf "$ROOT/$name"; mkdir -p "$ROOT/$name"
  log "$name (cap ${cap}s): $*"
  start=$(date +%s.%N)
  timeout --signal=INT --kill-after=20 "$cap" "$@" > "$ROOT/$name/run.log" 2>&1
  rc=$?
  printf '{"start": %s, "end": %s, "rc": %d}\n' "$start" "$(date +%s.%N)" "$rc" > "$ROOT/$name/launch.json"
  log "$name: exit $rc"
  [ "$rc" -ne 0 ] && tail -25 "$ROOT/$name/run.log"
  gpu_free
  return 0
}

part() {
  case $1 in
    pack)
      local dl=.peer/dl st=.peer/stage plat
      plat="--platform manylinux2014_x86_64 --platform manylinux1_x86_64 $(printf -- '--platform manylinux_2_%s_x86_64 ' \
        17 24 26 27 28 31 34 5)"
      grep -qx '/.peer/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo '/.peer/' >> .git/info/exclude; }
      rm -rf .peer && mkdir -p $dl/sgl $dl/peer $st/sgl-sc
      python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $plat \
        -d $dl/sgl -r "$SGL_TOOL/wheels.txt" || return 3
      python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $plat \
        -d $dl/peer $PEER_WHEELS || return 3
      python3 -m pip wheel -q --no-deps -w $dl/peer antlr4-python3-runtime==4.9.3 || return 3  # no wheel on PyPI
      # installed here as the GPU machine's Python 3.12 would (pip --target: the same files), then one zstd stream:
      # 0.6 GB of wheels -> 0.4 GB (the wheels' per-file deflate leaves much of sgl_kernel's 1.1 GB flash_ops to it)
      python3 -m pip install -q --no-deps --no-compile --no-index --ignore-requires-python --only-binary=:all: \
        --python-version 3.12 --implementation cp $plat --target $st/sgl-site $dl/sgl/*.whl || return 3
      python3 -m pip install -q --no-deps --no-compile --no-index --ignore-requires-python --only-binary=:all: \
        --python-version 3.12 --implementation cp $plat --target $st/site $dl/peer/*.whl || return 3
      rm -rf $st/site/ray/jars  # Ray's Java worker (33 MB; Python workers never load it)
      cp "$SGL_TOOL/sitecustomize.py" $st/sgl-sc/
      tar -C $st -cf - . | zstd -q -T2 -6 --long=27 | split -b 58M -d -a 2 - .peer/part.
      local i=1 f
      for f in .peer/part.*; do mkdir -p ".peer/$(printf %02d $i)"; mv "$f" ".peer/$(printf %02d $i)/"; i=$((i + 1)); done
      cp $dl/sgl/zstandard-*.whl ".peer/$(printf %02d $((i - 1)))/"  # the decompressor, in the last call's folder
      rm -rf $dl $st; du -sh .peer/*
      echo "carry .peer/01 ... in turn: mkdir -p /tmp/peer-parts && cp .peer/NN/* /tmp/peer-parts/" ;;
    setup)
      local t0=$SECONDS
      if ! [ -f /tmp/sgl-site/sglang/version.py ] || ! [ -d /tmp/site/verl ]; then
        python3 -m zipfile -e /tmp/peer-parts/zstandard-*.whl /tmp/peer-zstd || return 3
        cat /tmp/peer-parts/part.* | PYTHONPATH=/tmp/peer-zstd python3 -c "import sys, zstandard
zstandard.ZstdDecompressor(max_window_size=2**31).copy_stream(sys.stdin.buffer, sys.stdout.buffer)" | tar xf - -C /tmp \
          || return 3
      fi
      nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader
      python3 -c "import torch, transformers, sglang, verl, ray; print('torch', torch.__version__, 'transformers', \
transformers.__version__, 'sglang', sglang.__version__, 'verl', verl.__version__, 'ray', ray.__version__)" || return 3
      log "setup: $((SECONDS - t0)) s" ;;
    data) python3 benchmarks/gpu/verl_addition.py data "$ROOT/data" | tee -a "$ROOT/progress.log" ;;
    warm) capped warm 60 240 python3 -m slime_hydra experiment=$TOR model.hf_checkpoint=null num_rollout=1 $SLIME \
            save_interval=1 rollout=local ${DRY:-} ${DRY_WARM:-} output_dir="$ROOT/warm" ;;
    verl)
      local v
      mapfile -t v < <(python3 benchmarks/gpu/verl_addition.py overrides "$CKPT" "$ROOT/data" "$ROOT/verl" "$STEPS")
      export VERL_FILE_LOGGER_PATH=$ROOT/verl/metrics.jsonl
      capped verl 120 450 python3 -m verl.trainer.main_ppo "${v[@]}" ;;
    torch) capped torch 90 200 python3 -m slime_hydra experiment=$TOR model.hf_checkpoint="$CKPT" warmstart.steps=0 \
             num_rollout="$STEPS" $SLIME save_interval=null ${DRY:-} output_dir="$ROOT/torch" ;;
    megatron) capped megatron 120 220 python3 -m slime_hydra experiment=$MEG model.hf_checkpoint="$CKPT" \
                warmstart.steps=0 num_rollout="$STEPS" $SLIME save_interval=null output_dir="$ROOT/megatron" ;;
    report)
      local out=${OUT:-/tmp/out}
      mkdir -p "$out"
      python3 benchmarks/gpu/peer_report.py "$ROOT" --json "$out/report.json" > "$out/report.md" 2> "$out/report.err"
      cp "$ROOT/progress.log" "$out/" 2>/dev/null
      (cd "$ROOT" && tar czf "$out/logs.tgz" --exclude='*.safetensors' --exclude='*.pt' --exclude='*.parquet' \
        */run.log */launch.json verl/metrics.jsonl */composed_config.yaml */tensorboard 2>/dev/null)
      cat "$out/report.md" "$out/report.err" ;;
    dry)  # here, on the CPU: the same parts on the tiny model with local rollout; verl's part checks what it can
      # without a GPU (benchmarks/gpu/verl_addition.py check: its config, model config, dataset, prompt tokens, reward)
      export DRY="model=qwen3_tiny cluster.device=cpu rollout=local" PYTHONPATH=${DRY_PYTHONPATH:-$PYTHONPATH} \
        DRY_WARM="warmstart.steps=40 warmstart.min_steps=20 warmstart.check_interval=20"
      part data && part warm && python3 benchmarks/gpu/verl_addition.py check "$CKPT" "$ROOT/data" && part torch \
        && OUT=$ROOT/out part report ;;
    all) for p in setup data warm torch verl megatron report; do part $p || { log "$p failed: $?"; [ $p = setup ] && return 3; }; done ;;
    *) echo "unknown part $1"; return 2 ;;
  esac
}

for p in "$@"; do part "$p" || exit $?; done
