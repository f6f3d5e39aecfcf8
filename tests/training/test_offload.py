"""training/offload.py: storages really leave (zero bytes on their device while released), come back bit for bit, and
every tensor, view and optimizer reference stays the same object; the bytes moved are the memory plan's state."""

from __future__ import annotations

import pytest
import torch

from slime_hydra.config.schema import AlgorithmConfig, ModelConfig, ParallelismConfig, TrainConfig
from slime_hydra.orchestration.train_memory import TrainInputs, train_memory
from slime_hydra.training.offload import HostOffload, module_tensors, optimizer_tensors
from tests.support.tiny import CPU, MAX_LEN, TOK, base_model, samples
from tests.support.trainers import algo_advantages, torch_backend


def test_a_linear_layer_and_adamw_move_out_and_back():
    """Linear(4, 3) with AdamW after one step: weight 12 + bias 3 floats, their gradients, two moments each, and
    AdamW's step counters (a float32 scalar per parameter): (15 · 4) · 4 + 2 · 4 = 248 bytes."""
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(m.parameters(), lr=0.1, foreach=False)
    m(torch.randn(2, 4)).sum().backward()
    opt.step()
    row = m.weight[0]  # a view: it must see the same storage after the round trip
    moment = opt.state[m.weight]["exp_avg"]
    tensors = list(module_tensors(m)) + list(optimizer_tensors(opt))
    before = [t.detach().clone() for t in tensors]
    off = HostOffload()
    assert off.release(tensors) == 248 and off.released
    assert all(t.untyped_storage().nbytes() == 0 for t in tensors)  # gone from the device (here the CPU's own heap)
    assert off.resume() == 248 and not off.released and (off.releases, off.resumes) == (1, 1)
    assert all(torch.equal(a, b) for a, b in zip(tensors, before))
    assert row.untyped_storage().data_ptr() == m.weight.untyped_storage().data_ptr() and torch.equal(row, m.weight[0])
    assert opt.state[m.weight]["exp_avg"] is moment and torch.equal(moment, before[7])  # the optimizer's own, unchanged
    m(torch.randn(2, 4)).sum().backward()
    opt.step()  # training goes on


def test_a_storage_shared_by_views_moves_once():
    flat = torch.arange(12, dtype=torch.float32)
    a, b = flat[:6].view(2, 3), flat[6:]
    off = HostOffload()
    assert off.release([a, b, flat]) == 48  # one storage of 12 floats
    off.resume()
    assert torch.equal(flat, torch.arange(12, dtype=torch.float32)) and torch.equal(b, torch.arange(6, 12, dtype=torch.float32))


def test_the_torch_trainer_moves_what_the_plan_calls_its_state():
    """After a step (AdamW's moments exist) with a reference and a critic (ppo, use_kl_loss) of the tiny float64 model:
    the bytes moved are the plan's state (8 bytes each of weights, gradients and two moments; the reference's weights;
    the critic's four on the policy's body with a value head) plus what the plan leaves out: AdamW's step counters
    (a float32 scalar per parameter tensor) and the modules' buffers (the rotary frequencies)."""
    algo = AlgorithmConfig(advantage_estimator="ppo", use_kl_loss=True, kl_loss_coef=0.1)
    train = TrainConfig(micro_batch_size=8, global_batch_size=8, num_steps_per_rollout=1, lr=1e-2)
    b = torch_backend(base_model(), algo, train, temperature=1.0, total_steps=10, device=CPU, max_response_len=MAX_LEN)
    b.freeze_reference()
    b.train_rollout(algo_advantages(samples(), algo, 2, TOK.pad_token_id, b))
    m = ModelConfig(num_layers=1, hidden_size=32, ffn_hidden_size=64, num_attention_heads=2, num_query_groups=1,
                    kv_channels=16, dtype="float64", vocab_size=len(TOK))  # tests/support/tiny.py's model, in float64
    plan = train_memory(m, ParallelismConfig(), train, TrainInputs(1, len(TOK), 16, 8, True, True, False, 0))
    left_out = 4 * (sum(1 for _ in b.model.parameters()) + sum(1 for _ in b.critic.model.parameters()))
    left_out += sum(t.numel() * t.element_size() for mod in (b.model, b.ref_model, b.critic.model) for t in mod.buffers())
    assert b.release_memory()["perf/offload_gib"] * 2**30 == plan.state + left_out
    assert all(p.untyped_storage().nbytes() == 0 for p in b.model.parameters())
    b.resume_memory()
    assert b.offload.resumes == 1 and not b.offload.released


@pytest.mark.gpu
def test_on_a_gpu_the_trainer_leaves_the_device():
    """The torch trainer on CUDA after a step: torch's allocator holds (almost) nothing while released, the device
    gets the memory back, and the step after the resume gives the same figures as a trainer never released."""
    device = torch.device("cuda")
    algo = AlgorithmConfig()
    train = TrainConfig(micro_batch_size=8, global_batch_size=8, num_steps_per_rollout=1, lr=1e-2)
    results = []
    for release in (False, True):
        b = torch_backend(base_model(), algo, train, temperature=1.0, total_steps=10, device=device, max_response_len=MAX_LEN)
        b.train_rollout(algo_advantages(samples(), algo, 2, TOK.pad_token_id, b))
        if release:
            held = torch.cuda.memory_allocated(device)
            figures = b.release_memory()
            assert torch.cuda.memory_allocated(device) < 0.05 * held, (held, figures)
            assert figures["perf/offload_left_allocated_gib"] * 2**30 < 0.05 * held, figures
            b.resume_memory()
        results.append(b.train_rollout(algo_advantages(samples(), algo, 2, TOK.pad_token_id, b)))
    assert results[0]["train/pg_loss"] == results[1]["train/pg_loss"]
    assert results[0]["train/grad_norm"] == results[1]["train/grad_norm"]
    assert results[1]["perf/train_peak_allocated_gib"] > 0
