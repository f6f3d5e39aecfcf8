"""Per-group reward statistics that are exact where they must be (GRPO, Dr.GRPO, REINFORCE++-baseline).

A group whose rewards all agree carries no signal: its centred rewards are exactly 0, whatever the values.
Computing r - mean(r) alone does not guarantee it: eight float32 5.3s have a mean one ulp off 5.3, and
GRPO's division by std + 1e-6 would blow that residue up to ~0.3 (slime and verl share the fault).
Groups are consecutive blocks of `group_size` samples (the rollout's layout).
"""

from __future__ import annotations

import torch
from torch import Tensor


def tied_groups(grouped: Tensor) -> Tensor:
    """[B, G] rewards -> [B, 1] True where every reward of the group equals its first (a group of 1 is tied)."""
    return (grouped == grouped[:, :1]).all(dim=1, keepdim=True)  # [B, 1]


def centred_groups(grouped: Tensor) -> Tensor:
    """[B, G] rewards -> r - mean_group(r), exactly 0 on a tied group.

    Groups that are not tied get torch's r - r.mean() unchanged (bit for bit the slime/verl formula).
    """
    centred = grouped - grouped.mean(dim=1, keepdim=True)  # [B, G]
    return torch.where(tied_groups(grouped), torch.zeros_like(centred), centred)  # [B, G]
