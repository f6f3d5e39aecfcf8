"""The shipped addition task for verl, as slime_hydra runs it: its prompts as verl's parquet, its reward function,
and the overrides of verl's GRPO trainer that match the slime_hydra experiment's batch.

    python3 benchmarks/gpu/verl_addition.py data OUT_DIR           -> OUT_DIR/train.parquet, OUT_DIR/test.parquet
    python3 benchmarks/gpu/verl_addition.py overrides CKPT DATA_DIR RUN_DIR STEPS   -> one override a line
    python3 benchmarks/gpu/verl_addition.py check CKPT DATA_DIR     -> verl's own config check, dataset, prompt
        tokens and reward on this machine (no GPU): what can go wrong before verl's workers start

Rows come from slime_hydra/assets/addition/{train,test}.jsonl (`python -m slime_hydra.data.arithmetic` writes them).
verl renders each row's `prompt` (a chat list) with the tokenizer's chat template; the runs in peer_verl.sh give verl
CHAT_TEMPLATE below, which renders the user's text alone, so verl's prompt tokens are slime_hydra's ("37+58=", no
template: data.apply_chat_template=false).

`compute_score` (verl: reward.custom_reward_function.name) is slime_hydra's `reward=exact_match` verifier: 1.0 when
the stripped response equals the stripped label, else 0.0. verl decodes the response with skip_special_tokens=True,
as slime_hydra's SGLang backend does.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ASSETS = REPO / "slime_hydra" / "assets" / "addition"
DATA_SOURCE = "slime_hydra/addition"
CHAT_TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}"


def verl_rows(jsonl: Path) -> list[dict]:
    """slime_hydra's {"prompt", "label"} lines -> verl's RL rows (prompt as a one-message chat, label as ground truth)."""
    rows = []
    for i, line in enumerate(jsonl.read_text().splitlines()):
        row = json.loads(line)
        rows.append({
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": row["prompt"]}],
            "ability": "arithmetic",
            "reward_model": {"style": "rule", "ground_truth": str(row["label"])},
            "extra_info": {"index": i},
        })
    return rows


def write_parquet(out_dir: Path) -> dict[str, int]:
    import pandas as pd

    out_dir.mkdir(parents=True, exist_ok=True)
    counts = {}
    for split in ("train", "test"):
        rows = verl_rows(ASSETS / f"{split}.jsonl")
        pd.DataFrame(rows).to_parquet(out_dir / f"{split}.parquet")
        counts[split] = len(rows)
    return counts


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **_) -> float:
    if str(REPO) not in sys.path:  # verl loads this file by path inside its reward workers
        sys.path.insert(0, str(REPO))
    from slime_hydra.rewards.verifiers import exact_match_reward

    return exact_match_reward(solution_str, ground_truth)


def overrides(ckpt: str, data: str, run_dir: str, steps: int) -> list[str]:
    """verl main_ppo overrides for slime_hydra's grpo/qwen3-0.6b-addition-1n1g-torch-sglang-colocate-v1 batch:
    32 prompts x 8 samples, 6 response tokens, one optimizer step of 256 samples per rollout (micro-batches of 64),
    AdamW lr 1e-4, betas (0.9, 0.98), no weight decay, grad clip 1.0, PPO clip 0.2, no KL, no entropy term, each
    sample's token mean averaged over samples, group-normalised advantages; the engine at 0.3 of the GPU with fa3
    attention, as slime_hydra's. verl's own choices stay: FSDP with fp32 master weights, the engine's memory
    released around training (free_cache_engine) and its weights resumed for each sync."""
    cfg = {
        "algorithm.adv_estimator": "grpo", "algorithm.use_kl_in_reward": "false",
        "algorithm.norm_adv_by_std_in_grpo": "true",
        "data.train_files": f"{data}/train.parquet", "data.val_files": f"{data}/test.parquet",
        "data.train_batch_size": "32", "data.max_prompt_length": "8", "data.max_response_length": "6",
        "data.truncation": "error", "data.dataloader_num_workers": "0",
        "actor_rollout_ref.model.path": ckpt, "actor_rollout_ref.model.custom_chat_template": f"'{CHAT_TEMPLATE}'",
        "actor_rollout_ref.model.use_remove_padding": "false",  # packing needs flash-attn, absent there: sdpa, padded
        "+actor_rollout_ref.model.override_config.attn_implementation": "sdpa",
        "actor_rollout_ref.model.enable_gradient_checkpointing": "false",
        "actor_rollout_ref.actor.optim.lr": "1e-4", "actor_rollout_ref.actor.optim.weight_decay": "0.0",
        "actor_rollout_ref.actor.optim.betas": "[0.9,0.98]", "actor_rollout_ref.actor.optim.clip_grad": "1.0",
        "actor_rollout_ref.actor.grad_clip": "1.0",
        "actor_rollout_ref.actor.ppo_mini_batch_size": "32", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "64",
        "actor_rollout_ref.actor.use_kl_loss": "false", "actor_rollout_ref.actor.entropy_coeff": "0",
        "actor_rollout_ref.actor.clip_ratio": "0.2", "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-mean",
        "actor_rollout_ref.rollout.name": "sglang", "actor_rollout_ref.rollout.n": "8",
        "actor_rollout_ref.rollout.tensor_model_parallel_size": "1",
        "actor_rollout_ref.rollout.gpu_memory_utilization": "0.3",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": "64",
        "+actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend": "fa3",
        "reward.custom_reward_function.path": str(Path(__file__).resolve()),
        "reward.custom_reward_function.name": "compute_score",
        "trainer.n_gpus_per_node": "1", "trainer.nnodes": "1", "trainer.logger": "[console,file]",
        "trainer.val_before_train": "false", "trainer.test_freq": "-1", "trainer.save_freq": "-1",
        "trainer.total_training_steps": str(steps), "trainer.use_v1": "false",
        "trainer.project_name": "peer", "trainer.experiment_name": "verl",
        "trainer.default_local_dir": f"{run_dir}/checkpoints", "hydra.run.dir": f"{run_dir}/hydra",
    }
    return [f"{k}={v}" for k, v in cfg.items()]


def check(data: str, ovr: list[str]) -> None:
    """verl's own code on these overrides, without its workers: the config composes and passes validate_config, the
    model config loads (tokenizer with CHAT_TEMPLATE, HF config with sdpa), the dataset reads the parquet, the agent
    loop's prompt tokens equal slime_hydra's, and the reward function loads and scores 1 / 0."""
    from hydra import compose, initialize_config_dir
    from verl.trainer import main_ppo
    from verl.trainer.ppo.reward import get_custom_reward_fn
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config
    from verl.utils.dataset.rl_dataset import RLHFDataset
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    with initialize_config_dir(str(Path(main_ppo.__file__).parent / "config"), version_base=None):
        cfg = compose("ppo_trainer", overrides=[o for o in ovr if not o.startswith("hydra.")])
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    model = omega_conf_to_dataclass(cfg.actor_rollout_ref.model)
    tok = model.tokenizer
    rows = RLHFDataset(cfg.data.train_files, tok, cfg.data)
    builder = create_continuous_token_builder(tok, hf_model_type=model.hf_config.model_type, processor=None)
    score = get_custom_reward_fn(cfg)
    seen = []
    for i in (0, 1, len(rows) - 1):
        row = rows[i]
        text, label = row["raw_prompt"][0]["content"], row["reward_model"]["ground_truth"]
        ids = builder.build_initial_tokens(list(row["raw_prompt"]))
        slime_ids = tok(text, add_special_tokens=False)["input_ids"]  # slime_hydra's data/dataset.py
        assert ids == slime_ids, (text, ids, slime_ids)
        answer = tok(label, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        merged = builder.merge_assistant_tokens(ids, answer).token_ids[len(ids):]
        response = tok.decode(merged, skip_special_tokens=True)
        right = score(data_source=row["data_source"], solution_str=response, ground_truth=label, extra_info={})
        wrong = score(data_source=row["data_source"], solution_str=response + "1", ground_truth=label, extra_info={})
        assert (right, wrong) == (1.0, 0.0), (response, label, right, wrong)
        seen.append(f"{text!r} -> {ids} ; {response!r} scores {right}")
    print(f"verl config valid ({len(ovr)} overrides), model_type {model.hf_config.model_type}, attention "
          f"{model.hf_config._attn_implementation}, {len(rows)} prompts in {data}/train.parquet")
    print("\n".join(seen))


if __name__ == "__main__":
    cmd, args = (sys.argv[1], sys.argv[2:]) if len(sys.argv) > 1 else ("", [])
    if cmd == "data" and len(args) == 1:
        print(json.dumps(write_parquet(Path(args[0]))))
    elif cmd == "overrides" and len(args) == 4:
        print("\n".join(overrides(args[0], args[1], args[2], int(args[3]))))
    elif cmd == "check" and len(args) == 2:
        check(args[1], overrides(args[0], args[1], "/tmp/verl_addition_check", 2))
    else:
        sys.exit(__doc__)
