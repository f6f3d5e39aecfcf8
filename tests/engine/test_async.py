"""train_mode=async: validation, and a real run killed with SIGKILL after a checkpoint, then resumed with load=.

The killed-and-resumed run must train exactly the rollouts an uninterrupted run trains (async_buffer_size=1
makes the schedule independent of thread timing) and, with the buffer holding returned groups at the
checkpoint, consume every prompt exactly once: each group index the source handed out is trained once or is
still in the final buffer, never both, never twice.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from slime_hydra.app.preflight import compose_run
from slime_hydra.errors import ConfigError
from tests.support.runs import FAST, start_cli


def test_async_turns_on_rollout_logprobs_and_checks_its_keys():
    cfg = compose_run(["train_mode=async"])
    assert cfg.algorithm.use_rollout_logprobs  # the ratio is against the weights that generated the tokens
    assert not compose_run(["train_mode=async", "algorithm.use_tis=true"]).algorithm.use_rollout_logprobs
    assert not compose_run([]).algorithm.use_rollout_logprobs
    with pytest.raises(ConfigError) as info:
        compose_run(["train_mode=later", "async_buffer_size=0", "rollout.mask_offpolicy_in_partial_rollout=true",
                     "update_weights_interval=0"])
    text = "\n".join(info.value.problems)
    for key in ("train_mode='later' is not one of ['sync', 'async']", "async_buffer_size=0 must be >= 1",
                "update_weights_interval=0 must be >= 1", "set rollout.partial_rollout=true"):
        assert key in text, text


def test_num_epoch_derives_num_rollout():
    cfg = compose_run(["num_rollout=null", "num_epoch=2", "rollout.rollout_batch_size=100", "train.micro_batch_size=8"])
    assert cfg.num_rollout == 2 * 7900 // 100  # the shipped training set has 7,900 prompts
    assert cfg.rollout.over_sampling_batch_size == 100  # null means rollout_batch_size


ARGS = FAST + ["logger=none", "train_mode=async", "num_rollout=10", "save_interval=2", "seed=11",
               "rollout.over_sampling_batch_size=12", "rollout.partial_rollout=true", "rollout.rollout_max_response_len=8",
               "rollout.rollout_stop_token_ids=[4,5,6,7,8,9,10,11,12,13]", "eval=none"]


def start(work: Path, name: str, extra: list[str]):
    """The CLI started, its output appended to work/<name>.log."""
    args = ARGS + [f"save={work}/{name}_ckpt", f"hydra.run.dir={work}/{name}",
                   f"save_debug_rollout_data={work}/{name}_rollouts", *extra]
    return start_cli(args, work, log=work / f"{name}.log")


def trained(rollouts: Path) -> dict[int, list[tuple]]:
    out = {}
    for f in sorted(rollouts.glob("*.jsonl")):
        rows = [json.loads(line) for line in f.read_text().splitlines()][1:]  # line 1: the dump's header
        out[int(f.stem.split("_")[1])] = [(r["group_index"], r["index"], r["prompt"], r["response"], r["reward"], r["weight_version"])
                            for r in rows if r["kept"]]
    return out


@pytest.fixture(scope="module")
def killed_and_resumed(tmp_path_factory):
    work = tmp_path_factory.mktemp("async_resume")
    ref = start(work, "ref", [])
    victim = start(work, "run", [])
    latest = work / "run_ckpt" / "latest"
    deadline = time.time() + 300
    while not (latest.is_file() and latest.read_text().strip() == "rollout_000003"):
        assert victim.poll() is None, (work / "run.log").read_text()[-3000:]
        assert time.time() < deadline
        time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)  # mid-run: rollout 4 is generating or training
    victim.wait()
    resumed = start(work, "run", [f"load={work}/run_ckpt"])
    for p, name in ((ref, "ref"), (resumed, "run")):
        p.wait(timeout=300)
        assert p.returncode == 0, (work / f"{name}.log").read_text()[-3000:]
    return work


@pytest.mark.integration
def test_killed_async_run_resumes_exactly(killed_and_resumed):
    work = killed_and_resumed
    ref, run = trained(work / "ref_rollouts"), trained(work / "run_rollouts")
    assert sorted(run) == sorted(ref) == list(range(10))
    assert run == ref  # the same groups, responses, rewards and weight versions, rollout by rollout


@pytest.mark.integration
def test_killed_async_run_consumes_every_prompt_exactly_once(killed_and_resumed):
    from slime_hydra.data.dataset import load_prompts
    from slime_hydra.data.source import PromptSource
    from slime_hydra.engine.checkpoint import load_state
    from slime_hydra.models.build import build_tokenizer

    work = killed_and_resumed
    at_checkpoint = load_state(work / "run_ckpt" / "rollout_000003")
    assert len(at_checkpoint["buffer"]["groups"]) > 0 and len(at_checkpoint["async_ready"]) == 1  # what was resumed
    final = load_state(work / "run_ckpt" / "rollout_000009")
    served = final["buffer"]["source"]["next_group_index"]
    waiting = [g[0]["group_index"] for g in final["buffer"]["groups"]]
    groups = [(row[0], row[2]) for rows in trained(work / "run_rollouts").values() for row in rows[:: 4]]
    ids = [g for g, _ in groups] + waiting
    assert sorted(ids) == list(range(served))  # each group the source handed out: trained once or still waiting
    cfg = compose_run(ARGS)
    prompts = load_prompts(cfg.data.prompt_data, build_tokenizer(cfg.model), input_key="prompt", label_key="label")
    order = PromptSource(prompts, 4, True, cfg.rollout.rollout_seed)._epoch_order(0)
    assert all(prompt == prompts[order[g]].prompt for g, prompt in groups)  # group g is the g-th prompt of the epoch
    assert len({p for _, p in groups}) == len(groups) == 10 * 8


@pytest.mark.integration
def test_async_rollout_rate_is_over_the_generation_time(killed_and_resumed):
    """A rollout generated ahead leaves only a wait in the step (perf/rollout_time_s), so its rate is over the
    worker's generation time: rate x perf/rollout_generate_s = the response tokens trained that rollout."""
    from slime_hydra.engine.checkpoint import load_state

    work = killed_and_resumed
    history = load_state(work / "ref_ckpt" / "rollout_000009")["history"]
    tokens = {}
    for f in sorted((work / "ref_rollouts").glob("*.jsonl")):
        rows = [json.loads(line) for line in f.read_text().splitlines()][1:]  # line 1: the dump's header
        tokens[int(f.stem.split("_")[1]) + 1] = sum(r["response_length"] for r in rows if r["kept"])
    assert sorted(step for step, _ in history) == sorted(tokens) == list(range(1, 11))
    for step, m in history:
        assert m["perf/rollout_tokens_per_s"] * m["perf/rollout_generate_s"] == pytest.approx(tokens[step], rel=1e-6)
