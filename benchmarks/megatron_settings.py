"""What the megatron benchmarks share: the H200's bf16 matmul rate the MFU figures divide by, the best settings
found on it (docs/gpu_results.md, "Megatron trainer throughput"), and the FLOPs of a token (bench_megatron's docstring)."""

from __future__ import annotations

PEAK = 790e12
# the first 4B winner: torch.compile of each layer, bf16 gradient buffers
V1 = ("train.megatron.compile_layers=true", "train.megatron.grad_reduce_in_fp32=false")
# + what a profile of V1 then found (eager fp32 log-prob passes ~160 ms and foreach AdamW ~76 ms of a 1.17 s step):
# fused log-prob kernels, torch's fused AdamW
BEST = V1 + ("train.megatron.compile_log_probs=true", "train.adam_impl=fused")


def flops_per_token(m, seq: int, vocab: int) -> float:
    d_attn = m.num_attention_heads * m.kv_channels
    kv = m.num_query_groups * m.kv_channels
    per_layer = m.hidden_size * (d_attn + 2 * kv) + d_attn * m.hidden_size + 3 * m.hidden_size * m.ffn_hidden_size
    n = m.num_layers * per_layer + vocab * m.hidden_size  # + the output projection
    return 6 * n + 6 * m.num_layers * seq * d_attn
