"""`make bench-data`: prompt data at scale, in-memory vs streaming vs streaming with workers (issue 25).

Generates N chat-format rows locally (default 10M; --rows for fewer), then, each mode in a fresh
process (so its peak memory is its own):
- time to the first batch (from nothing loaded to the first `rollout_batch_size` groups served),
- driver wait per rollout: the time `next_groups` blocks the driver, with a simulated rollout of
  --rollout-s seconds between batches (the time workers have to read ahead),
- prompts/s: N divided by the driver's busy time to serve one epoch (load + every next_groups call),
- peak RSS of the driver (and of the workers, reported apart),
and prints each against the in-memory baseline measured in the same run. Streaming is also measured
over the first 10k rows, whose peak memory the full file's should stay within a small constant of.

    python -m benchmarks.bench_data --rows 200000 --workers 2
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODES = ("in-memory", "streaming", "streaming+workers", "streaming@10k")


def generate(path: Path, n: int) -> None:
    with open(path, "w") as f:
        for a in range(n):
            b = (a * 7919) % 1000
            f.write(f'{{"prompt": [{{"role": "user", "content": "{a % 1000}+{b}="}}], "label": "{a % 1000 + b}"}}\n')


def child(mode: str, path: str, rows: int, workers: int, batch: int, rollouts: int, rollout_s: float, buffer: int) -> dict:
    from slime_hydra.config.datafiles import resolve
    from slime_hydra.data.dataset import load_prompts
    from slime_hydra.data.readers import Prep
    from slime_hydra.data.rows import RowKeys
    from slime_hydra.data.source import PromptSource
    from slime_hydra.data.stream import streaming_source
    from slime_hydra.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    if mode == "in-memory":
        src = PromptSource(load_prompts(path, tok, "prompt", "label", apply_chat_template=True), 1, True, 1)
    else:
        files, _ = resolve(path)
        src = streaming_source(files, Prep(RowKeys("prompt", "label"), tok, True), 1, True, 1, buffer, "error",
                               workers if mode == "streaming+workers" else 0, 600.0)
    src.next_groups(batch)
    first = time.perf_counter() - t0
    waits = []
    for _ in range(rollouts):
        time.sleep(rollout_s)  # the rollout generates; workers read ahead meanwhile
        t = time.perf_counter()
        src.next_groups(batch)
        waits.append(time.perf_counter() - t)
    served, t = batch * (rollouts + 1), time.perf_counter()
    while served < rows:
        k = min(batch, rows - served)
        src.next_groups(k)
        served += k
    busy = first + sum(waits) + time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if hasattr(src, "close"):
        src.close()
    return {"mode": mode, "rows": rows, "first_batch_s": first, "wait_per_rollout_ms": 1000 * sum(waits) / max(len(waits), 1),
            "prompts_per_s": rows / busy, "peak_rss_mb": peak / 1024, "rss_over_imports_mb": (peak - base_rss) / 1024,
            "workers_peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=256, help="prompts per rollout (rollout.rollout_batch_size)")
    ap.add_argument("--rollouts", type=int, default=20, help="rollouts timed for the driver's wait")
    ap.add_argument("--rollout-s", type=float, default=0.2, help="simulated generation time per rollout")
    ap.add_argument("--buffer", type=int, default=10_000, help="data.shuffle_buffer_size")
    ap.add_argument("--dir", default=None, help="where to write the generated files (default: a temporary directory)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--path", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.path, a.rows, a.workers, a.batch, a.rollouts, a.rollout_s, a.buffer)))
        return
    work = Path(a.dir or tempfile.mkdtemp(prefix="bench_data_"))
    work.mkdir(parents=True, exist_ok=True)
    big, small = work / f"rows_{a.rows}.jsonl", work / "rows_10000.jsonl"
    t = time.perf_counter()
    for path, n in ((big, a.rows), (small, 10_000)):
        if not path.exists():
            generate(path, n)
    print(f"generated {a.rows} rows ({big.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - t:.1f} s: {big}", flush=True)
    results = {}
    for mode in MODES:
        path, rows = (small, 10_000) if mode == "streaming@10k" else (big, a.rows)
        cmd = [sys.executable, "-m", "benchmarks.bench_data", "--child", mode, "--path", str(path), "--rows", str(rows),
               "--workers", str(a.workers), "--batch", str(a.batch), "--rollouts", str(a.rollouts),
               "--rollout-s", str(a.rollout_s), "--buffer", str(a.buffer)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        results[mode] = json.loads(out.stdout.strip().splitlines()[-1])
        print(json.dumps(results[mode]), flush=True)
    base = results["in-memory"]
    print(f"\n{a.rows} rows, batch {a.batch}, {a.rollouts} rollouts of {a.rollout_s} s, buffer {a.buffer}, "
          f"{a.workers} workers; ratio = mode / in-memory")
    print(f"{'mode':<18} {'prompts/s':>10} {'ratio':>6} {'first batch s':>14} {'ratio':>6} {'wait/rollout ms':>16} "
          f"{'peak MB':>8} {'ratio':>6} {'workers MB':>10}")
    for mode, r in results.items():
        print(f"{mode:<18} {r['prompts_per_s']:>10.0f} {r['prompts_per_s'] / base['prompts_per_s']:>6.2f} "
              f"{r['first_batch_s']:>14.2f} {r['first_batch_s'] / base['first_batch_s']:>6.3f} "
              f"{r['wait_per_rollout_ms']:>16.1f} {r['peak_rss_mb']:>8.0f} {r['peak_rss_mb'] / base['peak_rss_mb']:>6.2f} "
              f"{r['workers_peak_rss_mb']:>10.0f}")
    print(f"streaming peak over {a.rows} rows - over 10k rows: "
          f"{results['streaming']['peak_rss_mb'] - results['streaming@10k']['peak_rss_mb']:+.0f} MB")


if __name__ == "__main__":
    main()
