"""cluster.offload_train in the loop: the same run with and without it gives bit-identical metrics (perf/ timings and
the offload's own figures aside), for the torch trainer and for megatron with the distributed optimizer; the trainer is
released exactly around each generation the loop runs; a resume from a checkpoint of an offloading run is exact.

Runs go through app.build and engine.loop in this process, as the CLI's session runs them (cluster.backend=local, the
local engine; on CPU a release is a real move of every storage to another buffer and back: training/offload.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from slime_hydra.app.build import build
from slime_hydra.app.preflight import compose_run
from slime_hydra.app.session import loop_settings
from slime_hydra.engine import loop
from tests.support.runs import FAST

ARGS = FAST + ["logger=none", "num_rollout=3", "seed=5", "eval.eval_interval=2"]


def run(tmp: Path, name: str, *extra: str):
    """(history, the trainer) of one run in this process; its checkpoints under tmp/name."""
    cfg = compose_run([*ARGS, f"output_dir={tmp / name}", *extra])
    c = build(cfg, str(tmp / name))
    try:
        history = loop.run(loop_settings(cfg), c, str(tmp / name / "checkpoints"))
    finally:
        c.rollout.shutdown()
    return history, c.trainer


def numbers(history) -> list[tuple[int, dict[str, float]]]:
    return [(step, {k: v for k, v in m.items() if not k.startswith("perf/")}) for step, m in history]


def weights(trainer) -> list[torch.Tensor]:
    return [t.detach().clone() for _, t in trainer.named_weights()]


def test_offload_leaves_every_number_as_it_was_torch(tmp_path):
    """3 rollouts, evals at steps 0, 2 and 3: 3 + 3 generations, each with the trainer released and resumed once."""
    off_history, off = run(tmp_path, "off", "cluster.offload_train=false")
    on_history, on = run(tmp_path, "on", "cluster.offload_train=true")
    assert numbers(on_history) == numbers(off_history)
    assert all(torch.equal(a, b) for a, b in zip(weights(on), weights(off)))
    assert (on.offload.releases, on.offload.resumes) == (6, 6) and off.offload.releases == 0
    steps = [m for step, m in on_history if step > 0]
    # every rollout logs what moved: the fp32 policy's weights (4 bytes a parameter) before the first step, then its
    # gradients and AdamW's two moments too (and small extras: step counters, rotary buffers)
    params = sum(p.numel() for p in on.model.parameters())
    assert 4 * params <= steps[0]["perf/offload_gib"] * 2**30 < 5 * params
    assert all(16 * params <= m["perf/offload_gib"] * 2**30 < 17 * params for m in steps[1:])
    assert all("perf/offload_release_s" in m and "perf/offload_resume_s" in m for m in steps)
    assert not any(k.startswith("perf/offload") for _, m in off_history for k in m)


def test_a_resume_from_an_offloading_runs_checkpoint_is_exact(tmp_path):
    """The checkpoint after rollout 2 of an offloading run, resumed with offload, ends where the run ended."""
    full, trainer = run(tmp_path, "full", "cluster.offload_train=true", "save_interval=1")
    resumed, again = run(tmp_path, "resumed", "cluster.offload_train=true",
                         f"load={tmp_path / 'full' / 'checkpoints' / 'rollout_000001'}")
    assert numbers(resumed)[-1] == numbers(full)[-1] and resumed[-1][0] == 3
    assert all(torch.equal(a, b) for a, b in zip(weights(again), weights(trainer)))


@pytest.mark.integration
def test_offload_leaves_every_number_as_it_was_megatron(tmp_path):
    """megatron (CPU, gloo, one rank) with the distributed optimizer: its parameter and gradient buffers, fp32 main
    parameters and Adam's moments go and come back; the run's numbers are those of the run that keeps them."""
    from tests.support.megatron_cpu import shim

    shim.install()
    megatron = ["train=megatron", "parallelism.use_distributed_optimizer=true"]
    off_history, off = run(tmp_path, "off", *megatron, "cluster.offload_train=false")
    on_history, on = run(tmp_path, "on", *megatron, "cluster.offload_train=true")
    assert numbers(on_history) == numbers(off_history)
    assert all(torch.equal(a, b) for a, b in zip(weights(on), weights(off)))
    assert (on.offload.releases, on.offload.resumes) == (6, 6)
    # the embedded model is fp32: no main parameters; weights 4 + gradient buffer 4 + Adam 8 bytes a parameter
    params = sum(p.numel() for p in on.gpt.parameters())
    assert all(m["perf/offload_gib"] * 2**30 >= 16 * params for step, m in on_history if step > 1)
