"""A weight sync's wall and CPU time against two SGLang CPU engines of the embedded tiny model, with the process's one
TLS context for every request (slime_hydra/rollout/sglang/endpoint.py: `tls`) against a new one per request (what
`httpx.post` and its kin build when given no `verify`).

One build of the shipped SGLang CPU experiment, disaggregated (`cluster.colocate=false`: the trainer's tensors broadcast
over a gloo update group per engine, both engines at once), every sync checked equal (`check_weight_update_equal`).
Rounds alternate the two ways; each times `--syncs` syncs of the trainer's weights (pause, broadcast, flush, continue,
check). Figures: per sync, the median over rounds of wall seconds and of this process's CPU seconds (the requests are
made here), and the ratios shared / per request from the same run. Nothing else should run on the machine meanwhile.

Run: HF_HUB_OFFLINE=1 .venv/bin/python -m benchmarks.bench_weight_sync [--rounds 3 --syncs 10]   (`make bench-weight-sync`)
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time

import httpx

from slime_hydra.app.preflight import compose_run
from slime_hydra.protocols import InProcessWeights
from slime_hydra.rollout.sglang import backend, engines, external_router, weights

OVERRIDES = ["experiment=grpo/qwen3-tiny-addition-cpu-sglang-torch-v1", "logger=none", "logger.progress_bar=false",
             "eval.eval_interval=null", "warmstart.steps=0", "cluster.colocate=false",
             "rollout.check_weight_update_equal=true", "rollout.sglang.max_total_tokens=16384"]
USERS = (backend, engines, external_router, weights)  # the modules that pass `tls()` to their requests


@contextlib.contextmanager
def per_request_contexts():
    """Every request builds its own context again, as it did before `tls`."""
    saved = [m.tls for m in USERS]
    for m in USERS:
        m.tls = httpx.create_ssl_context
    try:
        yield
    finally:
        for m, f in zip(USERS, saved):
            m.tls = f


def timed_syncs(rollout, named, first_version: int, n: int) -> tuple[float, float]:
    """-> (wall s, CPU s of this process) per sync over n syncs."""
    w0, c0 = time.perf_counter(), time.process_time()
    for k in range(n):
        rollout.update_weights(InProcessWeights.of(named), version=first_version + k)
    return (time.perf_counter() - w0) / n, (time.process_time() - c0) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--syncs", type=int, default=10)
    args = ap.parse_args()

    from slime_hydra.app.build import build

    cfg = compose_run(OVERRIDES)
    with tempfile.TemporaryDirectory(prefix="bench_weight_sync_") as out:
        c = build(cfg, out)
        try:
            rollout, named = c.rollout, list(c.trainer.named_weights())
            timed_syncs(rollout, named, 1, 2)  # the update groups open at the first sync: not timed
            version = 3
            got: dict[str, list[tuple[float, float]]] = {"shared": [], "per_request": []}
            for r in range(args.rounds):
                for way in ("per_request", "shared") if r % 2 else ("shared", "per_request"):
                    with per_request_contexts() if way == "per_request" else contextlib.nullcontext():
                        got[way].append(timed_syncs(rollout, named, version, args.syncs))
                    version += args.syncs
        finally:
            c.rollout.shutdown()
    med = {way: (statistics.median(w for w, _ in xs), statistics.median(cpu for _, cpu in xs)) for way, xs in got.items()}
    print(f"weight sync, 2 CPU engines, {sum(t.numel() for _, t in named)} parameters, checked equal; "
          f"median of {args.rounds} rounds of {args.syncs} syncs:")
    for way, (wall, cpu) in med.items():
        print(f"  {way:12s} {wall * 1000:8.1f} ms wall  {cpu * 1000:8.1f} ms CPU (this process) per sync")
    print(f"  ratio shared / per_request: wall {med['shared'][0] / med['per_request'][0]:.2f}, "
          f"CPU {med['shared'][1] / med['per_request'][1]:.2f}")


if __name__ == "__main__":
    main()
