"""Weight sync by size, whatever the dtypes; the sync's request count and seconds reach the tracker.

A megatron export interleaves float32 norms with bf16 matrices layer by layer; buckets that broke at every
dtype change made one request per dtype run (114 instead of 3 for Qwen3-0.6B). Now each tensor is cast to
the engine's dtype first and buckets are packed by size alone. Tested pure (`buckets`), then against a real
SGLang CPU engine over all three sync paths (from tensors, distributed update group, disk), and in a short
GRPO run through that engine whose MLflow run must hold the backend's figures at every rollout step.
"""

from __future__ import annotations

import math

import pytest
import torch

from slime_hydra.protocols import InProcessWeights
from slime_hydra.rollout.sglang import weights as W

KiB = 1024


def interleaved(layers: int, norm: int, matrix: int) -> list[tuple[str, torch.Tensor]]:
    """Per layer a float32 norm of `norm` values, then a bf16 matrix of `matrix` values (megatron's order)."""
    out = []
    for i in range(layers):
        out.append((f"layers.{i}.norm.weight", torch.full((norm,), 1.0 + i, dtype=torch.float32)))
        out.append((f"layers.{i}.proj.weight", torch.full((matrix // 64, 64), 0.5 - i, dtype=torch.bfloat16)))
    return out


def nbytes(bucket) -> int:
    return sum(t.numel() * t.element_size() for _, t in bucket)


@pytest.mark.parametrize("buffer", [32 * KiB, 40 * KiB])
def test_interleaved_dtypes_fill_buckets_by_size_in_the_engine_dtype(buffer):
    # 12 layers of a 512-value float32 norm and a 3584-value bf16 matrix: 24 dtype runs.
    # In the engine's bf16 a layer is 512*2 + 3584*2 = 8 KiB; all 12 are 96 KiB.
    # buffer 32 KiB: 4 layers fill a bucket exactly -> 32, 32, 32 KiB = 3 = ceil(96 / 32).
    # buffer 40 KiB: 5 layers fill a bucket exactly -> 40, 40, 16 KiB = 3 = ceil(96 / 40).
    named = interleaved(12, 512, 3584)
    got = list(W.buckets(named, buffer, torch.bfloat16))
    assert len(got) == math.ceil(96 * KiB / buffer) == 3
    assert [nbytes(b) for b in got] == ([32 * KiB] * 3 if buffer == 32 * KiB else [40 * KiB, 40 * KiB, 16 * KiB])
    assert all(t.dtype == torch.bfloat16 for b in got for _, t in b)  # packed in the engine's dtype
    assert [n for b in got for n, _ in b] == [n for n, _ in named]  # every tensor once, in order
    # values survive the cast: the norms hold 1 + i (exact in bf16), the matrices 0.5 - i
    flat = dict(t for b in got for t in b)
    assert flat["layers.7.norm.weight"].eq(8.0).all() and flat["layers.7.proj.weight"].eq(-6.5).all()
    # in a float32 engine the same list is 192 KiB: 16 KiB a layer, 4 layers to a 64 KiB bucket -> 3
    got32 = list(W.buckets(named, 64 * KiB, torch.float32))
    assert [nbytes(b) for b in got32] == [64 * KiB] * 3 and all(t.dtype == torch.float32 for b in got32 for _, t in b)


def test_a_tensor_larger_than_the_buffer_goes_alone():
    # 1 KiB, 16 KiB, 1 KiB, 1 KiB with an 8 KiB buffer: [1], [16] (alone, over the buffer), [1, 1]
    sizes = [256, 4096, 256, 256]  # float32 values
    named = [(f"t{i}", torch.zeros(n)) for i, n in enumerate(sizes)]
    got = list(W.buckets(named, 8 * KiB, torch.float32))
    assert [[n for n, _ in b] for b in got] == [["t0"], ["t1"], ["t2", "t3"]]
    # without a dtype each tensor keeps its own, and a dtype change still does not split: 2 KiB float32 and
    # 2 KiB bf16 share a 5 KiB bucket, the next 2 KiB float32 does not fit
    mixed = [("a", torch.zeros(512)), ("b", torch.zeros(1024, dtype=torch.bfloat16)), ("c", torch.zeros(512))]
    got = list(W.buckets(mixed, 5 * KiB))
    assert [[n for n, _ in b] for b in got] == [["a", "b"], ["c"]] and got[0][1][1].dtype == torch.bfloat16


# -- against a real SGLang CPU engine ------------------------------------------------------------------

EXPERIMENT = "experiment=grpo/qwen3-tiny-addition-cpu-sglang-torch-v1"
# The tiny model's 46 tensors are 3,181,568 bytes in the engine's float32 (embedding 30,208; per layer
# 787,712; final norm 512); the largest is an MLP matrix of 196,608. With a 1.5 MiB (1,572,864) buffer the
# requests are ceil(3,181,568 / 1,572,864) = ceil(2.02) = 3, and greedy packing reaches that bound: every
# bucket but the last holds more than 1,572,864 - 196,608 = 1,376,256 bytes (else the next tensor would have
# fitted), so n buckets hold more than (n - 1) * 1,376,256, and 3,181,568 bytes allow n <= 3.
BUFFER = 1572864
MODEL_BYTES = 3181568
REQUESTS = 3
NUM_ROLLOUT, ASYNC_ROLLOUTS = 2, 3
SHORT = ["logger.progress_bar=false", "eval.eval_interval=null", "eval.skip_eval_before_train=true", "cluster.device=cpu",
         "cluster.rollout_num_gpus=1", "cluster.colocate=true", "warmstart.steps=0", "rollout.rollout_batch_size=8",
         "rollout.n_samples_per_prompt=4", "train.micro_batch_size=16", "rollout.use_fault_tolerance=false",
         "rollout.check_weight_update_equal=true", f"rollout.update_weight_buffer_size={BUFFER}"]


@pytest.fixture(scope="module")
def short_run(tmp_path_factory, external_engine):
    """NUM_ROLLOUT GRPO rollouts through one colocated SGLang CPU engine (the test process's shared engine, attached:
    its weights reset to the run's model and checked; then weights synced from tensors, every sync checked equal), then
    ASYNC_ROLLOUTS more in train_mode=async on the same components, tracked in a real sqlite MLflow store. The run's
    router stays up for the tests."""
    from slime_hydra.app.build import build
    from slime_hydra.app.preflight import compose_run
    from slime_hydra.app.session import loop_settings
    from slime_hydra.engine import loop
    from tests.support.runs import mlflow_db

    out = tmp_path_factory.mktemp("weight_sync")
    db = mlflow_db(out / "mlflow.db")
    cfg = compose_run([EXPERIMENT, *SHORT, f"num_rollout={NUM_ROLLOUT}", f"logger.tracking_uri={db}", external_engine.override])
    c = build(cfg, str(out))
    try:
        history = loop.run(loop_settings(cfg), c, str(out / "ckpt"))
        cfg_async = compose_run([EXPERIMENT, *SHORT, f"num_rollout={NUM_ROLLOUT + ASYNC_ROLLOUTS}", "train_mode=async",
                                 f"logger.tracking_uri={db}", external_engine.override])
        c.state.start_rollout = NUM_ROLLOUT
        loop.run(loop_settings(cfg_async), c, str(out / "ckpt"))
        yield cfg, c, history, db, c.rollout.weight_version
    finally:
        c.tracker.close("FINISHED")
        c.rollout.shutdown()


def mlflow_history(c, db: str, key: str) -> list[tuple[int, float]]:
    from mlflow.tracking import MlflowClient

    return sorted((m.step, m.value) for m in MlflowClient(tracking_uri=db).get_metric_history(c.tracker.run_id, key))


@pytest.mark.sglang
@pytest.mark.integration
def test_the_backend_figures_reach_mlflow_every_rollout_step(short_run):
    _, c, _, db, version = short_run
    sync_steps = list(range(1, NUM_ROLLOUT + 1))
    # sync loop: a sync after every train step, 3 requests to the one engine, each logged at its step
    assert mlflow_history(c, db, "rollout/weight_sync_requests")[:NUM_ROLLOUT] == [(s, REQUESTS) for s in sync_steps]
    for key in ("perf/weight_sync_send_s", "perf/weight_sync_check_s", "perf/weight_sync_time_s"):
        got = mlflow_history(c, db, key)[:NUM_ROLLOUT]
        assert [s for s, _ in got] == sync_steps and all(v > 0 for _, v in got), (key, got)
    # nothing was written to disk (from tensors); nothing re-sent, nothing restarted
    assert [v for _, v in mlflow_history(c, db, "perf/weight_sync_write_s")[:NUM_ROLLOUT]] == [pytest.approx(0, abs=0.1)] * 2
    all_steps = list(range(1, NUM_ROLLOUT + ASYNC_ROLLOUTS + 1))
    for key in ("rollout/sglang_retries", "rollout/sglang_restarts"):
        assert mlflow_history(c, db, key) == [(s, 0.0) for s in all_steps], key
    # async: rollout 3 and 4 generate on the weights they found (nothing published yet when they were
    # submitted); the worker applies step 3's weights before rollout 5, and that one sync is reported once,
    # at step 4 or 5 (whichever step's metrics() first follows it)
    later = [(s, v) for s, v in mlflow_history(c, db, "rollout/weight_sync_requests") if s > NUM_ROLLOUT]
    assert len(later) == 1 and later[0][0] in (4, 5) and later[0][1] == REQUESTS, later
    # the eval after the last rollout first applies the last published weights (step 5's)
    assert version == NUM_ROLLOUT + ASYNC_ROLLOUTS


@pytest.mark.sglang
@pytest.mark.integration
def test_interleaved_dtypes_sync_in_ceil_bytes_over_buffer_requests_on_every_path(short_run, monkeypatch):
    """The trainer's weights with float32 norms and bf16 matrices (as a megatron export) into the float32
    engine: 3 requests from tensors, 3 over a gloo update group, 1 from disk; each time the engine equals
    them. Counted by the backend and, independently, by a wrapper around the HTTP call that carries them."""
    from slime_hydra.rollout.sglang import distributed as D

    cfg, c, _, _, _ = short_run
    r = c.rollout
    e = r.group.engines[0]
    named = [(n, t.detach().float() if "norm" in n else t.detach().to(torch.bfloat16)) for n, t in c.trainer.named_weights()]
    runs = 1 + sum(a.dtype != b.dtype for (_, a), (_, b) in zip(named, named[1:]))
    assert runs == 16  # per layer: attention matrices | q/k norms | MLP | the two layer norms
    assert sum(t.numel() for _, t in named) * 4 == MODEL_BYTES and math.ceil(MODEL_BYTES / BUFFER) == REQUESTS
    calls: list[str] = []
    post = W.post

    def counting_post(url, path, payload=None, timeout=600.0):
        calls.append(path)
        return post(url, path, payload, timeout)

    monkeypatch.setattr(W, "post", counting_post)
    assert r.mode == "tensor"
    r.update_weights(InProcessWeights.of(named), version=100)  # check_weight_update_equal=true: raises if the engine differs
    assert r.metrics()["rollout/weight_sync_requests"] == REQUESTS == calls.count("/update_weights_from_tensor")
    assert W.check_equal(e.endpoint, named, cfg.model.dtype, 60) == len(named)
    # the distributed path to the same engine, with the matrices moved so the engine must change
    moved = [(n, t + 0.25) for n, t in named]
    group = D.UpdateGroup(e.endpoint, 1, "gloo", 120, "test_weight_sync")
    assert group.send(moved, 101, BUFFER, cfg.model.dtype) == REQUESTS == calls.count("/update_weights_from_distributed")
    assert W.check_equal(e.endpoint, moved, cfg.model.dtype, 60) == len(moved)
    # from disk: one file, one request, whatever the buffer
    path = W.write_checkpoint(named, r.init_dir, r.dir / "weights_test", cfg.model.dtype)
    assert W.update_from_disk(e.endpoint, path, 102, 120) == 1 == calls.count("/update_weights_from_disk")
    assert W.check_equal(e.endpoint, named, cfg.model.dtype, 60) == len(named)
    # the trainer's own weights back, so the run's engine serves them again
    r.update_weights(c.trainer.named_weights(), version=r.weight_version)


@pytest.mark.sglang
@pytest.mark.integration
def test_the_engine_and_the_router_refuse_a_request_without_the_runs_key(short_run, external_engine):
    """Another user of the node reaches the loopback too: without the key the engine and the run's router answer 401,
    to a generate as to a weight swap or a pause; the key is on no command line (what `ps` shows) and in no log. (The
    engine is the shared one, started through the same keyed launcher as a run's own: tests/support/servers.py.)"""
    from pathlib import Path

    import httpx

    _, c, _, _, _ = short_run
    group = c.rollout.group
    e = group.engines[0]
    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 1}}
    for url in (e.url, group.router_url):
        for headers in ({}, {"Authorization": "Bearer not-the-key"}):
            assert httpx.post(url + "/generate", json=body, headers=headers, timeout=60).status_code == 401, url
        assert httpx.post(url + "/generate", json=body, headers=group.router_endpoint.headers, timeout=60).status_code == 200
    for path, payload in (("/update_weights_from_disk", {"model_path": str(c.rollout.init_dir)}), ("/pause_generation", {}),
                          ("/release_memory_occupation", {}), ("/server_info", None)):
        r = httpx.post(e.url + path, json=payload) if payload is not None else httpx.get(e.url + path)
        assert r.status_code == 401, (path, r.status_code, r.text[:200])
    assert httpx.get(e.url + "/health", timeout=60).status_code == 200  # open to probes, as SGLang keeps it
    assert group.key == external_engine.key
    for pid in (external_engine.pid, group.router.pid):
        assert group.key not in Path(f"/proc/{pid}/cmdline").read_bytes().decode()
    logs = sorted((c.rollout.dir / "logs").glob("*.log"))
    assert [f.name for f in logs] == ["router.log"]
    assert all(group.key not in f.read_text() for f in [*logs, external_engine.log_path])
