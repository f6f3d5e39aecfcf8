"""Figures from the runs of benchmarks/gpu/experiment_curves.sh (or any run laid out the same).

    python3 benchmarks/gpu/experiment_report.py ROOT [--json OUT.json]

ROOT holds one directory per run (megatron, megatron-resume, torch, torch-resume, offload; ray, local, ray-resume:
Ray against one process; megatron-thd, torch-thd: packed by a token budget), each with the run's
output_dir contents (checkpoints/, tensorboard/) and launch.json ({"start": epoch s, "end": epoch s, "rc": exit
code}) written by the script. Read back:
- the metric history from the newest checkpoint's state ("history": [(step, {metric: value})], read as the run reads it:
  slime_hydra/engine/checkpoint_state.py, plain data only); a run without a
  checkpoint falls back to its TensorBoard scalars;
- start-up from TensorBoard wall times: launch -> start of rollout 1 (wall time of step 1's scalars minus its
  perf/step_time_s), with the SFT warm start's own seconds (perf/warmstart_time_s at step 0) shown apart;
- the resume's closeness: for rollouts after the resume point, per-key max |full - resumed| of every train/ and
  rollout/reward* metric (and the steps before it, which the resumed run restores from the checkpoint, must be equal).
Prints a markdown table per run and a JSON of everything.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

RUNS = ("megatron", "megatron-resume", "torch", "torch-resume", "offload", "ray", "local", "ray-resume", "megatron-thd",
        "torch-thd")
SYNC = ("perf/weight_sync_write_s", "perf/weight_sync_send_s", "perf/weight_sync_check_s")
COLS = ("perf/rollout_time_s", "perf/train_time_s", "perf/weight_sync_time_s", "perf/weight_sync_send_s",
        "perf/weight_sync_check_s", "rollout/weight_sync_requests", "perf/step_time_s", "rollout/reward_mean",
        "rollout/response_len_mean", "rollout/truncated_ratio")


def tb_scalars(run: Path) -> dict[str, list[tuple[int, float, float]]]:
    """tag -> [(step, wall_time, value)] from <run>/tensorboard (empty when there is none or tensorboard is absent)."""
    d = run / "tensorboard"
    if not d.is_dir():
        return {}
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        return {}
    out: dict[str, list] = {}
    for events in sorted(d.rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            out.setdefault(tag, []).extend((e.step, e.wall_time, e.value) for e in acc.Scalars(tag))
    return out


def newest_checkpoint(run: Path) -> Path | None:
    root = run / "checkpoints"
    if (root / "latest").is_file():
        return root / (root / "latest").read_text().strip()
    found = sorted(root.glob("rollout_*")) if root.is_dir() else []
    return found[-1] if found else None


def history(run: Path, tb: dict) -> tuple[list[tuple[int, dict]], str]:
    ckpt = newest_checkpoint(run)
    if ckpt is not None and ((ckpt / "state.json").is_file() or (ckpt / "state.pt").is_file()):
        import sys

        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the package, when run as a script from anywhere
        from slime_hydra.engine.checkpoint_state import files, read

        state = read(ckpt)
        return [(int(s), dict(m)) for s, m in state["history"]], str(files(ckpt)[0])
    by_step: dict[int, dict] = {}
    for tag, points in tb.items():
        for step, _, value in points:
            by_step.setdefault(step, {})[tag] = value
    return sorted(by_step.items()), "tensorboard"


def steps_only(hist):
    """The rollout steps' metrics (step >= 1 with a step time), one entry per step (the last wins)."""
    return {s: m for s, m in hist if s >= 1 and "perf/step_time_s" in m}


def med(xs):
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    return statistics.median(xs) if xs else None


def startup(run: Path, tb: dict, steps: dict) -> dict:
    launch = json.loads((run / "launch.json").read_text()) if (run / "launch.json").is_file() else {}
    out = {"wall_s": (launch["end"] - launch["start"]) if "end" in launch and "start" in launch else None,
           "rc": launch.get("rc")}
    warm = [v for s, _, v in tb.get("perf/warmstart_time_s", []) if s == 0]
    out["warmstart_s"] = warm[-1] if warm else None
    logged = tb.get("perf/step_time_s", [])  # this process's steps (a resumed history also holds the earlier ones)
    if logged and "start" in launch:
        first, wall, step_time = min(logged)
        out["first_step"] = first
        out["startup_s"] = wall - step_time - launch["start"]  # launch -> its first rollout starts
    return out


def summarize(run: Path) -> dict:
    tb = tb_scalars(run)
    hist, source = history(run, tb)
    steps = steps_only(hist)
    own = {s for s, _, _ in tb.get("perf/step_time_s", [])}  # a resumed history also holds the loaded run's steps
    if own:
        steps = {s: m for s, m in steps.items() if s in own}
    evals = {f"{s}": v for s, m in hist for k, v in m.items() if k.startswith("eval/") and k.endswith("/accuracy")}
    out = {"history_from": source, "steps": len(steps), "startup": startup(run, tb, steps), "eval_accuracy": evals,
           "warmstart": {k: v for s, m in hist if s == 0 for k, v in m.items() if k.startswith("warmstart/")}}
    sync_no_check = [m.get(SYNC[0], 0.0) + m.get(SYNC[1]) for m in steps.values() if SYNC[1] in m]
    sync_all = [sum(m.get(k, 0.0) for k in SYNC) for m in steps.values() if SYNC[1] in m]
    out["median"] = {k: med([m.get(k) for m in steps.values()]) for k in COLS}
    out["median"]["sync_write_plus_send_s"] = med(sync_no_check)
    out["median"]["sync_write_send_check_s"] = med(sync_all)
    out["max"] = {"sync_write_plus_send_s": max(sync_no_check, default=None), "perf/weight_sync_send_s":
                  max((m.get(SYNC[1]) for m in steps.values() if SYNC[1] in m), default=None)}
    rewards = [steps[s]["rollout/reward_mean"] for s in sorted(steps) if "rollout/reward_mean" in steps[s]]
    if rewards:
        k = min(5, len(rewards))
        out["reward_first5_mean"], out["reward_last5_mean"] = sum(rewards[:k]) / k, sum(rewards[-k:]) / k
    out["table"] = {s: {k: steps[s].get(k) for k in COLS} | {k: v for k, v in steps[s].items() if k.startswith("eval/")
                                                           and k.endswith("/accuracy")} for s in sorted(steps)}
    return out, hist


