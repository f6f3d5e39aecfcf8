"""Per-step figures of benchmarks/gpu/peer_verl.sh's runs side by side: slime_hydra (torch, megatron) and verl.

    python3 benchmarks/gpu/peer_report.py ROOT [--json OUT.json] [--skip 1]

ROOT/<run> for run in torch, megatron: a slime_hydra output_dir (tensorboard/), read with experiment_report.py.
ROOT/verl/metrics.jsonl: verl's `file` logger ({"step": s, "data": {metric: value}} per line).
Each run's launch.json ({"start", "end", "rc"}) gives its wall time and exit code.

The same columns for both (median over the steps after the first --skip ones, which compile and warm caches):
- rollout s: slime_hydra perf/rollout_time_s; verl timing_s/gen (the engine's generation and the rewards, which
  verl's agent loop scores as samples finish, plus releasing the engine's memory after it).
- train s: slime_hydra perf/train_time_s; verl timing_s/old_log_prob + timing_s/adv + timing_s/update_actor (+ the
  reference pass when there is one): everything from the samples to the optimizer step.
- sync s: slime_hydra perf/weight_sync_time_s; verl timing_s/update_weights (resume the engine's memory, send).
- step s: slime_hydra perf/step_time_s; verl timing_s/step.
- generated tok/s: response tokens / rollout s. train tok/s: prompt + response tokens / train s.
- reward: slime_hydra rollout/reward_mean; verl critic/score/mean (the same verifier, per sample, mean).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from experiment_report import history, steps_only, tb_scalars  # noqa: E402

COLS = ("rollout_s", "train_s", "sync_s", "step_s", "gen_tok_per_s", "train_tok_per_s", "reward", "resp_len")
VERL_TRAIN = ("timing_s/old_log_prob", "timing_s/ref", "timing_s/adv", "timing_s/update_actor")


def slime_rows(run: Path) -> list[dict]:
    hist, _ = history(run, tb_scalars(run))
    rows = []
    for step, m in sorted(steps_only(hist).items()):
        rollout, train, step_s = m["perf/rollout_time_s"], m["perf/train_time_s"], m["perf/step_time_s"]
        all_tokens = m["perf/tokens_per_s"] * step_s
        rows.append({"step": step, "rollout_s": rollout, "train_s": train, "sync_s": m["perf/weight_sync_time_s"],
                     "step_s": step_s, "gen_tok_per_s": m["perf/rollout_tokens_per_s"],
                     "train_tok_per_s": all_tokens / train if train else None,
                     "reward": m.get("rollout/reward_mean"), "resp_len": m.get("rollout/response_len_mean")})
    return rows


def verl_rows(path: Path) -> list[dict]:
    rows = []
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        m = rec["data"]
        if "timing_s/step" not in m:
            continue
        resp, prompt = m["response_length/mean"], m["prompt_length/mean"]
        samples = m["perf/total_num_tokens"] / (resp + prompt)
        train = sum(m.get(k, 0.0) for k in VERL_TRAIN)
        rows.append({"step": rec["step"], "rollout_s": m["timing_s/gen"], "train_s": train,
                     "sync_s": m.get("timing_s/update_weights"), "step_s": m["timing_s/step"],
                     "gen_tok_per_s": resp * samples / m["timing_s/gen"],
                     "train_tok_per_s": m["perf/total_num_tokens"] / train if train else None,
                     "reward": m["critic/score/mean"], "resp_len": resp, "samples": samples,
                     "detail": {k: v for k, v in m.items() if k.startswith("timing_s/")}})
    return rows


def launch(run: Path) -> dict:
    f = run / "launch.json"
    if not f.is_file():
        return {}
    d = json.loads(f.read_text())
    return {"rc": d.get("rc"), "wall_s": d["end"] - d["start"] if "end" in d else None}


def summary(rows: list[dict], skip: int) -> dict:
    kept = rows[skip:] if len(rows) > skip else rows
    med = {k: statistics.median([r[k] for r in kept if r.get(k) is not None]) for k in COLS
           if any(r.get(k) is not None for r in kept)}
    rewards = [r["reward"] for r in rows if r.get("reward") is not None]
    k = min(5, len(rewards))
    trend = {"first5": sum(rewards[:k]) / k, "last5": sum(rewards[-k:]) / k} if k else {}
    return {"steps": len(rows), "median": med, "first_step": rows[0] if rows else None, "reward_trend": trend,
            "rewards": rewards}


def markdown(report: dict) -> str:
    runs = [n for n in ("torch", "megatron", "verl") if report.get(n, {}).get("median")]
    head = "| per step (median) | " + " | ".join(runs) + " |"
    lines = [head, "|---|" + "---:|" * len(runs)]
    for c in COLS:
        cells = [report[n]["median"].get(c) for n in runs]
        lines.append(f"| {c} | " + " | ".join("" if v is None else f"{v:.4g}" for v in cells) + " |")
    for n in runs:
        lines.append(f"\n{n}: {report[n]['steps']} steps, rc {report[n].get('launch', {}).get('rc')}, wall "
                     f"{report[n].get('launch', {}).get('wall_s')}, reward by step "
                     + " ".join(f"{r:.3f}" for r in report[n]["rewards"]))
    for n in ("torch", "megatron"):
        if n in runs and "step_s" in report.get("verl", {}).get("median", {}):
            lines.append(f"\nverl / {n} step time: {report['verl']['median']['step_s'] / report[n]['median']['step_s']:.2f}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--json", default=None)
    ap.add_argument("--skip", type=int, default=1, help="leading steps left out of the medians")
    args = ap.parse_args()
    root = Path(args.root)
    report = {}
    for name in ("torch", "megatron", "verl"):
        run = root / name
        if not run.is_dir():
            continue
        try:
            rows = verl_rows(run / "metrics.jsonl") if name == "verl" else slime_rows(run)
            report[name] = summary(rows, args.skip) | {"launch": launch(run), "rows": rows}
        except Exception as e:  # one broken run must not hide the others
            report[name] = {"error": f"{type(e).__name__}: {e}", "launch": launch(run)}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=str))
    print(markdown(report))
    for name, r in report.items():
        if "error" in r:
            print(f"{name}: {r['error']} (launch {r['launch']})")
        elif not r.get("steps"):
            print(f"{name}: no step finished (launch {r['launch']})")


if __name__ == "__main__":
    main()
