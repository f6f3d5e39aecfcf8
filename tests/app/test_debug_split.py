"""slime's debug split: a run's rollout dump (save_debug_rollout_data) replayed into a train-only run
(load_debug_rollout_data) trains exactly as the run did; debug_rollout_only generates and dumps with no trainer;
bad dumps stop at start with exit 2 naming the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slime_hydra.app.preflight import compose_run
from slime_hydra.app.session import run_session
from slime_hydra.engine.checkpoint import load_state
from slime_hydra.errors import ConfigError, UserError
from tests.support.runs import FAST, run_cli

# 3 rollouts of 4 prompts × 4 samples, one optimizer step each (global batch 16), no eval; a warm start of 10
# fixed steps (a replay runs it too: the trainer starts where the dumped run's did)
ARGS = [a for a in FAST if not a.startswith(("rollout.rollout_batch_size", "warmstart"))] + [
    "rollout.rollout_batch_size=4", "logger=none", "seed=7", "num_rollout=3", "eval=none",
    "warmstart.target_train_accuracy=null", "warmstart.min_steps=0", "+reward.custom_rm._target_=tests.support.plugins.digit_reward"]


WARM = ["warmstart.steps=10"]


def run(tmp: Path, name: str, extra: list[str], base: list[str] = ARGS + WARM) -> tuple[Path, list[tuple[int, dict]]]:
    out = tmp / name
    run_session(compose_run(base + extra), str(out), extra)
    return out, load_state(out / "checkpoints" / "rollout_000002")["history"]


def dump_rows(path: Path) -> tuple[dict, list[dict]]:
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    return lines[0], lines[1:]


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("replay")
    out, history = run(tmp, "original", [f"save_debug_rollout_data={tmp}/dump"])
    return tmp, history


@pytest.mark.integration
def test_replay_trains_exactly_as_the_dumped_run(original):
    tmp, history = original
    header, rows = dump_rows(tmp / "dump" / "rollout_000001.jsonl")
    assert header["format"] == "slime_hydra.rollout_dump" and header["version"] == 2 and header["num_kept"] == 16
    assert all(len(r["rollout_log_probs"]) == r["response_length"] for r in rows)  # what the trainer needs is there
    out, replayed = run(tmp, "replayed", [f"load_debug_rollout_data={tmp}/dump"])
    assert [s for s, _ in replayed] == [s for s, _ in history] == [1, 2, 3]
    for (step, a), (_, b) in zip(history, replayed):
        train = {k: v for k, v in a.items() if k.startswith("train/")}
        assert len(train) >= 5 and train["train/grad_norm"] > 0, a  # it trained
        assert {k: b[k] for k in train} == train, f"rollout {step}: train metrics differ"
        rollout = {k: v for k, v in a.items() if k.startswith("rollout/") and not k.startswith("rollout/buffer")}
        assert {k: b[k] for k in rollout} == rollout, f"rollout {step}: rollout metrics differ"


def test_replay_of_a_glob_and_resume_of_a_replay(original):
    """A glob names the files; a replay resumed from its own checkpoint continues at the next dumped rollout."""
    tmp, history = original
    first, _ = run(tmp, "glob", [f"load_debug_rollout_data={tmp}/dump/rollout_*.jsonl", "save_interval=1"])
    _, resumed = run(tmp, "resumed", [f"load_debug_rollout_data={tmp}/dump", f"load={first}/checkpoints/rollout_000000"])
    train = lambda h: [{k: v for k, v in m.items() if k.startswith("train/")} for _, m in h]  # noqa: E731
    assert train(resumed) == train(history)


def test_rollout_only_dumps_and_builds_no_trainer(original, capfd):
    tmp, history = original
    out, got = run(tmp, "rollout_only", ["debug_rollout_only=true", f"save_debug_rollout_data={tmp}/gen", "save_interval=1"],
                   ARGS + ["warmstart.steps=0"])
    assert "debug_rollout_only: no trainer built" in capfd.readouterr().out
    assert sorted(p.name for p in (tmp / "gen").iterdir()) == [f"rollout_00000{i}.jsonl" for i in range(3)]
    assert [s for s, _ in got] == [1, 2, 3] and not any(k.startswith("train/") for _, m in got for k in m)
    ckpt = out / "checkpoints" / "rollout_000002"
    weights = [p for p in ckpt.glob("*.safetensors") if p.name != "state.safetensors"]  # the state's RNG tensors aside
    assert not weights and not list(ckpt.glob("*.bin"))  # no weights anywhere
    assert load_state(ckpt)["trainer"] == {"debug_rollout_only": True}
    _, rows = dump_rows(tmp / "gen" / "rollout_000002.jsonl")
    assert {r["weight_version"] for r in rows} == {0}  # never synced: every rollout from the initial weights
    with pytest.raises(UserError) as info:  # resumed as a real run: refused, naming why and what to do
        run(tmp, "resume_rollout_only", [f"load={ckpt}"])
    assert info.value.exit_code == 2
    assert "was written by debug_rollout_only=true and holds no trained weights" in str(info.value)


@pytest.mark.parametrize("extra, expected", [
    (["num_rollout=5"], "holds no rollout 3-4 (it holds 0-2); set num_rollout=3"),
    (["model.tokenizer=char_tools"], "was written with another tokenizer (vocab 59, this run's 63)"),
    (["model.name=qwen3-other"], "was written by model 'qwen3-tiny'"),
    (["rollout.rollout_batch_size=8"], "rollout 0 trained 16 samples, this run's rollout.rollout_batch_size × "
                                       "rollout.n_samples_per_prompt is 32; set rollout.rollout_batch_size=4"),
])
def test_a_dump_that_does_not_fit_the_run_is_refused_before_any_model(original, extra, expected):
    tmp, _ = original
    with pytest.raises(ConfigError) as info:
        run(tmp, "bad", [f"load_debug_rollout_data={tmp}/dump", *extra])
    assert info.value.exit_code == 2 and f"load_debug_rollout_data={tmp}/dump" in str(info.value)
    assert expected in str(info.value)
    assert not (tmp / "bad" / "checkpoints").exists()


def test_bad_debug_keys_exit_2_through_the_cli(original):
    tmp, _ = original
    proc = run_cli(ARGS + [f"load_debug_rollout_data={tmp}/nothing/*.jsonl", "debug_rollout_only=true",
                           "warmstart.steps=5", f"hydra.run.dir={tmp}/cli"], tmp)
    assert proc.returncode == 2, proc.stderr[-2000:]
    err = proc.stderr
    assert f"load_debug_rollout_data={tmp}/nothing/*.jsonl: no dump files match" in err
    assert "load_debug_rollout_data (train only) and debug_rollout_only=true (generate only) exclude each other" in err
    assert "debug_rollout_only=true builds no trainer, so no warm start (warmstart.steps=5); set warmstart.steps=0" in err
    assert "Traceback" not in err
    with pytest.raises(ConfigError, match="debug_train_only=true trains on saved rollouts"):
        compose_run(ARGS + ["debug_train_only=true"])


def test_old_format_and_overlapping_dumps_are_named(tmp_path, original):
    from slime_hydra.data.rollout_dump import read_dump

    tmp, _ = original
    old = tmp_path / "old"
    old.mkdir()  # what save_debug_rollout_data wrote before format 2: text and rewards, no tokens
    (old / "rollout_000000.jsonl").write_text(json.dumps({"rollout_id": 0, "prompt": "1+1=", "response": "2", "reward": 1.0}) + "\n")
    assert read_dump(str(old))[1] == [f"load_debug_rollout_data: {old / 'rollout_000000.jsonl'}: a version-1 dump (text and "
                                      "rewards only, no tokens or log-probs); regenerate it with save_debug_rollout_data"]
    for name in ("a", "b"):  # two runs' dumps under one glob: two rollout 0s
        (tmp_path / name).mkdir()
        (tmp_path / name / "rollout_000000.jsonl").write_text((tmp / "dump" / "rollout_000000.jsonl").read_text())
    dump, problems = read_dump(f"{tmp_path}/[ab]/*.jsonl")
    assert dump is None and f"rollout 0 is in both {tmp_path}/a/rollout_000000.jsonl and {tmp_path}/b/rollout_000000.jsonl" in problems[0]
