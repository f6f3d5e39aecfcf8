"""Hand-built Samples -> TrainBatch: exactly which positions are set.

Position t of every [N, T] tensor is the prediction of token t+1; sequences are right-padded.
A sample with L tokens of which the last R are the response has its response tokens at
indices L-R .. L-1, so they are predicted at positions L-R-1 .. L-2.
"""

import torch
from torch.testing import assert_close

from slime_hydra.training.batch import collate
from slime_hydra.types import Sample

PAD = 0


def _samples():
    # A: prompt [11, 12, 13], response [21, 22] -> tokens (idx 0..4) [11, 12, 13, 21, 22], L = 5, R = 2
    #    response tokens at idx 3, 4 -> predicted at positions 2, 3
    a = Sample(
        prompt="a",
        prompt_tokens=[11, 12, 13],
        tokens=[11, 12, 13, 21, 22],
        response_length=2,
        loss_mask=[1, 1],
        rollout_log_probs=[-0.5, -0.25],
    )
    # B: prompt [31, 32], response [41, 42, 43, 44] -> tokens [31, 32, 41, 42, 43, 44], L = 6, R = 4
    #    response tokens at idx 2..5 -> predicted at positions 1..4; loss_mask has a 0 on 42 (position 2)
    b = Sample(
        prompt="b",
        prompt_tokens=[31, 32],
        tokens=[31, 32, 41, 42, 43, 44],
        response_length=4,
        loss_mask=[1, 0, 1, 1],
        rollout_log_probs=[-1.0, -2.0, -3.0, -4.0],
    )
    return [a, b]


def test_collate_shapes_ids_and_attention():
    # longest sequence has 6 tokens -> input_ids [2, 6], target positions T = 5
    batch = collate(_samples(), torch.tensor([2.0, -1.0]), pad_id=PAD)
    assert batch.input_ids.shape == (2, 6)
    assert batch.attention_mask.shape == (2, 6)
    assert batch.loss_mask.shape == (2, 5)
    assert batch.advantages.shape == (2, 5)
    assert batch.rollout_log_probs.shape == (2, 5)
    assert batch.input_ids.dtype == torch.long
    assert batch.loss_mask.dtype == torch.float32
    assert batch.advantages.dtype == torch.float32
    # A right-padded with one PAD
    assert batch.input_ids.tolist() == [[11, 12, 13, 21, 22, PAD], [31, 32, 41, 42, 43, 44]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]]


def test_collate_loss_mask_positions():
    batch = collate(_samples(), torch.tensor([2.0, -1.0]), pad_id=PAD)
    # A: positions 2, 3 -> [0, 0, 1, 1, 0]   (position 4 would predict the PAD)
    # B: positions 1..4 get loss_mask [1, 0, 1, 1] -> [0, 1, 0, 1, 1]
    assert batch.loss_mask.tolist() == [[0.0, 0.0, 1.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0, 1.0]]
    # every trained position t predicts a response token: input_ids[i, t + 1]
    # A: t = 2 -> 21, t = 3 -> 22 ; B: t = 1 -> 41, t = 3 -> 43, t = 4 -> 44 (42 at t = 2 masked out)
    targets = [[batch.input_ids[i, t + 1].item() for t in range(5) if batch.loss_mask[i, t] == 1] for i in range(2)]
    assert targets == [[21, 22], [41, 43, 44]]


def test_collate_per_sample_advantages_broadcast_on_mask():
    batch = collate(_samples(), torch.tensor([2.0, -1.0]), pad_id=PAD)
    # A: 2 on positions 2, 3 ; B: -1 on positions 1, 3, 4 (0 where loss_mask is 0, incl. position 2)
    expected = torch.tensor([[0.0, 0.0, 2.0, 2.0, 0.0], [0.0, -1.0, 0.0, -1.0, -1.0]])
    assert_close(batch.advantages, expected, rtol=0, atol=0)


def test_collate_rollout_log_probs_positions():
    batch = collate(_samples(), torch.tensor([2.0, -1.0]), pad_id=PAD)
    # rollout log-probs go on every response position (also the loss-masked one), 0 elsewhere
    # A: positions 2, 3 -> -0.5, -0.25 ; B: positions 1..4 -> -1, -2, -3, -4
    expected = torch.tensor([[0.0, 0.0, -0.5, -0.25, 0.0], [0.0, -1.0, -2.0, -3.0, -4.0]])
    assert_close(batch.rollout_log_probs, expected, rtol=0, atol=0)


def test_collate_per_token_advantages_pass_through():
    # [N, T] advantages are taken as given (already per token)
    adv = torch.tensor([[0.0, 0.0, 0.5, 0.75, 0.0], [0.0, 1.0, 0.0, 2.0, 3.0]], dtype=torch.float64)
    batch = collate(_samples(), adv, pad_id=PAD)
    assert batch.advantages.dtype == torch.float32
    assert_close(batch.advantages, adv.float(), rtol=0, atol=0)


def test_collate_defaults_without_loss_mask_and_log_probs():
    # C: tokens [5, 6, 7, 8], response [7, 8] (R = 2), no loss_mask -> all response tokens train,
    #    no rollout_log_probs -> zeros. Alone in the batch: T = 3, response predicted at positions 1, 2.
    # D: tokens [9, 10, 11], R = 1 -> predicted at position 1; padded with pad_id = 99.
    c = Sample(prompt="c", prompt_tokens=[5, 6], tokens=[5, 6, 7, 8], response_length=2)
    d = Sample(prompt="d", prompt_tokens=[9, 10], tokens=[9, 10, 11], response_length=1)
    batch = collate([c, d], torch.tensor([1.5, -0.5]), pad_id=99)
    assert batch.input_ids.tolist() == [[5, 6, 7, 8], [9, 10, 11, 99]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    assert batch.loss_mask.tolist() == [[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]]
    assert_close(batch.advantages, torch.tensor([[0.0, 1.5, 1.5], [0.0, -0.5, 0.0]]), rtol=0, atol=0)
    assert_close(batch.rollout_log_probs, torch.zeros(2, 3), rtol=0, atol=0)


def test_collate_select_trims_to_longest_row():
    # Selecting only A (5 tokens) trims input_ids to 5 and [N, T] tensors to 4 positions.
    batch = collate(_samples(), torch.tensor([2.0, -1.0]), pad_id=PAD)
    sub = batch.select(torch.tensor([0]))
    assert sub.input_ids.tolist() == [[11, 12, 13, 21, 22]]
    assert sub.loss_mask.tolist() == [[0.0, 0.0, 1.0, 1.0]]
    assert sub.advantages.tolist() == [[0.0, 0.0, 2.0, 2.0]]
    assert sub.rollout_log_probs.tolist() == [[0.0, 0.0, -0.5, -0.25]]
