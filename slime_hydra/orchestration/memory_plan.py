"""The memory of one GPU of a run, phase by phase, against the device: the trainer (orchestration/train_memory.py)
beside the rollout engine that shares its GPU, before anything starts.

SGLang (0.5.2x) sizes an engine from the free memory F of its GPU, measured before it loads the weights: it keeps
mem_fraction_static × F for weights, KV cache and CUDA graphs (its KV pool is what is left after the weights, cut
again after graph capture so that (1 - mem_fraction_static) × F stays free for its activations). F is the device's
memory less one CUDA context per process and what the trainer holds when the engines start: nothing with
cluster.offload_train (the trainer is released before the engines start: app/build.py), else its built state.
The H200 fits this to 1%: at mem_fraction_static=0.3 beside a 0.6B torch trainer, 40.45 GiB of KV and 1.11 GiB of
weights (docs/gpu_results.md) are 0.3 × 138.5 GiB, 140.4 GiB less ~1.6 GiB of contexts and trainer weights.

A colocated GPU goes through two phases every rollout; its peak is the larger:
  generate: the trainer, as the caching allocator left it after its step (its peak; nothing once offload_train has
            released it) + the engine's pool,
  train:    the trainer's peak, or its state and the weights staged for a sync (the larger) + what the engine keeps:
            its pool, or only its weights with offload_rollout (which releases KV cache and CUDA graphs).
Worked example (docs/memory.md): Qwen3-4B on one 140 GiB GPU, megatron at 4096 tokens per micro-batch (the trainer's
peak 90.99 GiB, built 37.46, state 67.43, 3.34 staged for the engine between syncs), one SGLang engine (weights 7.49)
at mem_fraction_static=0.5. Without offload F = 140 - 1 - 37.46 = 101.54, the pool 50.77, and generating takes
1 + 90.99 + 3.34 + 50.77 = 146.1 GiB: it does not fit. With both offloads F = 139.0, the pool 69.50; generating takes
1 + 69.50 = 70.5 and training 1 + 90.99 + 7.49 = 99.5: it fits, only with offload (at 0.3 it fits without: 125.8).
The local engine (rollout.backend=local) runs in the trainer's process: its weights always, and one generation
batch's KV cache (rollout.generation_batch_size × the longest sample) while it generates.
Left out: the engines' own activations (inside what SGLang leaves free), allocator fragmentation, NCCL buffers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from slime_hydra.config.schema import ModelConfig
from slime_hydra.orchestration.train_memory import CONTEXT_GIB, DTYPE_BYTES, GIB, Layout, TrainMemory, rank_params

CONTEXT = int(CONTEXT_GIB * GIB)


@dataclass(frozen=True)
class EngineMemory:
    """One engine rank's GPU: its weights and KV cache per token; the pool SGLang sizes (None: not known here)."""

    weights: int
    kv_per_token: int
    mem_fraction_static: Optional[float]  # SGLang's; None: unset (SGLang picks) or a local engine
    local_kv: int = 0  # rollout.backend=local: one generation batch's KV cache


def engine_memory(m: ModelConfig, vocab: int, tp: int, mem_fraction_static: Optional[float], local_tokens: int = 0
                  ) -> EngineMemory:
    """Weights split over the engine's `tp` GPUs (its vocabulary unpadded); KV per token: k and v of every layer, the
    query groups split over TP (replicated when fewer than TP), or MLA's compressed latent and rotary key."""
    a = DTYPE_BYTES[m.dtype]
    weights = rank_params(m, Layout(tp, tp=tp), vocab, pad=False).total * a
    if m.multi_latent_attention:
        kv = m.num_layers * (m.kv_lora_rank + m.qk_pos_emb_head_dim) * a
    else:
        kv = 2 * m.num_layers * max(m.num_query_groups // tp, 1) * m.kv_channels * a
    return EngineMemory(weights, kv, mem_fraction_static, kv * local_tokens)


@dataclass(frozen=True)
class GpuMemory:
    """Bytes of one GPU in each phase, and the SGLang pool they assume (None where no SGLang engine shares it)."""

    generate: int
    train: int
    pool: Optional[int] = None
    free_at_start: Optional[int] = None

    @property
    def peak(self) -> int:
        return max(self.generate, self.train)


def train_side(t: TrainMemory, offload_train: bool) -> int:
    """What the trainer holds while it trains and syncs: its step's peak, or at a sync its state, the new staged copy
    of the weights and a bucket; the previous staged copy on top of both, except where offload_train moved it to the
    host while the engines generated."""
    kept = 0 if offload_train else t.staging
    return kept + max(t.peak, t.state + t.staging + t.bucket)


def generate_side(t: TrainMemory, offload_train: bool) -> int:
    """What the trainer holds while the engines generate: nothing once released, else its step's peak (the caching
    allocator keeps it) and the staged copy of the weights."""
    return 0 if offload_train else t.peak + t.staging


def colocated(t: TrainMemory, e: EngineMemory, device: Optional[int], offload_train: bool, offload_rollout: bool,
              sglang: bool) -> Optional[GpuMemory]:
    """One GPU holding a train rank and an engine rank (module docstring); None when SGLang's pool is not known."""
    if not sglang:  # the local engine: in the trainer's process, never released
        return GpuMemory(CONTEXT + generate_side(t, offload_train) + e.weights + e.local_kv,
                         CONTEXT + train_side(t, offload_train) + e.weights)
    if e.mem_fraction_static is None or device is None:
        return None
    free = device - 2 * CONTEXT - (0 if offload_train else t.built)
    pool = int(e.mem_fraction_static * max(free, 0))
    kept = e.weights if offload_rollout else pool
    return GpuMemory(2 * CONTEXT + generate_side(t, offload_train) + pool, 2 * CONTEXT + train_side(t, offload_train) + kept,
                     pool, free)


def train_only(t: TrainMemory) -> GpuMemory:
    """A train rank's GPU without an engine (disaggregated, or nothing generates)."""
    return GpuMemory(CONTEXT + t.peak + t.staging, CONTEXT + train_side(t, offload_train=False))


def engine_only(e: EngineMemory, device: Optional[int]) -> Optional[GpuMemory]:
    """An engine rank's GPU without a trainer: SGLang takes its fraction of what the context leaves."""
    if e.mem_fraction_static is None or device is None:
        return None
    free = device - CONTEXT
    pool = int(e.mem_fraction_static * free)
    return GpuMemory(CONTEXT + pool, CONTEXT + pool, pool, free)


def largest_fraction(t: TrainMemory, device: int, offload_train: bool) -> float:
    """The highest mem_fraction_static whose colocated layout fits with the engine keeping its pool while training:
    2·context + the trainer's side + f × F <= device, F as `colocated` computes it."""
    free = device - 2 * CONTEXT - (0 if offload_train else t.built)
    if free <= 0:
        return 0.0
    trainer = max(train_side(t, offload_train), generate_side(t, offload_train))
    return max(0.0, (device - 2 * CONTEXT - trainer) / free)
