"""rollout.custom_update_weight_post_write (slime's --custom-update-weight-post-write-path) with weight_sync=disk through a
real SGLang CPU engine: the hook runs after each sync's files are written, with the directory and the version, and the
engine then loads those files (every sync checked equal to the trainer's weights)."""

from __future__ import annotations

import json

import pytest

EXPERIMENT = "experiment=grpo/qwen3-tiny-addition-cpu-sglang-torch-v1"
SHORT = ["logger=none", "logger.progress_bar=false", "eval.eval_interval=null", "eval.skip_eval_before_train=true",
         "cluster.device=cpu", "cluster.rollout_num_gpus=1", "cluster.colocate=true", "warmstart.steps=0",
         "rollout.rollout_batch_size=8", "rollout.n_samples_per_prompt=4", "train.micro_batch_size=16",
         "rollout.use_fault_tolerance=false", "rollout.check_weight_update_equal=true", "rollout.weight_sync=disk",
         "num_rollout=1"]


@pytest.mark.sglang
@pytest.mark.integration
def test_the_post_write_hook_runs_after_each_disk_sync(tmp_path, external_engine, external_router):
    """The engine (the test process's shared one behind its shared router, attached: reset to the model's files, as an
    engine the run starts loads them, with no hook) takes version 0 (before the first rollout) and version 1 (after it) from disk: the hook
    saw both, each time with the one safetensors file the engine then loaded."""
    from slime_hydra.app.preflight import compose_run
    from slime_hydra.app.session import run_session

    record = tmp_path / "post_write.jsonl"
    args = [EXPERIMENT, *SHORT, external_engine.override, *external_router.overrides, "++rollout.custom_update_weight_post_write={_target_:"
            f"tests.support.step_hooks.record_post_write,path:'{record}'}}"]
    run_session(compose_run(args), str(tmp_path / "run"), args)
    got = [json.loads(line) for line in record.read_text().splitlines()]
    assert got == [{"version": 0, "files": ["model.safetensors"]}, {"version": 1, "files": ["model.safetensors"]}]
