"""Every backend class assigned to the Protocol it implements; mypy (tests/static/test_typecheck.py) reports here any
method a backend lacks or declares with an incompatible signature. A new backend adds one line."""

from __future__ import annotations

from slime_hydra.agent.hook import AgentRollout
from slime_hydra.data.source import PromptSource as InMemorySource
from slime_hydra.data.stream import StreamingPromptSource
from slime_hydra.orchestration.megatron_group import MegatronTrainGroup
from slime_hydra.orchestration.rank_weights import RankWeights, WeightsRef
from slime_hydra.orchestration.rollout_manager import RemoteRollout, RemoteSource
from slime_hydra.orchestration.train_group import TrainGroup
from slime_hydra.protocols import InProcessWeights, PromptSource, RolloutBackend, Scorer, Tracker, TrainBackend, Weights
from slime_hydra.rewards.compute import RewardScorer
from slime_hydra.rollout.local import LocalRollout
from slime_hydra.rollout.replay import NoWeightSync, ReplayRollout
from slime_hydra.rollout.sglang.backend import SGLangRollout
from slime_hydra.rollout.sglang.sources import LocalTensors, Sender
from slime_hydra.tracking.base import NullTracker
from slime_hydra.tracking.mlflow_tracker import MLflowTracker
from slime_hydra.tracking.tensorboard_tracker import TensorBoardTracker
from slime_hydra.tracking.wandb_tracker import WandbTracker
from slime_hydra.training.collectives import Collectives, OneProcess
from slime_hydra.training.distributed import DataParallel
from slime_hydra.training.megatron.trainer import MegatronTrainBackend
from slime_hydra.training.noop import NoTrain
from slime_hydra.training.torch_backend import TorchTrainBackend


def rollout_backends(local: LocalRollout, sglang: SGLangRollout, remote: RemoteRollout, agent: AgentRollout,
                     replay: ReplayRollout, no_sync: NoWeightSync) -> None:
    r: RolloutBackend
    r = local
    r = sglang
    r = remote
    r = agent
    r = replay
    r = no_sync


def train_backends(torch_: TorchTrainBackend, megatron: MegatronTrainBackend, ray_group: TrainGroup,
                   ray_megatron: MegatronTrainGroup, no_train: NoTrain) -> None:
    t: TrainBackend
    t = torch_
    t = megatron
    t = ray_group
    t = ray_megatron
    t = no_train


def weights(in_process: InProcessWeights, ranks: RankWeights, object_store: WeightsRef) -> None:
    w: Weights
    w = in_process
    w = ranks
    w = object_store


def senders(local: LocalTensors, ranks: RankWeights) -> None:
    s: Sender
    s = local
    s = ranks


def collectives(one: OneProcess, data_parallel: DataParallel) -> None:
    c: Collectives
    c = one
    c = data_parallel


def trackers(mlflow: MLflowTracker, tensorboard: TensorBoardTracker, wandb: WandbTracker, null: NullTracker) -> None:
    k: Tracker
    k = mlflow
    k = tensorboard
    k = wandb
    k = null


def scorers(reward: RewardScorer) -> None:
    s: Scorer
    s = reward


def prompt_sources(memory: InMemorySource, streamed: StreamingPromptSource, remote: RemoteSource) -> None:
    p: PromptSource
    p = memory
    p = streamed
    p = remote
