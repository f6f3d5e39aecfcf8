"""Model zoo options, the HF config.json check (`slime-hydra check-hf`) and megatron layout checks (no megatron import)."""

from __future__ import annotations

import json

import pytest

from slime_hydra.app.preflight import compose_run, preflight
from slime_hydra.cli import check_hf_command
from slime_hydra.errors import ConfigError
from slime_hydra.models.hf_check import check_hf_config, moe_layer_pattern
from tests.support.runs import ROOT

# Qwen3-0.6B's config.json (Qwen/Qwen3-0.6B), written out by hand: the fields the check reads
QWEN3_0_6B = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072,
              "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
              "rms_norm_eps": 1e-06, "rope_theta": 1000000, "vocab_size": 151936, "tie_word_embeddings": True,
              "max_position_embeddings": 40960, "torch_dtype": "bfloat16"}
# DeepSeek-V3's config.json fields (deepseek-ai/DeepSeek-V3)
DEEPSEEK_V3 = {"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
               "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128, "n_routed_experts": 256,
               "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3, "n_group": 8, "topk_group": 4,
               "routed_scaling_factor": 2.5, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
               "qk_rope_head_dim": 64, "v_head_dim": 128, "rms_norm_eps": 1e-06, "rope_theta": 10000, "vocab_size": 129280,
               "tie_word_embeddings": False, "rope_scaling": {"type": "yarn", "factor": 40}}


def _write(tmp_path, name, cfg):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg, indent=2))
    return d


def test_model_option_matches_its_config_json(tmp_path):
    assert check_hf_config(compose_run(["model=qwen3_0_6b"]).model, _write(tmp_path, "q", QWEN3_0_6B)) == []
    assert check_hf_config(compose_run(["model=deepseek_v3"]).model, _write(tmp_path, "d", DEEPSEEK_V3)) == []


def test_every_mismatch_is_named(tmp_path):
    bad = {**QWEN3_0_6B, "num_key_value_heads": 4, "rope_theta": 10000, "tie_word_embeddings": False, "head_dim": 64}
    probs = check_hf_config(compose_run(["model=qwen3_0_6b"]).model, _write(tmp_path, "q", bad))
    text = "\n".join(probs)
    assert len(probs) == 4, probs
    assert "model.num_query_groups=8 does not match config.json num_key_value_heads=4" in text
    assert "model.rotary_base=1000000.0 does not match config.json rope_theta=10000" in text
    assert "model.untie_embeddings_and_output_weights=False does not match config.json tie_word_embeddings=False" in text
    assert "model.kv_channels=128 does not match config.json head_dim=64" in text


def test_qwen3_4b_is_not_qwen3_0_6b(tmp_path):
    probs = check_hf_config(compose_run(["model=qwen3_4b"]).model, _write(tmp_path, "q", QWEN3_0_6B))
    named = {p.split("model.")[1].split("=")[0] for p in probs}
    assert named == {"num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads"}  # 36/2560/9728/32 vs 28/1024/3072/16


def test_validation_runs_the_check_for_the_megatron_backend(tmp_path):
    d = _write(tmp_path, "q", {**QWEN3_0_6B, "num_hidden_layers": 24})
    with pytest.raises(ConfigError) as e:
        preflight(["model=qwen3_0_6b", "train=megatron", f"model.hf_checkpoint={d}"])
    assert "model.num_layers=28 does not match config.json num_hidden_layers=24" in str(e.value)


def test_cli_entry_exits_2_on_mismatch(tmp_path, capsys):
    d = _write(tmp_path, "q", {**QWEN3_0_6B, "rms_norm_eps": 1e-5})
    assert check_hf_command([str(d), "model=qwen3_0_6b"]) == 2
    assert "model.norm_epsilon=1e-06 does not match config.json rms_norm_eps=1e-05" in capsys.readouterr().out
    assert check_hf_command([str(_write(tmp_path, "ok", QWEN3_0_6B)), "model=qwen3_0_6b"]) == 0


def test_moe_layer_freq_expressions():
    assert moe_layer_pattern("([0]*3+[1]*58)", 61) == [0] * 3 + [1] * 58
    assert moe_layer_pattern(1, 4) == [1, 1, 1, 1]
    assert moe_layer_pattern(2, 4) == [1, 0, 1, 0]
    assert moe_layer_pattern("[1,0,1]", 3) == [1, 0, 1]


@pytest.mark.parametrize("option", sorted(p.stem for p in (ROOT / "conf" / "model").glob("*.yaml")))
def test_every_zoo_option_validates_with_megatron(option):
    assert compose_run([f"model={option}", "train=megatron"]).train.backend == "megatron"


def test_megatron_moe_limits_name_the_keys():
    with pytest.raises(ConfigError) as e:
        preflight(["model=qwen3_30b_a3b", "train=megatron", "model.moe_grouped_gemm=true",
                   "parallelism.expert_model_parallel_size=3", "parallelism.tensor_model_parallel_size=2",
                   "model.moe_token_dispatcher_type=allgather", "parallelism.expert_tensor_parallel_size=5"])
    text = str(e.value)
    assert "set model.moe_grouped_gemm=false" in text
    assert "parallelism.expert_model_parallel_size=3 must divide model.num_experts=128" in text
    assert "parallelism.expert_tensor_parallel_size=5 must divide model.moe_ffn_hidden_size=768" in text
    assert "set model.moe_token_dispatcher_type=alltoall" in text
    assert "set parallelism.sequence_parallel=true" in text


