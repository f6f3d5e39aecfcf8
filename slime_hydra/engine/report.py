"""What a person sees: a progress bar per rollout, a summary table, a reward/accuracy curve PNG."""

from __future__ import annotations

import json
from pathlib import Path


class Progress:
    def __init__(self, total: int, initial: int, enabled: bool):
        self.bar = None
        self.acc: dict[str, float] = {}
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, desc="rollout", unit="rollout", dynamic_ncols=True)

    def update(self, metrics: dict[str, float]) -> None:
        if self.bar is None:
            return
        self.acc.update({k.split("/")[1]: v for k, v in metrics.items() if k.startswith("eval/") and k.endswith("/accuracy")})
        post = {"reward": f"{metrics.get('rollout/reward_mean', float('nan')):.3f}"}
        post.update({f"acc[{k}]": f"{v:.3f}" for k, v in self.acc.items()})  # the latest eval stays shown
        self.bar.set_postfix(post, refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def summarize(history: list[tuple[int, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """metric -> {first, last, best, steps} over the run."""
    series: dict[str, list[tuple[int, float]]] = {}
    for step, metrics in history:
        for k, v in metrics.items():
            series.setdefault(k, []).append((step, v))
    return {k: {"first": v[0][1], "last": v[-1][1], "max": max(x for _, x in v), "count": len(v)}
            for k, v in sorted(series.items())}


SUMMARY_KEYS = ("rollout/reward_mean", "train/pg_loss", "train/entropy", "perf/step_time_s")


def summary_table(summary: dict[str, dict[str, float]]) -> str:
    keys = [k for k in summary if k.startswith("eval/") and k.endswith("/accuracy")] + [k for k in SUMMARY_KEYS if k in summary]
    width = max([len(k) for k in keys] + [6])
    lines = [f"{'metric':<{width}}  {'first':>9}  {'last':>9}  {'max':>9}", "-" * (width + 33)]
    lines += [f"{k:<{width}}  {summary[k]['first']:>9.4f}  {summary[k]['last']:>9.4f}  {summary[k]['max']:>9.4f}" for k in keys]
    return "\n".join(lines)


def plot_curves(history: list[tuple[int, dict[str, float]]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    reward = [(s, m["rollout/reward_mean"]) for s, m in history if "rollout/reward_mean" in m]
    if reward:
        ax.plot(*zip(*reward), label="rollout/reward_mean", alpha=0.7)
    for key in sorted({k for _, m in history for k in m if k.startswith("eval/") and k.endswith("/accuracy")}):
        pts = [(s, m[key]) for s, m in history if key in m]
        ax.plot(*zip(*pts), marker="o", label=key)
    ax.set_xlabel("rollout")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_summary(summary: dict, path: Path) -> Path:
    path.write_text(json.dumps(summary, indent=2, sort_keys=True))
    return path
