#!/usr/bin/env bash
# The shipped 1n1g experiments (megatron and torch) through the CLI on one GPU, as detached parts: 40 rollouts each
# (save every 20, every weight sync checked, held-out eval every 10), each resumed from its rollout-20 checkpoint to
# 40, then a short torch run with the engine's memory released around training (a generation after a release with no
# sync since must re-send the last synced weights).
#   usage: bash benchmarks/gpu/experiment_curves.sh PART...   (from the repo root, on the GPU machine)
#   parts: setup       pip-install .gpuwhl and .whl into /tmp/site (and sglang from .sgl/10 when present)
#          ckpt        the random HF checkpoint the experiments' model.hf_checkpoint names
#          megatron | megatron-resume | torch | torch-resume | offload    one run each, into $ROOT/<part>
#          ray | local | ray-resume   the megatron experiment under cluster.backend=ray and in one process
#                      (20 rollouts, a short warm start, save every 10, every sync checked), the ray run resumed from 10
#          mix         the length-mix bench rows: benchmarks/gpu/length_mix.sh into $ROOT/mix
#          megatron-thd | torch-thd   the 40-rollout runs with packed micro-batches by a token budget
#                      ($PACK), beside the bshd runs `megatron` and `torch` for the learning curves
#          waitckpt    until the ckpt part has written the checkpoint (a second chain's first part)
#          gputest     pytest -m gpu tests/training/test_packing_gpu.py into $ROOT/gputest.log
# Every run is stopped after RUN_CAP_S seconds (default 900; SIGINT, then SIGKILL 30 s later).
#          report      benchmarks/gpu/experiment_report.py over $ROOT -> $ROOT/report.json, report.md
#          bg PART...  the parts in order, detached (setsid), progress in $ROOT/progress.log; CHAIN=b bg PART... starts a
#                      second chain beside the first (both share the GPU); `wait` waits for every chain
#          wait S      until the detached parts finish or S seconds pass; then report, and logs to $OUT
# The parts run detached so that a shell with a time limit per command can start them and collect them with `wait`;
# they need /tmp to survive between those commands.
# sglang 0.5.17 must be importable: installed beforehand, or by `setup` from .sgl/10/install.sh when that file exists.
set -uo pipefail
ROOT=${ROOT:-/tmp/experiment_curves}
MEG=grpo/qwen3-0.6b-addition-1n1g-megatron-sglang-colocate-v1
TOR=grpo/qwen3-0.6b-addition-1n1g-torch-sglang-colocate-v1
COMMON="num_rollout=40 save_interval=20 rollout.check_weight_update_equal=true logger=tensorboard logger.progress_bar=false"
SHORT="model.hf_checkpoint=$PWD/outputs/hf/qwen3-0.6b-char-random-seed1234 num_rollout=20 save_interval=10 eval.eval_interval=10 warmstart.steps=200 warmstart.min_steps=200 rollout.check_weight_update_equal=true logger=tensorboard logger.progress_bar=false"
PACK="train.qkv_format=thd train.use_dynamic_batch_size=true train.max_tokens_per_gpu=8192"
CKPT=$PWD/outputs/hf/qwen3-0.6b-char-random-seed1234
mkdir -p "$ROOT"
export PYTHONPATH=/tmp/sgl-site:/tmp/sgl-sc:/tmp/site:$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false

# Every run imports mlflow at Hydra start (conf/config.yaml's hydra.callbacks.mlflow_sweep -> orchestration/sweep.py
# -> tracking/mlflow_tracker.py): on a machine without mlflow a run stops in 9 s with "Error locating target
# 'slime_hydra.orchestration.sweep.MlflowSweepCallback'". These runs log to TensorBoard, so an import-only stand-in
# does (the names mlflow_tracker.py imports, nothing else).
mlflow_stub() {
  python3 -c "import mlflow" 2>/dev/null && return 0
  local s=/tmp/site/mlflow
  mkdir -p "$s/tracking" && touch "$s/__init__.py" \
    && printf 'class Metric: pass\nclass Param: pass\nclass RunTag: pass\n' > "$s/entities.py" \
    && printf 'class MlflowException(Exception): pass\n' > "$s/exceptions.py" \
    && printf 'class MlflowClient: pass\n' > "$s/tracking/__init__.py"
}

run() {  # run NAME overrides...: one CLI run into $ROOT/NAME, its launch time and exit code in launch.json
  local name=$1; shift
  local dir=$ROOT/$name start rc
  rm -rf "$dir"; mkdir -p "$dir"
  start=$(date +%s.%N)
  echo "[$(date +%T)] $name: python3 -m slime_hydra $* output_dir=$dir" | tee -a "$ROOT/progress.log"
  timeout --signal=INT --kill-after=30 "${RUN_CAP_S:-900}" python3 -m slime_hydra "$@" output_dir="$dir" > "$dir/run.log" 2>&1
  rc=$?
  printf '{"start": %s, "end": %s, "rc": %d}\n' "$start" "$(date +%s.%N)" "$rc" > "$dir/launch.json"
  echo "[$(date +%T)] $name: exit $rc" | tee -a "$ROOT/progress.log"
  return $rc
}

