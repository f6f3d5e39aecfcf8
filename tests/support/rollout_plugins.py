"""The rollout hooks' plug-ins that the tests name by `_target_` (tests.support.rollout_plugins.<name>); each is also the
example of its key in docs/customization.md, which a test keeps equal to this source. The lists record what each
hook saw, for the tests (a test clears them)."""

from __future__ import annotations

import asyncio
import dataclasses

import torch

from slime_hydra.training.batch import collate

ROLLOUT_CALLS: list[int] = []  # rollout ids one_token_rollout ran for
JUDGED: list[list[list[dict]]] = []  # per rollout: every judged group, each sample as a dict
BATCHES: list[tuple[int, dict]] = []  # (rollout id, the batch's tensors) as training receives them


async def one_token_rollout(rollout_id, data_source, *, rollout, scorer, sampling, rollout_batch_size, max_new_tokens=1):
    """rollout.rollout_function: the whole rollout in one function; here each response is cut to `max_new_tokens`."""
    ROLLOUT_CALLS.append(rollout_id)
    groups = data_source.get_groups(rollout_batch_size)
    await rollout.generate([s for g in groups for s in g], dataclasses.replace(sampling, max_new_tokens=max_new_tokens))
    return groups, {"one_token_rollouts": 1.0}  # unscored samples are scored with reward.* after it returns


async def three_drafts(sample, *, generate, tokenizer, sampling, max_turns, k=3):
    """rollout.custom_generate returning list[Sample]: k drafts of one prompt; draft i leaves its first i tokens out
    of its loss mask."""
    outs = await asyncio.gather(*(generate(sample.prompt_tokens, sampling) for _ in range(k)))
    return [dataclasses.replace(
        sample, tokens=sample.prompt_tokens + c.tokens, response=tokenizer.decode(c.tokens, skip_special_tokens=True),
        response_length=len(c.tokens), loss_mask=[int(j >= i) for j in range(len(c.tokens))],
        rollout_log_probs=c.log_probs, status=c.status, weight_version=c.weight_version,
        metadata={**sample.metadata, "draft": i}) for i, c in enumerate(outs)]


def remove_below(samples, min_reward=1.0):
    """rollout.rollout_sample_filter: samples rewarded under `min_reward` stay in the batch but train nothing."""
    for group in samples:
        for s in group:
            s.remove_sample = s.reward < min_reward


def record_judged(samples, data_source):
    """rollout.rollout_all_samples_process: every group judged this rollout, the ones dynamic sampling dropped too."""
    JUDGED.append([[{"reward": s.reward, "removed": s.remove_sample, "draft": s.metadata.get("draft"),
                     "response_length": s.response_length, "loss_mask": list(s.loss_mask or [])} for s in g]
                   for g in samples])


def first_tokens_only(samples, *, pad_id, n=2):
    """rollout.custom_convert_samples_to_train_data: the default collation, then only the first `n` response tokens
    of each sample train."""
    batch = collate(samples, torch.zeros(len(samples)), pad_id)
    batch.loss_mask *= (batch.loss_mask.cumsum(-1) <= n).float()
    return batch


def scale_advantages(rollout_id, batch, factor=1.0):
    """rollout.rollout_data_postprocess: the advantages scaled by `factor` before training (0 trains nothing)."""
    batch.advantages *= factor
    BATCHES.append((rollout_id, {"loss_mask": batch.loss_mask.clone(), "advantages": batch.advantages.clone()}))


# -- wrong on purpose: signatures that do not fit their key's call (validation names the key) ------------------------------

def takes_nothing():
    """Fits none of the rollout hooks' calls."""


async def generate_without_kwargs(sample):
    """A generate hook that takes none of generate=, tokenizer=, sampling=, max_turns=."""
    return sample
