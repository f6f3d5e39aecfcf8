"""`make bench-data`: prompt data at scale, in-memory vs streaming vs streaming with workers.

Generates N chat-format rows locally (default 10M, about 0.8 GB; --rows for fewer), then, each mode in a
fresh process (so its peak memory is its own):
- time to the first batch (from nothing loaded to the first `rollout_batch_size` groups served), wall
  and CPU seconds of the driver,
- driver wait per rollout: the time `next_groups` blocks the driver, with a simulated rollout of
  --rollout-s seconds between batches (the time workers have to read ahead): the mean over --rollouts
  rollouts, over their second half (once the workers have started and made the buffer the driver
  filled at start), and the longest, in wall time and in the driver's CPU time (what the workers take
  off it; on a shared box the wall time also holds the time the driver waits for a core), and the
  1-minute load average when the mode ended; with workers, the blocks the driver read and the rows it made itself,
- prompts/s: prompts served divided by the driver's busy time (load + every next_groups call),
- peak RSS of the driver (and of the workers, reported apart),
and prints each against the in-memory baseline measured in the same run. Streaming is also measured
over a 10k-row file, whose peak memory the large file's should stay within a small constant of.

What is served, to keep a 10M-row run to minutes on a small CPU box: the first --serve prompts of the
epoch, then (files larger than twice that) the source jumps, as a resume from a checkpoint would, to
--serve rows before the end of the file and serves through the end of the pass, the buffer's drain and
the first batch of the next epoch: both ends of the file, and the epoch's turn. The in-memory arm loads
the whole file before its first batch (about 1 KB and 0.2-2 ms per row here), so above --baseline-rows it
runs on the first --baseline-rows rows, and its figures at N rows are printed extrapolated linearly (load
time and memory grow with the rows), marked as such.

    python -m benchmarks.bench_data --rows 1000000 --workers 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODES = ("in-memory", "streaming", "streaming+workers", "streaming@10k")


def line(a: int) -> str:
    """Row a (every row has the same length, so row r starts at byte r * len(line(0)))."""
    x = a % 1000
    b = (x * 7919) % 1000
    return f'{{"prompt": [{{"role": "user", "content": "{x:03d}+{b:03d}="}}], "label": "{x + b:04d}"}}\n'


def generate(path: Path, n: int) -> None:
    """n rows, in chunks of 1000 (the rows repeat with period 1000), written through a temporary name."""
    chunk = "".join(line(a) for a in range(1000)).encode()
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        for _ in range(n // 1000):
            f.write(chunk)
        f.write(chunk[:len(line(0)) * (n % 1000)])
    tmp.rename(path)


def counts(reader, before: dict) -> dict:
    """With workers: blocks the driver read and rows it templated and tokenized itself (data/workers.py)."""
    if not hasattr(reader, "made_by_driver"):
        return before
    return {"blocks_read_by_driver": before.get("blocks_read_by_driver", 0) + reader.read_by_driver,
            "rows_made_by_driver": before.get("rows_made_by_driver", 0) + reader.made_by_driver}


def child(mode: str, path: str, rows: int, workers: int, batch: int, rollouts: int, rollout_s: float, buffer: int,
          serve: int) -> dict:
    from slime_hydra.config.datafiles import resolve
    from slime_hydra.data.dataset import load_prompts
    from slime_hydra.data.readers import Prep
    from slime_hydra.data.rows import RowKeys
    from slime_hydra.data.source import PromptSource
    from slime_hydra.data.stream import streaming_source
    from slime_hydra.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0, c0 = time.perf_counter(), time.process_time()
    if mode == "in-memory":
        src = PromptSource(load_prompts(path, tok, "prompt", "label", apply_chat_template=True), 1, True, 1)
    else:
        files, _ = resolve(path)
        src = streaming_source(files, Prep(RowKeys("prompt", "label"), tok, True), 1, True, 1, buffer, "error",
                               workers if mode == "streaming+workers" else 0, 600.0)
    src.next_groups(batch)
    first, first_cpu = time.perf_counter() - t0, time.process_time() - c0
    waits, cpus = [], []
    for _ in range(rollouts):
        time.sleep(rollout_s)  # the rollout generates; workers read ahead meanwhile
        t, c = time.perf_counter(), time.process_time()
        src.next_groups(batch)
        waits.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    busy = first + sum(waits)

    def serve_until(n: int) -> float:
        t, k = time.perf_counter(), 0
        while k < n:
            src.next_groups(min(batch, n - k))
            k += min(batch, n - k)
        return time.perf_counter() - t

    head = min(serve, rows)
    busy += serve_until(head - batch * (rollouts + 1))
    served, tail = head, 0
    by_driver: dict = {}
    if mode != "in-memory" and rows > 2 * serve:  # both ends of the file and the epoch's turn (module docstring)
        state = src.state_dict()
        start = rows - serve
        state["stream"]["pos"] = (0, start, start * len(line(0)))
        by_driver = counts(src.reader, by_driver)
        t = time.perf_counter()
        src.load_state_dict(state)  # the buffer keeps the head's prompts; the reader goes on from `start`
        tail = serve + buffer + batch  # the rest of the file, the drain, a batch of the next epoch
        busy += time.perf_counter() - t + serve_until(tail)
        served += tail
        assert src.epoch == 1, src.epoch
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    by_driver = counts(getattr(src, "reader", None), by_driver)
    if hasattr(src, "close"):
        src.close()
    return {"mode": mode, "rows": rows, "served": served, "first_batch_s": first, "first_batch_cpu_s": first_cpu,
            "wait_per_rollout_ms": 1000 * sum(waits) / max(len(waits), 1), "wait_max_ms": 1000 * max(waits, default=0),
            "wait_2nd_half_ms": 1000 * sum(waits[len(waits) // 2:]) / max(len(waits) - len(waits) // 2, 1),
            "wait_cpu_ms": 1000 * sum(cpus) / max(len(cpus), 1),
            "wait_cpu_2nd_half_ms": 1000 * sum(cpus[len(cpus) // 2:]) / max(len(cpus) - len(cpus) // 2, 1),
            "loadavg_1min": os.getloadavg()[0],
            "prompts_per_s": served / busy, "peak_rss_mb": peak / 1024, "rss_over_imports_mb": (peak - base_rss) / 1024,
            "workers_peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, **by_driver}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=256, help="prompts per rollout (rollout.rollout_batch_size)")
    ap.add_argument("--rollouts", type=int, default=30, help="rollouts timed for the driver's wait")
    ap.add_argument("--rollout-s", type=float, default=1.0, help="simulated generation time per rollout")
    ap.add_argument("--buffer", type=int, default=10_000, help="data.shuffle_buffer_size")
    ap.add_argument("--serve", type=int, default=50_000, help="prompts served at each end of the file (module docstring)")
    ap.add_argument("--baseline-rows", type=int, default=50_000, help="the most rows the in-memory arm loads")
    ap.add_argument("--dir", default=None, help="where to write the generated files (default: a temporary directory)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--path", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.path, a.rows, a.workers, a.batch, a.rollouts, a.rollout_s, a.buffer, a.serve)))
        return
    work = Path(a.dir or tempfile.mkdtemp(prefix="bench_data_"))
    work.mkdir(parents=True, exist_ok=True)
    base_rows = min(a.rows, a.baseline_rows)
    files = {n: work / f"rows_{n}.jsonl" for n in {a.rows, 10_000, base_rows}}
    t = time.perf_counter()
    for n, path in files.items():
        if not path.exists():
            generate(path, n)
    print(f"generated {a.rows} rows ({files[a.rows].stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - t:.1f} s: "
          f"{files[a.rows]}", flush=True)
    if base_rows < a.rows:
        print(f"in-memory: loading {a.rows} rows would take about 1 KB and 0.2-2 ms each (hours and GBs at 10M); "
              f"measured on the first {base_rows} rows, its figures at {a.rows} extrapolated linearly", flush=True)
    results = {}
    for mode in MODES:
        rows = {"streaming@10k": 10_000, "in-memory": base_rows}.get(mode, a.rows)
        cmd = [sys.executable, "-m", "benchmarks.bench_data", "--child", mode, "--path", str(files[rows]), "--rows", str(rows),
               "--workers", str(a.workers), "--batch", str(a.batch), "--rollouts", str(a.rollouts),
               "--rollout-s", str(a.rollout_s), "--buffer", str(a.buffer), "--serve", str(a.serve)]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode:
            sys.exit(f"{mode} failed:\n{out.stderr[-3000:]}")
        results[mode] = json.loads(out.stdout.strip().splitlines()[-1])
        print(json.dumps(results[mode]), flush=True)
    base = dict(results["in-memory"])
    if base_rows < a.rows:  # load time and memory grow linearly with the rows loaded
        scale = a.rows / base_rows
        results[f"in-memory (x{scale:g}, extrapolated)"] = base = {
            **base, "rows": a.rows, "first_batch_s": base["first_batch_s"] * scale,
            "first_batch_cpu_s": base["first_batch_cpu_s"] * scale,
            "peak_rss_mb": base["peak_rss_mb"] + base["rss_over_imports_mb"] * (scale - 1)}
    print(f"\n{a.rows} rows, batch {a.batch}, {a.rollouts} rollouts of {a.rollout_s} s, buffer {a.buffer}, "
          f"{a.workers} workers; ratio = mode / in-memory at {a.rows} rows")
    print(f"{'mode':<34} {'rows':>9} {'served':>8} {'prompts/s':>9} {'ratio':>6} {'first s':>8} {'cpu s':>7} {'ratio':>7} "
          f"{'wait ms':>8} {'2nd half':>8} {'max ms':>7} {'cpu ms':>6} {'2nd half':>8} {'load':>5} {'peak MB':>8} {'ratio':>6} {'workers MB':>10}")
    for mode, r in results.items():
        print(f"{mode:<34} {r['rows']:>9} {r['served']:>8} {r['prompts_per_s']:>9.0f} "
              f"{r['prompts_per_s'] / base['prompts_per_s']:>6.2f} {r['first_batch_s']:>8.2f} {r['first_batch_cpu_s']:>7.2f} "
              f"{r['first_batch_s'] / base['first_batch_s']:>7.4f} {r['wait_per_rollout_ms']:>8.1f} {r['wait_2nd_half_ms']:>8.1f} {r['wait_max_ms']:>7.1f} "
              f"{r['wait_cpu_ms']:>6.1f} {r['wait_cpu_2nd_half_ms']:>8.1f} {r['loadavg_1min']:>5.1f} "
              f"{r['peak_rss_mb']:>8.0f} {r['peak_rss_mb'] / base['peak_rss_mb']:>6.2f} {r['workers_peak_rss_mb']:>10.0f}")
    s, s10 = results["streaming"], results["streaming@10k"]
    print(f"streaming, {a.rows} rows vs 10k rows: first batch {s['first_batch_s']:.2f} s vs {s10['first_batch_s']:.2f} s; "
          f"peak RSS {s['peak_rss_mb']:.0f} MB vs {s10['peak_rss_mb']:.0f} MB ({s['peak_rss_mb'] - s10['peak_rss_mb']:+.0f} MB)")


if __name__ == "__main__":
    main()
