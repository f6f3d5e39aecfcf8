"""The multi-turn tool loop as a generate hook: model turn, tool call, observation, ... up to max_turns.

    rollout:
      max_turns: 3
      custom_generate:
        _target_: slime_hydra.agent.multi_turn.generate
        env: {_target_: slime_hydra.agent.calculator.CalculatorEnv}

Each model turn continues from the exact token ids so far and stops on `</tool_call>` (by id when it is
one token, else as a stop string) or on the rollout's stop tokens. A turn that ends with a tool call
runs the environment's `step` on the text between the markers; the result, wrapped in
`observation_template`, is tokenised once and appended as masked observation tokens. The episode ends
when a turn makes no tool call, the environment says done, max_turns model turns have run (a call in
the last turn is not executed, so max_turns=1 disables the tool), or the response budget
(rollout_max_response_len, counted over model and observation tokens, as slime's search-r1 does) runs out.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from slime_hydra.agent.env import maybe_await, run_step
from slime_hydra.agent.hook import GenerateFn
from slime_hydra.agent.trajectory import Trajectory
from slime_hydra.types import Sample, SamplingParams, Status

# Qwen3-style observation: the model's turn ends, the tool's result comes as a user turn, the model resumes.
CHAT_OBSERVATION = "<|im_end|>\n<|im_start|>user\n<tool_response>{observation}</tool_response><|im_end|>\n<|im_start|>assistant\n"


def parse_tool_call(text: str, start: str, end: str) -> Optional[str]:
    """The call between the last `start` and the closing `end` marker; None when `start` is missing."""
    body = text[: text.rfind(end)] if end in text else text
    i = body.rfind(start)
    return None if i < 0 else body[i + len(start):].strip()


def turn_sampling(sampling: SamplingParams, budget: int, end_id: Optional[int], end: str) -> SamplingParams:
    if end_id is not None:
        return dataclasses.replace(sampling, max_new_tokens=budget, stop_token_ids=tuple(sampling.stop_token_ids) + (end_id,))
    return dataclasses.replace(sampling, max_new_tokens=budget, stop=tuple(sampling.stop) + (end,))


def single_token_id(tokenizer, text: str) -> Optional[int]:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids[0] if len(ids) == 1 else None


async def generate(sample: Sample, *, generate: GenerateFn, tokenizer, sampling: SamplingParams, max_turns: int,
                   env: Callable[[], Any], tool_call_start: str = "<tool_call>", tool_call_end: str = "</tool_call>",
                   observation_template: str = "<tool_response>{observation}</tool_response>",
                   tool_timeout_s: float = 5.0) -> Sample:
    tool = env()  # a fresh environment per sample (the node's `env` key, bound as a factory)
    await maybe_await(tool.reset(sample))
    end_id = single_token_id(tokenizer, tool_call_end)
    traj = Trajectory(list(sample.prompt_tokens))
    status, version, calls, errors, env_reward = Status.COMPLETED, 0, 0, [], 0.0
    for turn in range(max_turns):
        budget = sampling.max_new_tokens - len(traj.response)
        c = await generate(traj.tokens, turn_sampling(sampling, budget, end_id, tool_call_end))
        traj.add_model(c.tokens, c.log_probs)
        version = c.weight_version
        if c.status in (Status.TRUNCATED, Status.ABORTED):
            status = c.status  # out of budget, or the rollout aborted it (a partial rollout restarts it from the prompt)
            break
        text = tokenizer.decode(c.tokens)
        if not text.endswith(tool_call_end) or turn == max_turns - 1:
            break  # a final answer, or a call with no turn left to read its result
        calls += 1
        result, error = await run_step(tool, parse_tool_call(text, tool_call_start, tool_call_end), tool_timeout_s)
        if error is not None:
            errors.append(error)
        env_reward += float(result.reward)
        obs = tokenizer(observation_template.format(observation=result.observation), add_special_tokens=False)["input_ids"]
        room = sampling.max_new_tokens - len(traj.response)
        traj.add_observation(obs[:room])
        if len(obs) >= room:
            status = Status.TRUNCATED  # no budget left for another model turn
            break
        if result.done:
            break
    sample.metadata.update(turns=len(traj.model_turns), tool_calls=calls, tool_errors=len(errors),
                           tool_error_kinds=errors, env_reward=env_reward)
    return traj.finish(sample, tokenizer, status, version)
