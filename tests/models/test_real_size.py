"""Real-size models: the parameter count from the dimensions, the learning-rate rules, and runs that start from a
Hugging Face checkpoint directory written by `python -m slime_hydra.models.random_checkpoint`."""

from __future__ import annotations

import json

import pytest
import torch

from slime_hydra.app.preflight import check_composed, compose_run
from slime_hydra.config.compose import Composer, check_overrides
from slime_hydra.errors import ConfigError
from slime_hydra.models.size import num_parameters
from slime_hydra.training.checks import max_lost_lr
from tests.support.runs import FAST, run_cli

# Qwen3-0.6B's config.json, the fields the checks read (values of the released model)
QWEN3_0_6B = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072,
              "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
              "vocab_size": 151936, "tie_word_embeddings": True, "rope_theta": 1000000, "rms_norm_eps": 1e-6}


def validated(overrides: list[str]):
    """(typed config or None, problems, notes) of one composed run."""
    with Composer() as c:
        cfg, problems = check_overrides(c, overrides)
    typed, more, notes = check_composed(cfg)
    return typed, problems + more, notes


def warnings_of(notes: list[str]) -> list[str]:
    return [n for n in notes if n.startswith("warning:")]


@pytest.fixture
def qwen3_0_6b_dir(tmp_path):
    """A directory holding only Qwen3-0.6B's config.json: all that validation reads."""
    d = tmp_path / "qwen3-0.6b"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(QWEN3_0_6B))
    return d


def test_parameter_count_from_dimensions_by_hand():
    # embedded default (h 128, 4 layers, ffn 384, 4 heads, 2 groups, head dim 32, tied), per layer:
    #   q 128*128 + k,v 2*128*64 + o 128*128 = 49,152; q/k norms 2*32; two norms 2*128; SwiGLU 3*128*384 = 147,456
    #   = 196,928; x4 = 787,712; + embedding 59*128 = 7,552 + final norm 128 = 795,392 (untied: + 7,552 = 802,944)
    assert num_parameters(compose_run(["model.vocab_size=59"]).model) == 795_392
    assert num_parameters(compose_run(["model.vocab_size=59", "model.untie_embeddings_and_output_weights=true"]).model) == 802_944
    # Qwen3-0.6B per layer: q 1024*2048 + k,v 2*1024*1024 + o 2048*1024 = 6,291,456; norms 2*128 + 2*1024 = 2,304;
    #   SwiGLU 3*1024*3072 = 9,437,184; = 15,730,944, x28 = 440,466,432; + embedding 151,936*1024 = 155,582,464
    #   + final norm 1,024 = 596,049,920
    assert num_parameters(compose_run(["model=qwen3_0_6b", "train.lr=1e-6", "train.min_lr=0"]).model) == 596_049_920


def test_parameter_count_equals_the_built_model():
    """The same count as transformers' parameters (tied weights once), for both embedding layouts."""
    from slime_hydra.models.build import build_model, build_tokenizer

    for untie in ("false", "true"):
        m = compose_run([f"model.untie_embeddings_and_output_weights={untie}"]).model
        tok = build_tokenizer(m)
        net = build_model(m, tok, seed=0)
        m.vocab_size = len(tok)
        assert num_parameters(m) == sum(p.numel() for p in net.parameters())


def test_high_lr_is_refused_for_a_real_size_checkpoint(qwen3_0_6b_dir):
    """The embedded default's train.lr=2e-4 on Qwen3-0.6B weights from a checkpoint: exit 2 naming the key, a value
    and the escape hatch; the size comes from config.json, whatever the model group says (here: the tiny option)."""
    with pytest.raises(ConfigError) as e:
        compose_run([f"model.hf_checkpoint={qwen3_0_6b_dir}"])
    (problem,) = [p for p in e.value.problems if "train.lr" in p]
    assert problem.startswith("train.lr=0.0002 is too high for RL of a 596M-parameter model")
    assert f"{qwen3_0_6b_dir}/config.json" in problem
    assert "set train.lr=1e-06" in problem and "train.allow_unsafe_lr=true" in problem
    assert "with train.min_lr=0 (slime's default; now 2e-05, above the new rate)" in problem  # the cosine floor too
    assert "refused: the weights come from model.hf_checkpoint" in problem
    assert compose_run([f"model.hf_checkpoint={qwen3_0_6b_dir}", "train.lr=1e-5", "train.min_lr=0"]).train.lr == 1e-5  # passes
    assert compose_run([f"model.hf_checkpoint={qwen3_0_6b_dir}", "train.allow_unsafe_lr=true"]).train.lr == 2e-4


