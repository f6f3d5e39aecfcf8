"""The local rollout backend: sampling semantics, stop tokens, and weight sync with versions."""

from __future__ import annotations

import asyncio

import torch

from slime_hydra.config.schema import ModelConfig
from slime_hydra.models.build import build_model
from slime_hydra.models.tokenizer import build_char_tokenizer
from slime_hydra.rollout.local import LocalRollout
from slime_hydra.training.batch import collate
from slime_hydra.types import Sample, SamplingParams, Status

TOK = build_char_tokenizer()


def fresh(n: int, prompt: str = "12+34=") -> list[Sample]:
    ids = TOK(prompt, add_special_tokens=False)["input_ids"]
    return [Sample(prompt=prompt, prompt_tokens=list(ids)) for _ in range(n)]


def model(seed: int = 0) -> torch.nn.Module:
    return build_model(ModelConfig(num_layers=2, hidden_size=64, ffn_hidden_size=128, kv_channels=16), TOK, seed)


def gen(r: LocalRollout, samples, sp) -> list[Sample]:
    return asyncio.run(r.generate(samples, sp))


def test_low_temperature_equals_greedy():
    r = LocalRollout(model(), TOK, seed=0)
    greedy = gen(r, fresh(16), SamplingParams(top_k=1, max_new_tokens=6))
    cold = gen(r, fresh(16), SamplingParams(temperature=1e-4, max_new_tokens=6))
    assert [s.tokens for s in cold] == [s.tokens for s in greedy]


def test_stop_token_ends_the_response_and_counts():
    r = LocalRollout(model(), TOK, seed=0)
    (s,) = gen(r, fresh(1), SamplingParams(top_k=1, max_new_tokens=6))
    first = s.response_tokens[0]
    # make the greedy first token a stop token: the response is exactly that one token
    (t,) = gen(r, fresh(1), SamplingParams(top_k=1, max_new_tokens=6, stop_token_ids=(first,)))
    assert t.response_tokens == [first] and t.status == Status.COMPLETED and t.response_length == 1
    assert len(t.rollout_log_probs) == 1 and t.loss_mask == [1]


def test_max_response_len_truncates():
    r = LocalRollout(model(), TOK, seed=0)
    out = gen(r, fresh(8), SamplingParams(max_new_tokens=3, stop_token_ids=()))
    assert all(s.response_length == 3 and s.status == Status.TRUNCATED for s in out)


def test_stop_string_ends_the_response():
    r = LocalRollout(model(), TOK, seed=0)
    (s,) = gen(r, fresh(1), SamplingParams(top_k=1, max_new_tokens=6))
    stop = TOK.decode(s.response_tokens[:2])
    (t,) = gen(r, fresh(1), SamplingParams(top_k=1, max_new_tokens=6, stop=(stop,)))
    assert TOK.decode(t.response_tokens).endswith(stop) and t.status == Status.COMPLETED


def test_rollout_logprobs_match_a_full_forward():
    m = model()
    r = LocalRollout(m, TOK, seed=3)
    # two prompts of different lengths, interleaved: each is prefilled once and its cache repeated to its rows
    samples = [s for pair in zip(fresh(4), fresh(4, "5+5=")) for s in pair]
    samples = gen(r, samples, SamplingParams(temperature=0.7, max_new_tokens=5))
    batch = collate(samples, torch.zeros(8), TOK.pad_token_id)
    logits = m(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]
    lp = torch.log_softmax(logits / 0.7, -1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    torch.testing.assert_close(lp * batch.loss_mask, batch.rollout_log_probs, atol=1e-4, rtol=0)


def test_next_rollout_samples_from_synced_weights():
    trainer_model, other = model(seed=0), model(seed=1)
    r = LocalRollout(trainer_model, TOK, seed=0)
    sp = SamplingParams(top_k=1, max_new_tokens=6)
    before = gen(r, fresh(4), sp)
    assert all(s.weight_version == 0 for s in before)
    r.update_weights(other.named_parameters(), version=7)  # the trainer's new weights
    after = gen(r, fresh(4), sp)
    expected = gen(LocalRollout(other, TOK, seed=0), fresh(4), sp)
    assert [s.tokens for s in after] == [s.tokens for s in expected]
    assert [s.rollout_log_probs for s in after] == [s.rollout_log_probs for s in expected]
    assert all(s.weight_version == 7 for s in after)
    for (name, p), (_, q) in zip(r.model.named_parameters(), other.named_parameters()):
        assert torch.equal(p, q), name


def test_concurrent_generates_leave_autograd_on():
    # two interleaved generate() coroutines (the async collector and an agent hook do this): grad mode is
    # per thread, so a no_grad block held across an await would leave it off for the trainer
    r = LocalRollout(model(), TOK, seed=0)

    async def both():
        await asyncio.gather(r.generate(fresh(4), SamplingParams(max_new_tokens=4)),
                             r.generate(fresh(4, "5+5="), SamplingParams(max_new_tokens=6)))

    asyncio.run(both())
    assert torch.is_grad_enabled()
