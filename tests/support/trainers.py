"""Test helpers: a trainer built the way the composition floor builds it, from (algorithm, train) configs.

The trainers take typed specs (training/specs.py); app/algorithm.py turns the config groups into them. These
helpers keep the tests' calls in the config's terms while going through that real composition step.
"""

from __future__ import annotations

from typing import Optional

import torch

from slime_hydra.app.algorithm import advantage_spec, algorithm_specs
from slime_hydra.config.schema import AlgorithmConfig, TrainConfig
from slime_hydra.engine.steps import advantages
from slime_hydra.training.torch_backend import TorchTrainBackend


def torch_backend(model: torch.nn.Module, algorithm: AlgorithmConfig, train: TrainConfig, temperature: float, total_steps: int,
                  device: torch.device, max_response_len: Optional[int] = None, model_impl: str = "transformers",
                  cls: type = TorchTrainBackend):
    s = algorithm_specs(algorithm, train, total_steps, max_response_len)
    return cls(model, s.loss, s.optim, s.batch, temperature, device, critic=s.critic, model_impl=model_impl)


def megatron_backend(hf_weights, hf_config, model, parallel, algorithm: AlgorithmConfig, train: TrainConfig, temperature: float,
                     total_steps: int, device: torch.device, max_response_len: Optional[int] = None, **kw):
    # function-level: megatron is heavy, and on CPU the tests install their shim before it imports
    from slime_hydra.training.megatron.trainer import build_trainer

    s = algorithm_specs(algorithm, train, total_steps, max_response_len)
    return build_trainer(hf_weights, hf_config, model, parallel, train.megatron, s, temperature, device, **kw)


def algo_advantages(samples, algorithm: AlgorithmConfig, group_size: int, pad_id: int, trainer):
    """engine.steps.advantages with the AdvantageSpec app/algorithm.py builds from `algorithm`."""
    return advantages(samples, advantage_spec(algorithm), group_size, pad_id, trainer)