def test_high_critic_lr_is_refused_too(qwen3_0_6b_dir):
    problems = validated([f"model.hf_checkpoint={qwen3_0_6b_dir}", "algorithm=ppo", "train.lr=1e-6",
                          "train.critic_lr=1e-4"])[1]
    assert [p.split(" is too")[0] for p in problems if "too high" in p] == ["train.critic_lr=0.0001"]


def test_high_lr_on_a_random_init_warns():
    """No checkpoint: the warm start is all there is to lose; a warning, not a refusal. The tiny model: neither."""
    typed, problems, notes = validated(["model=qwen3_0_6b"])  # the embedded default's lr 2e-4
    assert problems == []
    (w,) = [n for n in warnings_of(notes) if "too high" in n]
    assert w.startswith("warning: train.lr=0.0002 is too high for RL of a 596M-parameter model (the model group's fields")
    assert warnings_of(validated(["model=qwen3_0_6b", "train.allow_unsafe_lr=true"])[2]) == []
    assert warnings_of(validated([])[2]) == []


def test_torch_half_precision_lr_warning():
    # the median |w| of N(0, 0.02) is 0.6745 * 0.02 = 0.01349; half a bf16 step of it is at least 0.01349 * 2^-9
    assert max_lost_lr("bfloat16", 0.02) == pytest.approx(2.6348e-5, rel=1e-4)
    assert max_lost_lr("float16", 0.02) == pytest.approx(0.01349 * 2 ** -12, rel=1e-3)
    assert max_lost_lr("float32", 0.02) is None
    def rounding(overrides):
        return [w for w in warnings_of(validated(["model=qwen3_0_6b", *overrides])[2]) if "rounds away" in w]

    (w,) = rounding(["train.lr=1e-5"])  # bf16 is the option's dtype
    assert w.startswith("warning: train.backend=torch updates the weights in model.dtype=bfloat16 itself")
    assert "needs train.lr >= 2.6e-05" in w and "set model.dtype=float32" in w and "or train.backend=megatron" in w
    assert rounding(["train.lr=1e-5", "model.dtype=float32"]) == []
    assert rounding(["train.lr=1e-5", "train=megatron"]) == []  # fp32 main params
    assert rounding(["train.lr=5e-5"]) == []  # above the bound (and warned as too high for a random init)


def test_bf16_adamw_steps_round_away_as_the_warning_says():
    """A real AdamW step on bf16 weights of N(0, 0.02), step size lr = 1e-5 (Adam's first step is lr * sign(grad)):
    a weight keeps its value when half its bf16 spacing exceeds 1e-5, i.e. 2^(e-8) > 1e-5 for |w| in [2^e, 2^(e+1)):
    e >= -8, |w| >= 2^-8 = 0.0039. P(|w| >= 0.0039) = 2 (1 - Phi(0.0039 / 0.02)) = 2 (1 - Phi(0.1953)) = 0.845.
    In float32 none does."""
    from slime_hydra.training.optim import adamw

    g = torch.Generator().manual_seed(0)
    w = torch.randn(100_000, generator=g) * 0.02
    for dtype, expected in ((torch.bfloat16, 0.845), (torch.float32, 0.0)):
        before = w.to(dtype)
        p = torch.nn.Parameter(before.clone())
        opt = adamw([p], "for_loop", lr=1e-5)
        p.grad = torch.ones_like(p)
        opt.step()
        kept = (p.detach() == before).float().mean().item()
        assert kept == pytest.approx(expected, abs=0.01), (dtype, kept)  # binomial std 0.0011 on 1e5 weights


def test_missing_checkpoint_dir_is_named_before_anything_starts(tmp_path):
    with pytest.raises(ConfigError) as e:
        compose_run([f"model.hf_checkpoint={tmp_path}/nowhere"])
    assert (f"model.hf_checkpoint={tmp_path}/nowhere: config.json not found; point model.hf_checkpoint at a Hugging "
            f"Face model directory (a random one: python -m slime_hydra.models.random_checkpoint {tmp_path}/nowhere "
            "model=<option>)") in e.value.problems


