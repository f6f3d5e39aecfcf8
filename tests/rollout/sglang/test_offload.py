"""cluster.offload_train with real SGLang engines on CPU, colocated (the shipped CPU experiment's layout): the engines
start while the trainer is released, every generation runs with it released, every sync is checked equal on the
engines, and what the rollout keeps for a restarted engine's resync is a host copy, not the trainer's own tensors.
One engine of the experiment's two (what is released and resumed does not depend on their number), behind the test
process's shared router (tests/support/servers.py): the run starts its engine and registers it there."""

from __future__ import annotations

import pytest

from slime_hydra.app.preflight import compose_run

pytestmark = [pytest.mark.sglang, pytest.mark.integration]


def test_engines_start_and_generate_beside_a_released_trainer(tmp_path, external_router):
    from slime_hydra.app.build import build
    from slime_hydra.app.session import loop_settings
    from slime_hydra.engine import loop

    cfg = compose_run(["experiment=grpo/qwen3-tiny-addition-cpu-sglang-torch-v1", "num_rollout=2", "warmstart=none",
                       "eval.eval_interval=null", "logger=none", "logger.progress_bar=false", "rollout.rollout_batch_size=8",
                       "cluster.offload_train=true", "rollout.check_weight_update_equal=true", "cluster.rollout_num_gpus=1",
                       *external_router.overrides])
    c = build(cfg, str(tmp_path))
    try:
        assert (c.trainer.offload.releases, c.trainer.offload.resumes) == (1, 1)  # around the engines' start
        history = loop.run(loop_settings(cfg), c, str(tmp_path / "ckpt"))
        kept = dict(c.rollout._last_weights.tensors)
    finally:
        c.rollout.shutdown()
    # then two rollouts and the evals before and after them: four more
    assert (c.trainer.offload.releases, c.trainer.offload.resumes) == (5, 5) and not c.trainer.offload.released
    assert [step for step, _ in history] == [0, 1, 2] and all("perf/offload_gib" in m for step, m in history if step)
    assert kept.keys() == dict(c.trainer.named_weights()).keys()
    ours = {p.untyped_storage().data_ptr() for p in c.trainer.model.parameters()}
    assert not any(t.untyped_storage().data_ptr() in ours for t in kept.values())