def test_expert_parallelism_is_accepted_where_megatron_runs_it():
    (cfg,) = preflight(["model=qwen3_30b_a3b", "train=megatron", "parallelism.expert_model_parallel_size=8",
                     "parallelism.tensor_model_parallel_size=4", "parallelism.sequence_parallel=true",
                     "parallelism.expert_tensor_parallel_size=1", "cluster.backend=ray", "cluster.actor_num_gpus_per_node=8",
                     "cluster.device=cpu"])
    assert cfg.parallelism.expert_model_parallel_size == 8


def test_expert_layout_and_dense_models_name_the_keys():
    with pytest.raises(ConfigError) as e:  # 6 ranks: the experts' grid ETP × EP × PP = 1 × 4 × 1 does not divide them
        preflight(["model=qwen3_30b_a3b", "train=megatron", "parallelism.expert_model_parallel_size=4",
                   "parallelism.expert_tensor_parallel_size=1", "cluster.backend=ray", "cluster.actor_num_gpus_per_node=6",
                   "cluster.device=cpu"])
    assert "= 1 × 4 × 1 = 4 must divide the train ranks" in str(e.value)
    with pytest.raises(ConfigError) as e:
        preflight(["train=megatron", "parallelism.expert_model_parallel_size=2"])
    assert "model.num_experts=null" in str(e.value) and "set them to 1 / null" in str(e.value)


def test_parallel_layout_errors_name_the_keys():
    with pytest.raises(ConfigError) as e:
        preflight(["train=megatron", "parallelism.tensor_model_parallel_size=3", "parallelism.pipeline_model_parallel_size=3",
                   "parallelism.context_parallel_size=2", "parallelism.recompute_granularity=full"])
    text = str(e.value)
    assert "tensor_model_parallel_size=3 must divide model.num_attention_heads=4" in text
    assert "pipeline_model_parallel_size=3 must divide model.num_layers=4" in text
    assert "context_parallel_size=2" in text and "recompute_method=uniform|block" in text


def test_megatron_speed_keys_are_validated_naming_the_keys():
    with pytest.raises(ConfigError) as e:  # this machine has no CUDA device: compile cannot work here
        compose_run(["train=megatron", "train.megatron.compile_layers=true", "train.megatron.log_probs_chunk_size=0",
                     "parallelism.recompute_modules=[mlp,attn]"])
    msg = str(e.value)
    assert "train.megatron.compile_layers=true needs a CUDA device" in msg and "cluster.device=cuda" in msg
    assert "train.megatron.log_probs_chunk_size=0 must be >= 1" in msg
    assert "parallelism.recompute_modules applies only with parallelism.recompute_granularity=selective" in msg
    assert "['attn'] not among" in msg
    with pytest.raises(ConfigError) as e:
        compose_run(["train=megatron", "train.megatron.compile_log_probs=true", "train.adam_impl=apex"])
    msg = str(e.value)
    assert "train.megatron.compile_log_probs=true needs a CUDA device" in msg
    assert "set train.megatron.compile_log_probs=false or cluster.device=cuda" in msg
    assert "train.adam_impl='apex' is not one of ['fused', 'foreach', 'for_loop']" in msg
    with pytest.raises(ConfigError) as e:  # set with the torch backend they would be ignored
        compose_run(["train.megatron.grad_reduce_in_fp32=false"])
    assert "train.megatron.grad_reduce_in_fp32 apply only with train.backend=megatron" in str(e.value)
    cfg = compose_run(["train=megatron", "cluster.device=cuda", "train.megatron.compile_layers=true",
                       "parallelism.recompute_granularity=selective", "parallelism.recompute_modules=[mlp]",
                       "train.megatron.log_probs_chunk_size=-1", "train.megatron.compile_log_probs=true",
                       "train.adam_impl=foreach"])  # validation touches no GPU: fine on CPU (foreach: not the default)
    assert cfg.train.megatron.compile_layers and cfg.parallelism.recompute_modules == ["mlp"]
    assert cfg.train.megatron.compile_log_probs and cfg.train.adam_impl == "foreach"


def test_default_micro_batch_is_a_data_parallel_rank_s_share():
    """train.micro_batch_size=null: one micro-batch per step and data-parallel rank. 4 Ray ranks are 4 torch DP ranks,
    but megatron's TP=2 leaves 2 DP ranks (and TP=2 x PP=2, one): 32 samples a step -> 8, 16, 32."""
    base = ["train.global_batch_size=32", "train.num_steps_per_rollout=1", "rollout.rollout_batch_size=8",
            "rollout.n_samples_per_prompt=4", "train.micro_batch_size=null", "cluster.backend=ray",
            "cluster.actor_num_gpus_per_node=4"]
    assert compose_run(base).train.micro_batch_size == 8
    megatron = base + ["train=megatron", "parallelism.tensor_model_parallel_size=2"]
    assert compose_run(megatron).train.micro_batch_size == 16
    assert compose_run(megatron + ["parallelism.pipeline_model_parallel_size=2"]).train.micro_batch_size == 32
    # the batch checks count the same data-parallel ranks: 16 divides TP=2's share (32 / 2), 32 does not
    with pytest.raises(ConfigError) as e:
        compose_run(megatron + ["train.micro_batch_size=32"])
    assert ("train.micro_batch_size=32 must divide the per-rank batch train.global_batch_size / data-parallel ranks = "
            "32 / 2 = 16; set train.micro_batch_size to a divisor of 16") in str(e.value)
