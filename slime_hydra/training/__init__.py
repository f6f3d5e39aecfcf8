"""Training backends behind one Protocol: `torch` (HF model + AdamW) and `megatron`."""