part() {
  case $1 in
    setup)
      [ -d /tmp/site/hydra ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpuwhl/*.whl $(ls .whl/*.whl 2>/dev/null) || return 3  # .whl (megatron-core): megatron runs only
      mlflow_stub
      if ! [ -f /tmp/sgl-site/sglang/version.py ] && [ -f .sgl/10/install.sh ]; then bash .sgl/10/install.sh || return 3; fi ;;
    ckpt)
      local t0=$SECONDS
      python3 -m slime_hydra.models.random_checkpoint experiment=$MEG > "$ROOT/ckpt.log" 2>&1
      echo "[$(date +%T)] ckpt: exit $? in $((SECONDS - t0)) s" | tee -a "$ROOT/progress.log" ;;
    megatron) run megatron experiment=$MEG $COMMON ;;
    megatron-resume) run megatron-resume experiment=$MEG $COMMON load=$ROOT/megatron/checkpoints/rollout_000019 ;;
    torch) run torch experiment=$TOR $COMMON ;;
    megatron-thd) run megatron-thd experiment=$MEG $COMMON $PACK ;;
    torch-thd) run torch-thd experiment=$TOR $COMMON $PACK ;;
    waitckpt)
      local t0=$SECONDS
      until [ -f "$CKPT/model.safetensors" ] && grep -q "ckpt: exit" "$ROOT/progress.log" 2>/dev/null; do
        [ $((SECONDS - t0)) -gt 300 ] && { echo "[$(date +%T)] waitckpt: no checkpoint after 300 s" | tee -a "$ROOT/progress.log"; return 1; }
        sleep 2
      done ;;
    gputest)
      python3 -m pytest -q -m gpu -p no:cacheprovider tests/training/test_packing_gpu.py > "$ROOT/gputest.log" 2>&1
      echo "[$(date +%T)] gputest: exit $?" | tee -a "$ROOT/progress.log"; tail -5 "$ROOT/gputest.log" ;;
    torch-resume) run torch-resume experiment=$TOR $COMMON load=$ROOT/torch/checkpoints/rollout_000019 ;;
    offload)  # from the torch run's rollout-20 checkpoint (no warm start): 6 rollouts, an eval every 2
      run offload experiment=$TOR cluster.offload_rollout=true +rollout.sglang.enable_memory_saver=true \
        num_rollout=26 eval.eval_interval=2 save_interval=null rollout.check_weight_update_equal=true logger=tensorboard \
        logger.progress_bar=false load=$ROOT/torch/checkpoints/rollout_000019 ;;
    ray) run ray experiment=$MEG cluster.backend=ray $SHORT ;;
    local) run local experiment=$MEG $SHORT ;;
    ray-resume) run ray-resume experiment=$MEG cluster.backend=ray $SHORT load=$ROOT/ray/checkpoints/rollout_000009 ;;
    mix)  # the length-mix bench rows (benchmarks/gpu/length_mix.sh), results into $ROOT/mix
      mkdir -p "$ROOT/mix"; OUT=$ROOT/mix bash benchmarks/gpu/length_mix.sh > "$ROOT/mix/run.log" 2>&1
      echo "[$(date +%T)] mix: exit $?" | tee -a "$ROOT/progress.log" ;;
    report)
      python3 benchmarks/gpu/experiment_report.py "$ROOT" --resumed-at "${RESUMED_AT:-20}" --json "$ROOT/report.json" > "$ROOT/report.md" 2> "$ROOT/report.err"
      echo "[$(date +%T)] report: exit $?" | tee -a "$ROOT/progress.log" ;;
    slim)  # after both megatron runs are read: drop the big checkpoint files (the state files with the history stay)
      rm -rf "$ROOT"/megatron*/checkpoints/rollout_*/megatron "$ROOT"/megatron*/checkpoints/rollout_*/model.safetensors ;;
    *) echo "unknown part $1"; return 2 ;;
  esac
}

case ${1:-} in
  bg)
    shift
    rm -f "$ROOT/done${CHAIN:-}"
    setsid bash -c "for p in $*; do bash $0 \$p; done; touch $ROOT/done${CHAIN:-}" > "$ROOT/bg${CHAIN:-}.log" 2>&1 < /dev/null &
    echo $! > "$ROOT/bg${CHAIN:-}.pid"
    echo "started: $*" ;;
  wait)  # a machine whose /tmp was wiped has no bg.pid, so this returns at once
    limit=${2:-540}
    [ -f "$ROOT/bg.pid" ] || echo "no detached parts on this machine (a fresh one? /tmp is empty)"
    running() { local f; for f in "$ROOT"/bg*.pid; do [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && return 0; done; return 1; }
    while running && [ $SECONDS -lt "$limit" ]; do sleep 5; done
    part report
    out=${OUT:-/tmp/out}; mkdir -p "$out"
    cp "$ROOT/progress.log" "$ROOT/report.md" "$ROOT/report.json" "$ROOT/gputest.log" "$out/" 2>/dev/null
    [ -d "$ROOT/mix" ] && (cd "$ROOT" && tar czf "$out/mix.tgz" mix)
    nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader; df -h /tmp | tail -1
    # every run's log, its sglang engine log's tail, composed config (no weights)
    (cd "$ROOT" && tar czf "$out/logs.tgz" --exclude='*.safetensors' --exclude='*.pt' \
      ckpt.log bg*.log */run.log */launch.json */composed_config.yaml */sglang/logs 2>/dev/null)
    cat "$ROOT/progress.log"; tail -c 3000 "$ROOT/report.md"; cat "$ROOT/report.err"
    running && echo STILL-RUNNING || echo ALL-DONE ;;
  *)
    for p in "$@"; do part "$p"; done ;;
esac
