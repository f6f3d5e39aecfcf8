"""A megatron rank's first checkpoint save in a Ray actor (where a run's ranks live): megatron's own results queue, a
multiprocessing Manager it spawns (a fresh interpreter that imports the Ray worker's __main__ again and stays until
the rank ends), against the thread queue training/megatron/checkpoint.py hands a synchronous save.

Each round starts two fresh rank actors on a local Ray cluster (the tiny model under the megatron CPU shim), one each
way, and times their first save: its wall seconds and the CPU-seconds of every process the rank started meanwhile.
Figures: the medians over `--rounds` and the ratios in-process / spawned from the same run. Nothing else should run on
the machine meanwhile.

Run: .venv/bin/python -m benchmarks.bench_megatron_first_save [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def rank_class():
    import ray

    @ray.remote(num_cpus=1)
    class Rank:
        def __init__(self, megatron_queue: bool):
            import torch

            from slime_hydra.training.megatron import checkpoint
            from tests.support.megatron_cpu import shim, workers
            from tests.support.trainers import megatron_backend

            shim.install()
            if megatron_queue:  # megatron's own: its spawned Manager
                checkpoint._write_results_in_process = lambda: None
            cfg, _, hf = workers.tiny_setup()
            self.b = megatron_backend(hf.state_dict(), hf.config, cfg.model, cfg.parallelism, cfg.algorithm, cfg.train,
                                      1.0, 10, torch.device("cpu"), seed=cfg.seed, max_response_len=8)
            self.b.freeze_reference()

        def first_save(self, path: str) -> tuple[float, float]:
            import psutil

            me = psutil.Process()
            before = {p.pid for p in me.children(recursive=True)}
            t = time.perf_counter()
            self.b.save_checkpoint(path)
            wall = time.perf_counter() - t
            time.sleep(0.5)  # a spawned Manager has finished starting by now (the save waited for it)
            started = [p for p in me.children(recursive=True) if p.pid not in before]
            cpu = 0.0
            for p in started:
                try:
                    c = p.cpu_times()
                    cpu += c.user + c.system
                except psutil.NoSuchProcess:
                    pass
            return wall, cpu

    return Rank


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    rounds = parser.parse_args().rounds
    # a cluster as a run's own starts (orchestration/local_cluster.py): token auth, loopback, a temp dir of its own;
    # both variables are read once, at Ray's import
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
    import ray

    from slime_hydra.orchestration.local_cluster import loopback_node, run_temp_dir

    with loopback_node():
        ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING", log_to_driver=False,
                 _temp_dir=run_temp_dir(),
                 runtime_env={"worker_process_setup_hook": "tests.support.megatron_cpu.shim.install",
                              "env_vars": {"PYTHONPATH": str(ROOT), "OMP_WAIT_POLICY": "PASSIVE"}})
    Rank = rank_class()
    figures: dict[str, list[tuple[float, float]]] = {"spawned Manager": [], "in process": []}
    with tempfile.TemporaryDirectory(prefix="bench_first_save_") as tmp:
        for r in range(rounds):
            for name, megatron_queue in (("spawned Manager", True), ("in process", False)):
                rank = Rank.remote(megatron_queue)
                figures[name].append(ray.get(rank.first_save.remote(f"{tmp}/{name.replace(' ', '_')}_{r}")))
                ray.kill(rank)
                print(f"round {r} {name}: first save {figures[name][-1][0]:.2f} s wall, "
                      f"{figures[name][-1][1]:.2f} CPU-s in processes it started", flush=True)
    ray.shutdown()
    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in figures.items()}
    for k, (w, c) in med.items():
        print(f"{k}: first save median {w:.2f} s wall, {c:.2f} CPU-s in processes it started")
    (ws, cs), (wi, ci) = med["spawned Manager"], med["in process"]
    print(f"ratio in process / spawned Manager: wall {wi / ws:.2f}, CPU in started processes {ci / max(cs, 1e-9):.2f}")


if __name__ == "__main__":
    main()
