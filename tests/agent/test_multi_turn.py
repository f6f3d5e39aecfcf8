"""Multi-turn agent rollouts: loss masks on hand-built trajectories, token-in/token-out across turns,
tool errors counted (never fatal), the budget over all turns, validation of the hook, tool_key templates.

`ScriptedBackend` is a RolloutBackend whose turns are written by hand, so the expected tokens, masks and
log-probs can be derived in the comments; the token-in/token-out test runs the real local backend.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import torch

from slime_hydra.agent.calculator import final_answer_reward
from slime_hydra.agent.env import StepResult, ToolError
from slime_hydra.agent.hook import AgentRollout, check_generate, check_hooks
from slime_hydra.agent.metrics import agent_metrics
from slime_hydra.agent.multi_turn import CHAT_OBSERVATION
from slime_hydra.app.plugins import load_hook
from slime_hydra.models.tokenizer import build_char_tokenizer
from slime_hydra.training.batch import collate
from slime_hydra.types import Sample, SamplingParams, Status

TOK = build_char_tokenizer(tools=True)
EOS = TOK.eos_token_id
MULTI = "slime_hydra.agent.multi_turn.generate"
HERE = __name__  # this module as pytest imported it, for `_target_`s of the hooks and envs below


def ids(text: str) -> list[int]:
    return TOK(text, add_special_tokens=False)["input_ids"]


class ScriptedBackend:
    """Turn k of every sample (told apart by its first 6 ids) returns script[k] (ids, log-prob of each = -(k+1)/10, cut at the stop ids
    like a real backend); records the token ids each call was given."""

    weight_version = 7

    def __init__(self, script: list[list[int]]):
        self.script, self.calls, self.turn = script, [], {}

    async def generate(self, samples, sampling):
        for s in samples:
            self.calls.append(list(s.prompt_tokens))
            k = self.turn.get(tuple(s.prompt_tokens[:6]), 0)
            self.turn[tuple(s.prompt_tokens[:6])] = k + 1
            out, status = [], Status.TRUNCATED
            for t in self.script[k][: sampling.max_new_tokens]:
                out.append(t)
                if t in sampling.stop_token_ids:
                    status = Status.COMPLETED
                    break
            s.tokens = list(s.prompt_tokens) + out
            s.response_length, s.rollout_log_probs = len(out), [-(k + 1) / 10] * len(out)
            s.status, s.weight_version = status, self.weight_version
        return samples

    def update_weights(self, named_tensors, version): ...
    def state_dict(self): return {}
    def load_state_dict(self, state): ...
    def shutdown(self): ...


def run(backend, prompts, max_turns=3, max_new=40, env="slime_hydra.agent.calculator.CalculatorEnv", **kw):
    rollout = AgentRollout(backend, TOK, {"_target_": MULTI, "env": {"_target_": env}, **kw}, max_turns, load_hook)
    samples = [Sample(prompt=p, prompt_tokens=ids(p), label=None) for p in prompts]
    return asyncio.run(rollout.generate(samples, SamplingParams(max_new_tokens=max_new, stop_token_ids=(EOS,))))


CALL = ids("<tool_call>12*34</tool_call>")  # 1 + 5 + 1 = 7 ids
OBS = ids("<tool_response>408</tool_response>")  # 1 + 3 + 1 = 5 ids
ANSWER = ids("408") + [EOS]  # 4 ids


def test_loss_mask_of_a_hand_built_two_turn_sample():
    (s,) = run(ScriptedBackend([CALL, ANSWER]), ["12*34="])
    prompt = ids("12*34=")  # 6 ids
    # tokens = prompt(6) + call(7, model) + observation(5, tool) + answer(4, model) = 22
    assert s.tokens == prompt + CALL + OBS + ANSWER and s.response_length == 16
    assert s.loss_mask == [1] * 7 + [0] * 5 + [1] * 4
    # turn 1 log-probs -0.1, observation 0 (masked), turn 2 -0.2
    assert s.rollout_log_probs == pytest.approx([-0.1] * 7 + [0.0] * 5 + [-0.2] * 4)
    assert s.status == Status.COMPLETED and s.weight_version == 7
    assert s.metadata["turns"] == 2 and s.metadata["tool_calls"] == 1 and s.metadata["tool_errors"] == 0
    assert s.response == "<tool_call>12*34</tool_call><tool_response>408</tool_response>408"
    s.label = "408"
    assert final_answer_reward(s) == 1.0  # the last model turn is the answer
    # collate: position t predicts token t+1, so response token j (absolute 6 + j) is trained at t = 5 + j;
    # prompt positions 0..4 and the observation's positions 12..16 carry no loss
    batch = collate([s], torch.zeros(1), TOK.pad_token_id)
    expect = torch.zeros(21)
    expect[5:12], expect[17:21] = 1, 1
    assert torch.equal(batch.loss_mask[0], expect)
    assert batch.rollout_log_probs[0, 12:17].abs().sum() == 0 and batch.rollout_log_probs[0, 5].item() == pytest.approx(-0.1)


def test_two_tool_calls_then_answer_and_the_metrics():
    # a second call before answering: masks 7 model, 5 obs, 7 model, 5 obs, 4 model
    backend = ScriptedBackend([CALL, CALL, ANSWER])
    a, b = run(backend, ["12*34=", "12*34+"], max_turns=3)
    for s in (a, b):
        assert s.loss_mask == [1] * 7 + [0] * 5 + [1] * 7 + [0] * 5 + [1] * 4
        assert s.metadata["turns"] == 3 and s.metadata["tool_calls"] == 2
    # both samples' turns were batched into one backend call per turn: 3 calls of 2 samples
    assert len(backend.calls) == 6
    m = agent_metrics([a, b])
    # 2 × 10 observation tokens of 2 × 28 response tokens
    assert m == {"rollout/turns_mean": 3.0, "rollout/tool_calls_mean": 2.0, "rollout/tool_error_rate": 0.0,
                 "rollout/masked_token_frac": pytest.approx(20 / 56)}


def test_max_turns_1_never_runs_the_tool():
    (s,) = run(ScriptedBackend([CALL, ANSWER]), ["12*34="], max_turns=1)
    assert s.loss_mask == [1] * 7 and s.metadata["tool_calls"] == 0
    s.label = "408"
    assert final_answer_reward(s) == 0.0  # the last model turn is a call, not an answer


def test_token_in_token_out_no_retokenisation_drift():
    # a text round trip loses ids: the backend's response text (special tokens skipped) re-encodes without the
    # markers; turns must chain ids, not text
    turn1 = CALL
    assert ids(TOK.decode(turn1, skip_special_tokens=True)) == ids("12*34") != turn1
    backend = ScriptedBackend([turn1, ANSWER])
    (s,) = run(backend, ["12*34="])
    # turn 2 continued from exactly prompt + turn-1 ids + observation ids, and the sample holds them
    assert backend.calls[1] == ids("12*34=") + turn1 + OBS
    assert s.tokens == backend.calls[1] + ANSWER and s.loss_mask == [1] * 7 + [0] * 5 + [1] * 4


def test_token_in_token_out_with_the_local_backend():
    from slime_hydra.config.schema import ModelConfig
    from slime_hydra.models.build import build_model
    from slime_hydra.rollout.local import LocalRollout

    class Recording(LocalRollout):
        calls: list = []

        async def generate(self, samples, sampling):
            out = await super().generate(samples, sampling)
            self.calls += [(list(s.prompt_tokens), s.response_tokens) for s in out]
            return out

    torch.manual_seed(0)
    model = build_model(ModelConfig(tokenizer="char_tools"), TOK, seed=3)
    with torch.no_grad():  # make the random model emit </tool_call> often, so samples take several turns
        model.lm_head.weight[TOK.convert_tokens_to_ids("</tool_call>")] *= 0
        model.model.embed_tokens.weight[TOK.convert_tokens_to_ids("</tool_call>")] += 0.05
    backend = Recording(model, TOK, seed=0)
    samples = run(backend, [f"{a}*{b}=" for a in range(10, 14) for b in range(10, 14)], max_turns=4, max_new=60,
                  env=f"{HERE}.Sleepy")
    assert max(s.metadata["turns"] for s in samples) >= 2
    # tools that return at different times sent later turns while a backend call ran; calls were serialised,
    # so the local backend's no_grad blocks never interleaved and left autograd off for the trainer
    assert torch.is_grad_enabled()
    by_prefix = {}
    for inp, out in backend.calls:
        by_prefix.setdefault(tuple(inp[:6]), []).append((inp, out))
    for s in samples:
        calls = by_prefix[tuple(s.prompt_tokens[:6])]
        assert len(calls) == s.metadata["turns"]
        # every turn's input is a prefix of the final tokens, followed there by that turn's output ids (a run of
        # loss_mask 1; the output can be cut to the sample's own budget when a longer one shared the batch)
        for inp, out in calls:
            j = len(inp) - len(s.prompt_tokens)
            run_len = next((k for k, m in enumerate(s.loss_mask[j:]) if m == 0), len(s.loss_mask) - j)
            assert s.tokens[: len(inp)] == inp and 1 <= run_len and s.tokens[len(inp): len(inp) + run_len] == out[:run_len]
        # after the last turn only an observation (loss_mask 0) can follow
        inp, out = calls[-1]
        assert set(s.loss_mask[len(inp) - len(s.prompt_tokens) + len(out):]) <= {0}
        assert len(s.loss_mask) == len(s.rollout_log_probs) == s.response_length <= 60


class Sleepy:
    """A tool that answers after 0-20 ms, so samples come back from it at different times."""

    def reset(self, sample): pass

    def step(self, call):
        time.sleep(0.002 * (len(call) % 11))
        return StepResult("1")


class Raising:
    def reset(self, sample): pass
    def step(self, call): raise RuntimeError("boom")


class Hanging:
    def reset(self, sample): pass
    def step(self, call):
        time.sleep(1.0)
        return StepResult("late")


class AsyncHanging:
    async def reset(self, sample): pass
    async def step(self, call):
        await asyncio.sleep(10)


class Rejecting:
    def reset(self, sample): pass
    def step(self, call): raise ToolError("bad arguments")


class WrongType:
    def reset(self, sample): pass
    def step(self, call): return "not a StepResult"


@pytest.mark.parametrize("env,kind", [("Raising", "exception"), ("Hanging", "timeout"), ("AsyncHanging", "timeout"),
                                      ("Rejecting", "malformed"), ("WrongType", "exception")])
def test_tool_failures_end_the_turn_with_a_counted_error(env, kind):
    samples = run(ScriptedBackend([CALL, ANSWER]), ["12*34=", "12*35="], env=f"{HERE}.{env}", tool_timeout_s=0.2)
    for s in samples:
        assert s.metadata["tool_errors"] == 1 and s.metadata["tool_error_kinds"] == [kind]
        assert s.metadata["turns"] == 2 and s.status == Status.COMPLETED  # the model read the error and answered
        obs = s.tokens[len(s.prompt_tokens) + len(CALL): len(s.tokens) - len(ANSWER)]
        assert TOK.decode(obs).startswith("<tool_response>error: ") and set(s.loss_mask[7:-4]) == {0}
    assert agent_metrics(samples)["rollout/tool_error_rate"] == 1.0


def test_malformed_calls_are_counted():
    unopened = ids("12*34</tool_call>")  # closes a call it never opened
    garbage = ids("<tool_call>12**</tool_call>")  # the calculator cannot parse it
    a, = run(ScriptedBackend([unopened, ANSWER]), ["12*34="])
    b, = run(ScriptedBackend([garbage, CALL, ANSWER]), ["12*34="])
    assert a.metadata["tool_error_kinds"] == ["malformed"]
    assert b.metadata["tool_error_kinds"] == ["malformed"] and b.metadata["tool_calls"] == 2
    # b: 2 calls, 1 error -> 0.5; a: 1 call, 1 error; together 2 errors / 3 calls
    assert agent_metrics([a, b])["rollout/tool_error_rate"] == pytest.approx(2 / 3)


def test_response_budget_counts_every_turn():
    # budget 14: call (7) + observation (5) = 12, the answer gets the 2 ids left and is truncated
    (s,) = run(ScriptedBackend([CALL, ANSWER]), ["12*34="], max_new=14)
    assert s.response_length == 14 and s.status == Status.TRUNCATED and s.loss_mask == [1] * 7 + [0] * 5 + [1] * 2
    # budget 10: the observation itself is cut to the 3 ids left, and no model turn follows
    (s,) = run(ScriptedBackend([CALL, ANSWER]), ["12*34="], max_new=10)
    assert s.response_length == 10 and s.status == Status.TRUNCATED and s.metadata["turns"] == 1


def test_chat_observation_and_tool_key_template(tmp_path):
    from slime_hydra.data.dataset import load_prompts

    tools = [{"type": "function", "function": {"name": "calc"}}]
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "12*34", "label": "408", "tools": tools}) + "\n")
    (p,) = load_prompts(str(path), TOK, "prompt", "label", apply_chat_template=True, tool_key="tools")
    assert p.text == "<|im_start|>system\ntools: calc<|im_end|>\n<|im_start|>user\n12*34<|im_end|>\n<|im_start|>assistant\n"
    backend = ScriptedBackend([CALL, ANSWER])
    rollout = AgentRollout(backend, TOK, {"_target_": MULTI, "env": {"_target_": "slime_hydra.agent.calculator.CalculatorEnv"},
                                          "observation_template": CHAT_OBSERVATION}, 2, load_hook)
    (s,) = asyncio.run(rollout.generate([Sample(prompt=p.prompt, prompt_tokens=p.tokens)], SamplingParams(max_new_tokens=80, stop_token_ids=(EOS,))))
    # the observation closes the assistant turn and reopens it, as the template renders a tool message
    rendered = TOK.apply_chat_template([{"role": "user", "content": "12*34"}, {"role": "assistant", "content": "<tool_call>12*34</tool_call>"},
                                        {"role": "tool", "content": "408"}], tools=tools, tokenize=False, add_generation_prompt=True)
    assert TOK.decode(backend.calls[1]) == rendered


async def echo_hook(sample, *, generate, tokenizer, sampling, max_turns, suffix="!"):
    c = await generate(sample.prompt_tokens, sampling)
    sample.tokens, sample.response_length = sample.prompt_tokens + c.tokens, len(c.tokens)
    sample.rollout_log_probs, sample.loss_mask, sample.status = c.log_probs, [1] * len(c.tokens), c.status
    sample.metadata["hook"] = suffix
    return sample


def sync_hook(sample, *, generate, tokenizer, sampling, max_turns):
    return sample


async def narrow_hook(sample, generate):
    return sample


def test_hook_validation_names_the_key():
    problems: list[str] = []
    check_generate("rollout.custom_generate", {"_target_": f"{HERE}.nope"}, problems)
    check_generate("rollout.custom_generate", {"_target_": f"{HERE}.sync_hook"}, problems)
    check_generate("rollout.custom_generate", {"_target_": f"{HERE}.narrow_hook"}, problems)
    check_generate("rollout.custom_generate", {"_target_": f"{HERE}.echo_hook", "sufix": "?"}, problems)
    check_generate("rollout.custom_generate", {"_target_": MULTI, "env": {"_target_": "slime_hydra.agent.calculator.Nope"}}, problems)
    assert len(problems) == 5 and all(p.startswith("rollout.custom_generate") for p in problems)
    assert "does not import" in problems[0] and "async def" in problems[1]
    assert "max_turns" in problems[2] and "sufix" in problems[3] and problems[4].startswith("rollout.custom_generate.env")
    ok: list[str] = []
    check_generate("rollout.custom_generate", {"_target_": f"{HERE}.echo_hook", "suffix": "?"}, ok)
    check_generate("rollout.custom_generate", {"_target_": MULTI, "env": {"_target_": "slime_hydra.agent.calculator.CalculatorEnv"}}, ok)
    assert ok == []


def test_config_errors_for_the_hook_at_validation_time():
    from slime_hydra.app.preflight import compose_run
    from slime_hydra.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        compose_run([f"+rollout.custom_generate._target_={HERE}.sync_hook", "rollout.max_turns=0"])
    text = str(e.value)
    assert f"rollout.custom_generate._target_={HERE}.sync_hook must be an `async def`" in text
    assert "rollout.max_turns=0 must be >= 1" in text


def test_per_sample_override_through_metadata_names_a_registered_hook():
    # a sample picks a hook of rollout.generate_hooks by name; the registry's hooks are checked like custom_generate's
    problems = check_hooks({}, {"echo": {"_target_": f"{HERE}.echo_hook", "suffix": "?"}, "sync": f"{HERE}.sync_hook"})
    assert len(problems) == 1 and problems[0].startswith("rollout.generate_hooks.sync._target_=") and "async def" in problems[0]
    backend = ScriptedBackend([ANSWER])
    rollout = AgentRollout(backend, TOK, None, 1, load_hook, hooks={"echo": {"_target_": f"{HERE}.echo_hook", "suffix": "?"}})
    samples = [Sample(prompt="a", prompt_tokens=ids("12*34=")),
               Sample(prompt="b", prompt_tokens=ids("12*35="), metadata={"custom_generate": "echo"})]
    out = asyncio.run(rollout.generate(samples, SamplingParams(max_new_tokens=8, stop_token_ids=(EOS,))))
    assert "hook" not in out[0].metadata and out[0].response_length == 4  # the backend's own single turn
    assert out[1].metadata["hook"] == "?" and out[1].tokens == ids("12*35=") + ANSWER


def test_a_sample_naming_code_of_its_own_is_refused(tmp_path):
    """Data names no code: a dotted path or node in metadata.custom_generate is never imported. The rollout refuses such a
    sample, and a row carrying one is a bad row, in memory and streamed alike (checked as the row is read)."""
    import json

    from slime_hydra.config.datafiles import DataFile
    from slime_hydra.data.dataset import load_prompts
    from slime_hydra.data.readers import LocalReader, Prep
    from slime_hydra.data.rows import RowKeys
    from slime_hydra.errors import DataError, UserError

    rollout = AgentRollout(ScriptedBackend([ANSWER]), TOK, None, 1, load_hook, hooks={"echo": {"_target_": f"{HERE}.echo_hook"}})
    for spec in ("os.system", {"_target_": "os.system", "command": "touch pwned"}):
        bad = [Sample(prompt="b", prompt_tokens=ids("12*35="), metadata={"custom_generate": spec})]
        with pytest.raises(UserError, match=r"is not a hook of rollout.generate_hooks \(\['echo'\]\)"):
            asyncio.run(rollout.generate(bad, SamplingParams(max_new_tokens=8, stop_token_ids=(EOS,))))
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        {"prompt": "1+1=", "label": "2", "metadata": {"custom_generate": "echo"}},
        {"prompt": "1+2=", "label": "3", "metadata": {"custom_generate": "os.system"}},
        {"prompt": "1+3=", "label": "4", "metadata": {"custom_generate": {"_target_": "os.system"}}}]) + "\n")
    with pytest.raises(DataError) as e:
        load_prompts(str(path), TOK, "prompt", "label", generate_hooks=frozenset({"echo"}))
    assert f"{path}:2: 'metadata.custom_generate' is 'os.system'; a row picks its generate hook by name only, one of " \
           "['echo']" in str(e.value) and f"{path}:3: 'metadata.custom_generate' is an object" in str(e.value)
    kept = load_prompts(str(path), TOK, "prompt", "label", on_bad_row="skip", generate_hooks=frozenset({"echo"}))
    assert [p.label for p in kept] == ["2"] and kept.skipped_rows == 2
    keys = RowKeys("prompt", "label", generate_hooks=frozenset({"echo"}))
    events, _ = next(LocalReader([DataFile(str(path), "jsonl")], Prep(keys, TOK)))
    assert [kind for kind, _, _ in events] == ["ok", "bad", "bad"]  # streamed rows: checked as they are read
    assert "os.system" in events[1][1][0] and events[1][1][0].startswith(f"{path}:2:")


def test_sft_demonstrations_mask_the_observation_as_rl_does():
    from slime_hydra.agent.calculator import demonstrations, evaluate
    from slime_hydra.data.dataset import Prompt

    (d,) = demonstrations([Prompt("12*34=", "12*34=", ids("12*34="), "408")], TOK)
    (s,) = run(ScriptedBackend([CALL, ANSWER]), ["12*34="])
    assert d.tokens == s.tokens and d.loss_mask == s.loss_mask and d.response_length == s.response_length
    assert evaluate("347*829") == 287663 and evaluate("-2+3*4") == 10
    for bad in ("2**8", "__import__('os')", "1/2", "9" * 7 + "*" + "9" * 7):
        with pytest.raises(ToolError):
            evaluate(bad)