def test_random_checkpoint_cli_refuses_a_non_empty_dir_and_a_missing_one(tmp_path, capsys):
    from slime_hydra.models.random_checkpoint import main

    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep.txt").write_text("a real checkpoint, maybe")
    assert main([str(tmp_path / "x")]) == 2
    assert main(["model=qwen3_tiny"]) == 2  # no DIR and no model.hf_checkpoint
    assert main([str(tmp_path / "y"), "model=qwen9"]) == 2
    err = capsys.readouterr().err
    assert "exists and is not an empty directory" in err and "no directory to write" in err and "model=qwen9" in err
    assert (tmp_path / "x" / "keep.txt").read_text() == "a real checkpoint, maybe" and not (tmp_path / "y").exists()


@pytest.fixture(scope="module")
def random_dir(tmp_path_factory):
    """The embedded default's model written by the CLI entry (float32, the character tokenizer, seed 1234)."""
    from slime_hydra.models.random_checkpoint import main

    d = tmp_path_factory.mktemp("hf") / "qwen3-tiny-random"
    assert main([str(d), "seed=1234"]) == 0
    return d


def test_random_checkpoint_loads_offline_with_transformers(random_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from slime_hydra.models.build import build_model, build_tokenizer

    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {p.name for p in random_dir.iterdir()}
    tok = AutoTokenizer.from_pretrained(random_dir)
    chat = tok.apply_chat_template([{"role": "user", "content": "12+34="}], add_generation_prompt=True, tokenize=False)
    assert chat == "<|im_start|>user\n12+34=<|im_end|>\n<|im_start|>assistant\n"
    net = AutoModelForCausalLM.from_pretrained(random_dir)
    m = compose_run([]).model
    init = build_model(m, build_tokenizer(m), seed=1234)  # what a run without model.hf_checkpoint starts from
    assert tok("12+34=")["input_ids"] == build_tokenizer(m)("12+34=")["input_ids"]
    state, want = net.state_dict(), init.state_dict()
    assert set(state) == set(want) and all(torch.equal(state[k], want[k]) for k in want)


def test_random_checkpoint_converts_to_megatron_and_back(random_dir):
    """The megatron backend's HF -> Megatron conversion (tensor-only, TP=2) reads the directory and round-trips it."""
    from slime_hydra.training.megatron import convert

    m = compose_run([]).model
    disk = convert.SafetensorsDir(random_dir)
    m.vocab_size = disk["model.embed_tokens.weight"].shape[0]
    layout = dict(layer_offset=0, num_local_layers=m.num_layers, pre_process=True, post_process=True)
    shards = [convert.hf_to_megatron(disk, m, tp_rank=r, tp_size=2, v_pad=64, **layout) for r in range(2)]
    key_of = {id(t): k for k, t in shards[0].items()}
    back = dict(convert.megatron_to_hf(shards[0], m, gather=lambda t, dim: torch.cat([s[key_of[id(t)]] for s in shards], dim),
                                       tp_size=2, vocab_size=m.vocab_size, **layout))
    assert set(back) == set(disk) and all(torch.equal(back[k], disk[k]) for k in disk)


@pytest.mark.integration
def test_run_from_the_directory_saves_checkpoints_that_load_back(random_dir, tmp_path):
    """The CLI with model.hf_checkpoint=<dir> (torch trainer, local rollout, CPU): 5 SFT steps (a random model's
    rewards are all 0, so GRPO alone would not move it) and two rollouts; the run's saved checkpoint loads with
    from_pretrained, with the directory's tokenizer, and its weights moved."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    args = [f"model.hf_checkpoint={random_dir}", *FAST, "warmstart.steps=5", "warmstart.min_steps=0",
            "warmstart.target_train_accuracy=null", "logger=none", "num_rollout=2", f"hydra.run.dir={tmp_path}/run"]
    proc = run_cli(args, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ckpt = tmp_path / "run" / "checkpoints" / "rollout_000001"
    trained = AutoModelForCausalLM.from_pretrained(ckpt)
    start = AutoModelForCausalLM.from_pretrained(random_dir)
    assert AutoTokenizer.from_pretrained(ckpt)("12+34=")["input_ids"] == AutoTokenizer.from_pretrained(random_dir)("12+34=")["input_ids"]
    moved = [(a - b).abs().max().item() for a, b in zip(trained.parameters(), start.parameters())]
    assert min(moved) > 0, "every parameter tensor should have moved"
