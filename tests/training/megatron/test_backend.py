"""The megatron backend on CPU (under tests/support/megatron_cpu/shim.py): conversion, parity, parallel layouts, GRPO.

One process holds TP=PP=DP=1; two spawned gloo processes run TP=2, TP=2 with sequence parallelism,
PP=2 and DP=2 (distributed optimizer) on the same tiny Qwen3 and batch, each checked against it.
"""

from __future__ import annotations

import socket

import pytest
import torch

from tests.support import warm_spawn
from tests.support.megatron_cpu import shim, workers


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    shim.install()
    cfg, tok, hf = workers.tiny_setup()
    out = tmp_path_factory.mktemp("mg1")
    hf_ref = {k: v.clone() for k, v in hf.state_dict().items()}
    res = workers.run_layout(cfg, hf, {}, str(out), "tp1")
    return cfg, hf, hf_ref, out, res


@pytest.fixture(scope="module")
def parallel(tmp_path_factory):
    out = tmp_path_factory.mktemp("mg2")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    warm_spawn.spawn(workers.spawn_main, args=(2, port, str(out), list(workers.LAYOUTS)), nprocs=2, join=True)
    return out


def _hf_logprobs(hf, batch):
    from slime_hydra.algorithms.losses import log_probs_from_logits

    with torch.no_grad():
        logits = hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]
    return log_probs_from_logits(logits, batch.input_ids[:, 1:]) * batch.attention_mask[:, 1:]


def test_logprobs_match_transformers(single):
    cfg, hf, hf_ref, out, res = single
    hf.load_state_dict(hf_ref)
    batch = workers.fixed_batch()
    ref = _hf_logprobs(hf, batch)
    mask = batch.attention_mask[:, 1:].bool()
    # fp32 on both sides: the only differences are summation orders (~1e-6)
    assert (res["before"][mask] - ref[mask]).abs().max() < 1e-4


def test_log_prob_chunks_are_exact(single):
    """train.megatron.log_probs_chunk_size changes memory, not numbers: chunks of 3 tokens == one chunk, values and grads;
    both equal plain autograd through log_softmax over the real vocabulary (the hand-written backward of logprobs.py)."""
    from slime_hydra.training.megatron.logprobs import vocab_parallel_logprobs

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 7, 64, generator=g, dtype=torch.float64)
    targets = torch.randint(0, 60, (2, 7), generator=g)
    w_lp, w_ent = torch.randn(2, 7, generator=g, dtype=torch.float64), torch.randn(2, 7, generator=g, dtype=torch.float64)
    out = []
    for chunk in (3, -1):
        x = logits.clone().requires_grad_(True)
        lp, ent = vocab_parallel_logprobs(x, targets, 60, 0.7, True, chunk)  # vocab 60 of 64 columns: padding masked
        ((lp * w_lp).sum() + (ent * w_ent).sum()).backward()
        out.append((lp, ent, x.grad))
    x = logits.clone().requires_grad_(True)
    ls = torch.log_softmax(x[..., :60] / 0.7, -1)  # [2, 7, 60]
    ref_lp, ref_ent = ls.gather(-1, targets.unsqueeze(-1)).squeeze(-1), -(ls.exp() * ls).sum(-1)
    ((ref_lp * w_lp).sum() + (ref_ent * w_ent).sum()).backward()
    for a, b in zip(*out):
        assert torch.allclose(a.double(), b.double(), atol=1e-6, rtol=0)
    for a, b in zip(out[0], (ref_lp, ref_ent, x.grad)):
        assert torch.allclose(a.double(), b, atol=1e-6, rtol=0)
    assert torch.all(x.grad[..., 60:] == 0) and torch.all(out[0][2][..., 60:] == 0)  # padding columns get no gradient


def test_native_gqa_equals_repeated_heads_on_cpu():
    """SDPAttention lets SDPA broadcast the k/v groups (enable_gqa): bit-equal to the repeat_interleave copy."""
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(2, 8, 9, 16, generator=g), torch.randn(2, 2, 9, 16, generator=g), torch.randn(2, 2, 9, 16, generator=g)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert torch.equal(out, F.scaled_dot_product_attention(q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1), is_causal=True))


def test_hf_megatron_hf_round_trip_is_exact(single):
    from transformers import AutoModelForCausalLM

    cfg, hf, hf_ref, out, res = single
    back = AutoModelForCausalLM.from_pretrained(out / "tp1_hf_before").state_dict()
    assert set(back) == set(hf_ref)
    for k in hf_ref:
        assert torch.equal(back[k], hf_ref[k]), k


