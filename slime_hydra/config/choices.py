"""The allowed values of every enumerated key: part of the schema (config/schema.py), kept beside it as one table.

config/checks.py refuses a value outside its row. algorithm.advantage_estimator is not here: its names are the rows
of algorithms/estimators.py, and algorithms/checks.py checks it.
"""

from __future__ import annotations

CHOICES: dict[str, tuple[str, ...]] = {
    "algorithm.loss_type": ("policy_loss", "sft_loss", "custom_loss"),
    "algorithm.kl_loss_type": ("k1", "k2", "k3", "low_var_kl"),
    "algorithm.loss_aggregation": ("sample_token_mean", "token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"),
    "rollout.backend": ("local", "sglang"),
    "train.backend": ("torch", "megatron"),
    "train.lr_decay_style": ("constant", "linear", "cosine"),
    "train.adam_impl": ("fused", "foreach", "for_loop"),
    "train.qkv_format": ("bshd", "thd"),
    "train_mode": ("sync", "async"),
    "logger.tracker": ("mlflow", "tensorboard", "wandb", "none"),
    "logger.wandb_mode": ("offline", "online", "disabled"),
    "logger.sweep_rank_direction": ("max", "min"),
    "model.dtype": ("float32", "bfloat16", "float16", "float64"),  # float64: exactness tests on CPU
    "model.attn_implementation": ("sdpa", "eager"),
    "model.model_impl": ("transformers", "native", "auto"),
    "reward.rm_on_failure": ("zero", "raise"),
    "data.on_bad_row": ("error", "skip"),
    "cluster.device": ("auto", "cpu", "cuda"),
    "model.tokenizer": ("char", "char_tools"),
    "cluster.backend": ("local", "ray"),
}
