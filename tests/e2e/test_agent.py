"""The calculator agent end to end through the CLI: a short run logs the agent metrics (default tier);
the full experiment learns to use the tool, far above the same model without it (slow)."""

from __future__ import annotations

import json

import pytest

from tests.support.runs import run_cli

pytestmark = pytest.mark.integration  # starts Ray, SGLang servers, megatron ranks or whole runs: not in `make test-fast`

EXPERIMENT = "experiment=agent/qwen3-tiny-calculator-cpu-local-torch-v1"


def summary(workdir, args: list[str]) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    proc = run_cli([EXPERIMENT, "logger=none", "logger.progress_bar=false", f"hydra.run.dir={workdir}/run", *args], workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((workdir / "run" / "summary.json").read_text())


def test_short_agent_run_logs_turns_tool_calls_errors_and_masked_share(workdir):
    s = summary(workdir, ["num_rollout=2", "warmstart.steps=25", "rollout.rollout_batch_size=4", "rollout.n_samples_per_prompt=4",
                          "train.micro_batch_size=16", "eval.eval_interval=null"])
    for key in ("turns_mean", "tool_calls_mean", "tool_error_rate", "masked_token_frac"):
        assert f"rollout/{key}" in s and f"eval/multiplication/{key}" in s
    # after the format warm start the model calls the tool, so observations (masked) are part of every response
    assert s["eval/multiplication/tool_calls_mean"]["last"] > 0.5
    assert 0.1 < s["rollout/masked_token_frac"]["first"] < 0.6
    assert 1.0 <= s["rollout/turns_mean"]["first"] <= 2.0


@pytest.mark.slow
def test_calculator_agent_learns_and_beats_the_no_tool_model(workdir):
    with_tool = summary(workdir / "tool", [])
    acc = with_tool["eval/multiplication/accuracy"]
    assert acc["first"] < 0.5 and acc["last"] > acc["first"] + 0.3, acc
    # the same warm start and RL with the tool never executed (max_turns=1): the model cannot multiply
    no_tool = summary(workdir / "no_tool", ["rollout.max_turns=1"])
    assert no_tool["eval/multiplication/accuracy"]["max"] < 0.05
    # warm start on direct answers instead (label + eos), RL without the tool
    direct = summary(workdir / "direct", ["rollout.max_turns=1", "warmstart.custom_sft_samples._target_=slime_hydra.engine.warmstart.sft_samples"])
    assert direct["eval/multiplication/accuracy"]["max"] < 0.05
    assert acc["last"] > 0.5