def test_training_changes_log_probs_in_the_advantage_direction(single):
    *_, res = single
    batch = workers.fixed_batch()
    d = ((res["after"] - res["before"]) * batch.loss_mask).sum(-1)  # [4]
    assert res["metrics"]["train/grad_norm"] > 0
    # positive-advantage samples (0, 2) gain probability, negative ones (1, 3) lose it
    assert d[0] > 0 and d[2] > 0 and d[1] < 0 and d[3] < 0, d


@pytest.mark.parametrize("layout", list(workers.LAYOUTS))
@pytest.mark.integration
def test_parallel_layout_matches_single(single, parallel, layout):
    from transformers import AutoModelForCausalLM

    hf_ref, res1 = single[2], single[4]
    ranks = [torch.load(parallel / f"{layout}_rank{r}.pt") for r in (0, 1)]
    last = ranks[1] if layout == "pp2" else ranks[0]  # PP: the metrics live on the last stage
    batch = workers.fixed_batch()
    mask = batch.loss_mask.bool()
    assert (last["before"][mask] - res1["before"][mask]).abs().max() < 1e-5  # same weights, other summation order
    for key in ("train/loss", "train/pg_loss", "train/grad_norm"):
        assert last["metrics"][key] == pytest.approx(res1["metrics"][key], rel=1e-4, abs=1e-6), key
    assert (last["after"][mask] - res1["after"][mask]).abs().max() < 1e-4  # the same update
    # the SFT warm start too: each DP rank takes its share of the rows (taking all, DP=2 had twice the gradient: 13.81
    # vs 6.90; the Ray DP=2 learning run's warm start then reached 0.315 held-out, 0.625 with the fix)
    for key in ("losses", "grad_norms"):
        assert last["sft"][key] == pytest.approx(res1["sft"][key], rel=1e-4), (key, last["sft"], res1["sft"])
    back = AutoModelForCausalLM.from_pretrained(parallel / f"{layout}_hf_before").state_dict()
    for k in hf_ref:  # export gathers TP shards / joins PP stage files: bit-exact
        assert torch.equal(back[k], hf_ref[k]), (layout, k)


def test_same_layout_resume_from_megatron_checkpoint_is_exact(single):
    """Save after rollout 1 (dist_checkpointing), load into a randomly initialised backend, train rollout 2:
    bit-identical to the uninterrupted run (weights, Adam moments and step counts all came back)."""
    cfg, hf, _, out, res = single
    assert (out / "tp1_ckpt" / "megatron" / "metadata.json").is_file()
    assert not (out / "tp1_ckpt" / ".megatron.partial").exists()  # written aside, then renamed into place
    got = workers.resume_layout(cfg, hf, {}, str(out / "tp1_ckpt"))
    assert torch.equal(got["loaded"], res["after"])
    assert torch.equal(got["after2"], res["after2"])
    assert got["steps_done"] == 4  # 2 rollouts x num_steps_per_rollout=2


def test_a_save_leaves_no_process_behind(single):
    """megatron's writer returns its results over the queue of a multiprocessing Manager it would spawn at a process's
    first save (a fresh interpreter per rank, importing the rank's __main__ again); the synchronous save hands them over
    a thread queue in the rank's own process (training/megatron/checkpoint.py), and the save in `single` (resumed
    bit-exact above) left no Manager process running."""
    import multiprocessing
    import queue

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    assert (single[3] / "tp1_ckpt" / "megatron" / "metadata.json").is_file()
    assert isinstance(filesystem_async._results_queue, queue.Queue)
    assert [p.name for p in multiprocessing.active_children() if "Manager" in p.name] == []


