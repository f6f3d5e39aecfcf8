#!/usr/bin/env bash
# The memory-release check on one GPU, in one command: install sglang 0.5.17 (from .sgl/10/install.sh unless already
# installed) and the project's pure-Python wheels (.gpuwhl), then check that a generation after a memory release with
# no weight sync since re-sends the last synced weights: the torch 0.6B experiment with the engine's memory released
# around every generation, an eval every 2 rollouts, so rollouts 1 and 3 each follow an eval (release, no sync) and
# rollouts 2 and 4 follow a sync. Pass: rollouts 1 and 3 answer like 2 and 4 (reward > 0, responses below the 6-token
# cap), not all at the cap with reward 0 (what a release without the re-send gives).
# Cut to fit a short time limit: no random-checkpoint step (model.hf_checkpoint=null: the trainer's random init is
# what the engine loads), no CUDA graphs, a warm start of 100-240 steps.
#   usage (repo root, on the GPU machine): bash benchmarks/gpu/offload_check.sh [SECONDS]
set -uo pipefail
t0=$SECONDS
ROOT=${ROOT:-/tmp/experiment_curves}
OUTD=${OUT:-/tmp/out}
mkdir -p "$ROOT" "$OUTD"
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
if ! [ -f /tmp/sgl-site/sglang/version.py ]; then bash .sgl/10/install.sh || exit 3; fi
[ -d /tmp/site/hydra ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpuwhl/*.whl || exit 3
mlflow_stub
export PYTHONPATH=/tmp/sgl-site:/tmp/sgl-sc:/tmp/site:$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false RAY_AUTH_MODE=disabled
echo "setup: $((SECONDS - t0)) s"
dir=$ROOT/offload
rm -rf "$dir"; mkdir -p "$dir"
start=$(date +%s.%N)
set -x
timeout "${1:-300}" python3 -m slime_hydra experiment=grpo/qwen3-0.6b-addition-1n1g-torch-sglang-colocate-v1 \
  model.hf_checkpoint=null cluster.offload_rollout=true +rollout.sglang.enable_memory_saver=true \
  +rollout.sglang.disable_cuda_graph=true num_rollout=4 eval.eval_interval=2 save_interval=null \
  rollout.check_weight_update_equal=true warmstart.steps=240 warmstart.min_steps=100 warmstart.target_train_accuracy=0.1 \
  logger=tensorboard logger.progress_bar=false output_dir="$dir" > "$dir/run.log" 2>&1
rc=$?
set +x
printf '{"start": %s, "end": %s, "rc": %d}\n' "$start" "$(date +%s.%N)" "$rc" > "$dir/launch.json"
echo "offload run: exit $rc, $((SECONDS - t0)) s since the call began"
python3 benchmarks/gpu/experiment_report.py "$ROOT" --json "$OUTD/report.json" > "$OUTD/report.md" 2> "$OUTD/report.err"
cp "$dir/run.log" "$OUTD/" 2>/dev/null
find "$dir" -name '*.log' -path '*sglang*' -exec tail -n 40 {} \; > "$OUTD/engine_tail.log" 2>/dev/null
python3 - "$OUTD/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])).get("offload", {})
print({k: v for k, v in r.items() if k not in ("table",)})
for s, row in r.get("table", {}).items():
    print(s, {k.split("/")[-1]: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items() if v is not None})
PY
grep -E "eval/|warmstart|error|Error|Traceback" "$dir/run.log" | tail -n 30
tail -n 15 "$dir/run.log"