def compare(full_hist, res_hist, resumed_at: int) -> dict:
    """Per key (train/*, rollout/reward*): max |full - resumed| over the steps after resumed_at, and whether the
    restored steps up to resumed_at are identical."""
    full, res = steps_only(full_hist), steps_only(res_hist)
    after = [s for s in sorted(res) if s > resumed_at and s in full]
    keys = sorted({k for s in after for k in full[s] if k.startswith("train/") or k.startswith("rollout/reward")})
    per_key = {}
    for k in keys:
        pairs = [(full[s].get(k), res[s].get(k)) for s in after]
        pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
        if pairs:
            per_key[k] = {"max_abs_diff": max(abs(a - b) for a, b in pairs),
                          "mean_full": sum(a for a, _ in pairs) / len(pairs), "mean_resumed": sum(b for _, b in pairs) / len(pairs)}
    before = [s for s in full if s <= resumed_at]
    restored_equal = all(res.get(s) == full[s] for s in before)
    evals = {}
    for s, m in res_hist:
        for k, v in m.items():
            if s > resumed_at and k.startswith("eval/") and k.endswith("/accuracy"):
                evals[f"{k}@{s}"] = {"resumed": v, "full": next((fm[k] for fs, fm in full_hist if fs == s and k in fm), None)}
    return {"steps_compared": after, "restored_history_equal": restored_equal, "per_key": per_key, "eval": evals}


def curve(hist, block: int = 10) -> dict:
    """The learning curve in blocks: mean reward of rollouts 1-10, 11-20, ...; held-out accuracy at each eval."""
    steps = steps_only(hist)
    rewards = [(s, steps[s]["rollout/reward_mean"]) for s in sorted(steps) if s > 0 and "rollout/reward_mean" in steps[s]]
    blocks: dict[str, list[float]] = {}
    for s, r in rewards:
        lo = (s - 1) // block * block + 1
        blocks.setdefault(f"{lo}-{lo + block - 1}", []).append(r)
    evals = {s: v for s, m in hist for k, v in m.items() if k.startswith("eval/") and k.endswith("/accuracy")}
    return {"reward_blocks": {k: sum(v) / len(v) for k, v in blocks.items()}, "eval_accuracy": dict(sorted(evals.items()))}


def markdown(name: str, s: dict) -> str:
    lines = [f"### {name} ({s['steps']} steps, history from {s['history_from']})",
             "| step | rollout s | train s | sync s | send s | check s | requests | step s | reward | resp len | eval acc |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for step, row in s["table"].items():
        acc = next((v for k, v in row.items() if k.startswith("eval/")), None)
        cells = [row.get(k) for k in COLS[:-1]] + [acc]
        lines.append(f"| {step} | " + " | ".join("" if c is None else f"{c:.3g}" for c in cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--json", default=None)
    ap.add_argument("--resumed-at", type=int, default=20, help="the step of the checkpoint the resume loaded")
    args = ap.parse_args()
    root = Path(args.root)
    report, hists = {}, {}
    for name in RUNS:
        if (root / name).is_dir():
            try:
                report[name], hists[name] = summarize(root / name)
            except Exception as e:  # one broken run must not hide the others
                report[name] = {"error": f"{type(e).__name__}: {e}"}
    for base in ("megatron", "torch", "ray"):
        if base in hists and f"{base}-resume" in hists:
            report[f"{base}-resume"]["vs_full"] = compare(hists[base], hists[f"{base}-resume"], args.resumed_at)
    if "median" in report.get("ray", {}) and "median" in report.get("local", {}):  # the cost of Ray: ray / local, per column
        ray, local = report["ray"]["median"], report["local"]["median"]
        report["ray_over_local"] = {k: ray[k] / local[k] for k in ray if ray.get(k) and local.get(k)}
        report["ray_over_local"]["startup_s"] = ((report["ray"]["startup"].get("startup_s") or 0)
                                                 / (report["local"]["startup"].get("startup_s") or float("nan")))
    for base in ("megatron", "torch"):  # packed + token budget (thd) beside the padded (bshd) run
        if base in hists and f"{base}-thd" in hists:
            b, t = report[base]["median"], report[f"{base}-thd"]["median"]
            report[f"{base}-thd"]["vs_bshd"] = {
                "bshd": curve(hists[base]), "thd": curve(hists[f"{base}-thd"]),
                "train_time_ratio_thd_over_bshd": (t["perf/train_time_s"] / b["perf/train_time_s"]
                                                   if t.get("perf/train_time_s") and b.get("perf/train_time_s") else None)}
    for name, s in report.items():
        if "table" in s:
            print(markdown(name, s))
        print(json.dumps({k: v for k, v in s.items() if k != "table"}, indent=1, default=str))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
