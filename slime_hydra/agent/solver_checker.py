"""Two agents, one policy: a solver answers a sum, a checker re-derives it after reading the solver's answer.

One generate hook (rollout.custom_generate) returns both as two samples of the same prompt sample, each trained
with its own loss mask on its own tokens (slime's list[Sample] return, as its multi-agent example splits one
trajectory into agents' turns):

    solver:   "82+57="                       -> "139"
    checker:  "82+57=139 57+82="             -> "139"   (the operands swapped: a second, independent derivation)

The checker's context holds the solver's tokens, but only the checker's own answer is in its loss mask. Each sample
is scored by reward.* against the label; the checker's `metadata["agrees"]` records whether the two answers match
(the verdict a pipeline would act on). In eval only the solver, the first of the list, is scored.

`demonstrations` is the warm start of both roles (warmstart.custom_sft_samples): the solver's direct answer, and
the checker's answer after a claim that is wrong half the time, so that the checker learns to re-derive the sum
rather than copy the claim.
"""

from __future__ import annotations

import dataclasses
import random

from slime_hydra.agent.hook import Completion, GenerateFn
from slime_hydra.rewards.verifiers import final_answer
from slime_hydra.types import Sample, SamplingParams


def answered(sample: Sample, prompt_tokens: list[int], c: Completion, tokenizer, role: str) -> Sample:
    """`sample`'s copy holding the completion `c` of `prompt_tokens`, all of it trained."""
    return dataclasses.replace(
        sample, prompt_tokens=list(prompt_tokens), tokens=list(prompt_tokens) + c.tokens,
        response=tokenizer.decode(c.tokens, skip_special_tokens=True), response_length=len(c.tokens),
        loss_mask=[1] * len(c.tokens), rollout_log_probs=list(c.log_probs), status=c.status,
        weight_version=c.weight_version, metadata={**sample.metadata, "agent": role}, siblings=[])


def checker_context(prompt_tokens: list[int], prompt: str, claim: str, tokenizer) -> list[int]:
    """The checker reads the solver's prompt, its claim, then the sum with the operands swapped."""
    return list(prompt_tokens) + tokenizer.encode(f"{claim} {swapped(prompt)}", add_special_tokens=False)


def swapped(prompt: str) -> str:
    """"82+57=" -> "57+82="; a prompt of another shape is asked again as it is."""
    left, _, right = prompt.rstrip("=").partition("+")
    return f"{right}+{left}=" if right else prompt


async def solve_and_check(sample: Sample, *, generate: GenerateFn, tokenizer, sampling: SamplingParams,
                          max_turns: int) -> list[Sample]:
    """rollout.custom_generate: [solver, checker] for one prompt sample (see the module's docstring)."""
    solver = answered(sample, sample.prompt_tokens, await generate(sample.prompt_tokens, sampling), tokenizer, "solver")
    claim = final_answer(solver.response) or ""
    context = checker_context(sample.prompt_tokens, str(sample.prompt), claim, tokenizer)
    checker = answered(sample, context, await generate(context, sampling), tokenizer, "checker")
    checker.metadata["agrees"] = final_answer(checker.response) == claim and bool(claim)
    return [solver, checker]


def demonstrations(prompts, tokenizer, seed: int = 0) -> list[Sample]:
    """SFT samples of both roles for each prompt (see the module's docstring); the answers are the label + eos."""
    rng, out = random.Random(seed), []
    for p in prompts:
        answer = tokenizer.encode(p.label, add_special_tokens=False) + [tokenizer.eos_token_id]
        claim = p.label if rng.random() < 0.5 else str(int(p.label) + rng.choice([-10, -1, 1, 10]))
        for context in (list(p.tokens), checker_context(p.tokens, str(p.prompt), claim, tokenizer)):
            out.append(Sample(prompt=p.prompt, label=p.label, prompt_tokens=context, tokens=context + answer,
                              response_length=len(answer), loss_mask=[1] * len(answer)))
    return out