@pytest.mark.slow  # ~20 s each here (the engine's first imports, two builds, three dist checkpoint saves)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_engine_resume_through_megatron_checkpoints_is_exact(single, tmp_path, dtype):
    """The engine's save/load with train=megatron go through dist_checkpointing (<ckpt>/megatron/, nothing of the
    trainer in the state files): 2 rollouts uninterrupted vs resuming from the rollout-0 checkpoint give the same
    metrics at every rollout and bit-identical final weights (so Adam's moments and step counts came back too),
    in fp32 and in bf16 (mixed precision: fp32 main params and moments in the checkpoint)."""
    from safetensors.torch import load_file

    from slime_hydra.app.preflight import compose_run
    from slime_hydra.app.session import run_session
    from slime_hydra.engine.checkpoint import load_state
    from tests.support.runs import FAST

    def run(name, extra):
        cfg = compose_run(FAST + ["train=megatron", "logger=none", "seed=5", "num_rollout=2", "save_interval=1",
                                  "rollout.rollout_batch_size=4", "train.micro_batch_size=null",
                                  "eval.skip_eval_before_train=true", f"model.dtype={dtype}", *extra])
        run_session(cfg, str(tmp_path / name), extra)
        return tmp_path / name / "checkpoints"

    full = run("full", [])
    ck = full / "rollout_000000"
    assert (ck / "megatron" / "metadata.json").is_file() and not (ck / ".megatron.partial").exists()
    assert load_state(ck)["trainer"] is None  # model, optimizer, step count: all in megatron/
    resumed = run("resumed", [f"load={ck}"])
    h_full, h_res = (load_state(d / "rollout_000001")["history"] for d in (full, resumed))
    assert [s for s, _ in h_res] == [s for s, _ in h_full] == [1, 2]
    for (s, a), (_, b) in zip(h_full, h_res):
        keys = [k for k in a if not k.startswith("perf/")]
        assert {k: a[k] for k in keys} == {k: b[k] for k in keys}, f"rollout {s} differs after resume"
    w_full, w_res = (load_file(d / "rollout_000001" / "model.safetensors") for d in (full, resumed))
    assert all(torch.equal(w_full[k], w_res[k]) for k in w_full)


@pytest.mark.parametrize("layout", ["tp2", "pp2", "dp2"])
@pytest.mark.integration
def test_parallel_megatron_checkpoint_resumes_with_tp1(single, parallel, layout):
    """A checkpoint written by 2 ranks (TP=2 / PP=2 / DP=2 with the distributed optimizer) loads into TP=PP=DP=1
    and the next rollout matches the 2-rank run's (summation order only: 1e-4). dp2 resumes with the distributed
    optimizer at DP=1 (dp_reshardable); before checkpoint._restore_adam_steps its next rollout was off by 0.05
    (every parameter's Adam step shared one tensor)."""
    cfg, hf = single[0], single[1]
    ranks = [torch.load(parallel / f"{layout}_rank{r}.pt") for r in (0, 1)]
    last = ranks[1] if layout == "pp2" else ranks[0]
    par = {"use_distributed_optimizer": True} if layout == "dp2" else {}
    got = workers.resume_layout(cfg, hf, par, str(parallel / f"{layout}_ckpt"))
    mask = workers.fixed_batch().loss_mask.bool()
    assert (got["loaded"][mask] - last["after"][mask]).abs().max() < 1e-5
    assert (got["after2"][mask] - last["after2"][mask]).abs().max() < 1e-4
    assert (got["after2"][mask] - last["after"][mask]).abs().max() > 1e-3  # and rollout 2 did move the weights
    assert got["steps_done"] == 4


@pytest.mark.integration
def test_distributed_optimizer_resume_is_exact_and_kind_mismatch_is_refused(single, parallel, tmp_path):
    """Same layout with the distributed optimizer (DP=1): save after rollout 1, load into a fresh backend, rollout 2 is
    bit-identical. A checkpoint of the other optimizer kind is refused before loading, naming the key to set."""
    from slime_hydra.errors import ConfigError

    cfg, hf = single[0], single[1]
    dist = {"use_distributed_optimizer": True}
    full = workers.run_layout(cfg, hf, dist, str(tmp_path), "do1")
    got = workers.resume_layout(cfg, hf, dist, str(tmp_path / "do1_ckpt"))
    assert torch.equal(got["loaded"], full["after"]) and torch.equal(got["after2"], full["after2"])
    with pytest.raises(ConfigError) as e:  # written by 2 ranks with the distributed optimizer, loaded without it
        workers.resume_layout(cfg, hf, {}, str(parallel / "dp2_ckpt"))
    msg = str(e.value)
    assert "parallelism.use_distributed_optimizer=false, but" in msg and "(data-parallel size 2; now 1)" in msg
    assert msg.endswith("set parallelism.use_distributed_optimizer=true to resume it")
    # and before anything starts: validation reads the checkpoint's common part (a save root with `latest` too)
    from slime_hydra.app.preflight import compose_run

    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "latest").write_text(str(parallel / "dp2_ckpt") + "\n")  # an absolute name joins as itself
    for load in (parallel / "dp2_ckpt", tmp_path / "root"):
        with pytest.raises(ConfigError) as e:
            compose_run(["train=megatron", f"load={load}"])
        assert "set parallelism.use_distributed_optimizer=true to resume it" in str(e.value)
    compose_run(["train=megatron", f"load={parallel / 'dp2_ckpt'}", "parallelism.use_distributed_optimizer=true"])


