"""Diagnostic: 3 SFT steps of the megatron and torch backends from one init on the same batch (CPU under the shim, or CUDA)."""

import copy
import sys

import torch

dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
if dev.type == "cpu":
    from tests.support.megatron_cpu import shim

    shim.install()
from tests.support.megatron_cpu.workers import fixed_batch, tiny_setup  # noqa: E402
from tests.support.trainers import megatron_backend, torch_backend  # noqa: E402

cfg, tok, hf = tiny_setup(sys.argv[1:])
hf = hf.to(dev)
hf2 = copy.deepcopy(hf)
h0 = {k: v.clone() for k, v in hf.state_dict().items()}
mb = megatron_backend(hf.state_dict(), hf.config, cfg.model, cfg.parallelism, cfg.algorithm, cfg.train, 1.0, 10, dev)
tb = torch_backend(hf2, cfg.algorithm, cfg.train, 1.0, 10, dev)
b = fixed_batch()
for i in range(3):
    print("sft loss megatron / torch", mb.sft_step(b, 1e-3), tb.sft_step(b, 1e-3))
w, t = dict(mb.named_weights()), dict(hf2.named_parameters())
print("max |w_megatron - w_torch| after 3 steps:", max((w[k] - t[k].detach()).abs().max().item() for k in t),
      "max |update|:", max((t[k].detach() - h0[k]).abs().max().item() for k in t))
print("rl metrics", mb.train_rollout(b))
print("rl metrics torch", tb.train_rollout(b))
