"""Seconds from launch to a served request for one SGLang CPU engine of the embedded tiny model: its scheduler and
detokenizer forked (what `rollout/sglang/keyed.py` does on CPU) against spawned (SGLang's own choice, which CUDA needs).

Each round starts the same server both ways, alternating, on a free port, with the run's key; the time is until
/health answers 200 and one greedy /generate of 4 tokens returns. Figures: the median of `--rounds`, and the ratio
fork / spawn from the same run. Nothing else should run on the machine meanwhile.

Run: HF_HUB_OFFLINE=1 .venv/bin/python -m benchmarks.bench_engine_start [--rounds 3]   (`make bench-engine-start`)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from slime_hydra.app.preflight import compose_run
from slime_hydra.models.build import build_model, build_tokenizer
from slime_hydra.ports import free_port
from slime_hydra.rollout.sglang.endpoint import KEY_ENV, new_key

ARGS = ["--tp-size", "1", "--host", "127.0.0.1", "--random-seed", "1234", "--dtype", "float32", "--device", "cpu",
        "--model-impl", "transformers", "--attention-backend", "torch_native", "--sampling-backend", "pytorch",
        "--disable-cuda-graph", "--max-total-tokens", "65536", "--skip-tokenizer-init"]


def start_once(model_dir: str, forked: bool, log: Path, deadline_s: float = 600.0) -> float:
    port, key = free_port(), new_key()
    argv = ["--model-path", model_dir, "--port", str(port), *ARGS]
    if forked:  # the project's launcher: the key from the environment, the children forked on CPU
        cmd, env = [sys.executable, "-m", "slime_hydra.rollout.sglang.keyed", "sglang.launch_server", *argv], {KEY_ENV: key}
    else:  # SGLang's own entry point: spawned children
        cmd, env = [sys.executable, "-m", "sglang.launch_server", *argv, f"--api-key={key}"], {}
    headers = {"Authorization": f"Bearer {key}"}
    t0 = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env}, start_new_session=True)
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited with {proc.returncode}; log {log}")
            if time.perf_counter() - t0 > deadline_s:
                raise RuntimeError(f"no answer from /health in {deadline_s:g} s; log {log}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        r = httpx.post(f"http://127.0.0.1:{port}/generate", headers=headers, timeout=60,
                       json={"input_ids": [5, 6, 7, 8], "sampling_params": {"max_new_tokens": 4, "temperature": 0}})
        r.raise_for_status()
        return time.perf_counter() - t0
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    cfg = compose_run(["logger=none"])
    tok = build_tokenizer(cfg.model)
    with tempfile.TemporaryDirectory() as d:
        model_dir = str(Path(d) / "model")
        build_model(cfg.model, tok, cfg.seed).save_pretrained(model_dir)
        tok.save_pretrained(model_dir)
        times: dict[str, list[float]] = {"spawn": [], "fork": []}
        for i in range(args.rounds):
            for name in ("spawn", "fork"):
                times[name].append(start_once(model_dir, name == "fork", Path(d) / f"{name}_{i}.log"))
                print(f"round {i + 1}: {name} {times[name][-1]:.1f} s", flush=True)
    spawn, fork = statistics.median(times["spawn"]), statistics.median(times["fork"])
    print(f"engine start to first request (median of {args.rounds}): spawn {spawn:.1f} s, fork {fork:.1f} s, "
          f"fork / spawn {fork / spawn:.2f}")


if __name__ == "__main__":
    main()