def test_fused_adam_matches_foreach(single):
    """train.adam_impl=fused (torch's fused AdamW) takes the same steps as foreach: rounding only."""
    import dataclasses

    cfg, hf, hf_ref = single[0], single[1], single[2]
    hf.load_state_dict(hf_ref)
    out = []
    for impl in ("foreach", "fused"):
        train = dataclasses.replace(cfg.train, adam_impl=impl)
        res = workers.train_twice(dataclasses.replace(cfg, train=train), hf)
        out.append(res)
    assert (out[0]["before"] - out[0]["after2"]).abs().max() > 1e-3  # the steps moved the weights
    assert (out[0]["after2"] - out[1]["after2"]).abs().max() < 1e-5


@pytest.mark.slow
def test_cli_grpo_run_with_megatron_backend_raises_accuracy(tmp_path):
    """The embedded default (SFT warm start, GRPO) through the CLI with train=megatron, 40 rollouts on CPU."""
    import json

    from transformers import AutoModelForCausalLM

    from tests.support.runs import run_cli

    args = ["train=megatron", "logger=none", "logger.progress_bar=false", "num_rollout=40", "eval.eval_interval=20",
            f"hydra.run.dir={tmp_path}/run"]
    proc = run_cli(args, tmp_path, timeout=900, module="tests.support.megatron_cpu.cli")
    assert proc.returncode == 0, proc.stderr[-3000:]
    acc = json.loads((tmp_path / "run" / "summary.json").read_text())["eval/addition/accuracy"]
    # measured here (CPU, seed 1234): 0.44 -> 0.525 after 40 rollouts (the torch backend's e2e test asks +0.1)
    assert acc["count"] == 3 and acc["last"] >= acc["first"] + 0.05, acc
    ckpts = sorted((tmp_path / "run" / "checkpoints").glob("rollout_*"))
    assert AutoModelForCausalLM.from_pretrained(ckpts[-1]) is not None  # save_hf wrote a loadable HF checkpoint


@pytest.mark.parametrize("distributed", [False, True], ids=["optimizer", "distributed_optimizer"])
def test_bf16_model_is_bf16_and_resumes_exactly(distributed, tmp_path):
    """model.dtype=bfloat16, megatron's mixed precision: every model parameter bf16 (the norms too), fp32 main params and
    Adam moments in the optimizer; a checkpoint after rollout 1 resumed into a fresh backend gives rollout 2's metrics and
    log-probs bit-identical to the uninterrupted run, with the default and the distributed optimizer. Before the norms
    were cast (they stayed fp32) the first save raised megatron's `ValueError: Param id 17 does not match any model sharded param`."""
    from safetensors import safe_open

    shim.install()
    cfg, _, hf = workers.tiny_setup(["model.dtype=bfloat16"])
    assert {p.dtype for p in hf.parameters()} == {torch.bfloat16}
    par = {"use_distributed_optimizer": distributed}
    full = workers.run_layout(cfg, hf, par, str(tmp_path), "bf16")
    got = workers.resume_layout(cfg, hf, par, str(tmp_path / "bf16_ckpt"))
    for res in (full, got):
        d = res["dtypes"]
        assert d["model"] == {torch.bfloat16} and d["main"] == d["moments"] == {torch.float32}, d
        assert d["num_moments"] == 2 * d["num_main"]  # exp_avg and exp_avg_sq for every main parameter
    assert torch.equal(got["loaded"], full["after"]) and torch.equal(got["after2"], full["after2"])
    assert got["metrics2"] == full["metrics2"]  # every train/ metric of rollout 2, bit for bit
    assert (full["after2"] - full["after"]).abs().max() > 1e-3  # rollout 2 moved the weights
    assert got["steps_done"] == 4
    with safe_open(tmp_path / "bf16_hf_before" / "model.safetensors", "pt") as f:  # megatron_to_hf: model.dtype
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}


@pytest.mark.parametrize("distributed", [False, True], ids=["optimizer", "distributed_optimizer"])
def test_bf16_rl_optimizer_starts_from_the_warm_started_weights(distributed):
    """bf16: the RL optimizer's fp32 main params are copies taken when the backend was built; the SFT warm start moves
    the model after that. An RL rollout at lr 0 must leave the warm-started weights as they are (bit for bit), not
    write the pre-warm-start copies back (end_warm_start reloads them)."""
    shim.install()
    cfg, _, hf = workers.tiny_setup(["model.dtype=bfloat16"])
    res = workers.warm_start_then_still_step(cfg, hf, {"use_distributed_optimizer": distributed})
    assert (res["warm"] - res["before"]).abs().max() > 1e-2  # the warm start moved the weights
    assert torch.equal(res["after"], res["warm"])
