"""Every experiment composes and validates; its composed config matches the checked-in golden file; every CPU
experiment launches through the CLI for one rollout (or is launched by another test of this tier).

Validation here is static (no GPUs, no cluster): the placement group is checked against a real
cluster only when a run starts. Experiments for 8-GPU machines point at checkpoints and data that
this machine does not have; those "not found" problems (errors.Missing) are the only ones tolerated, and PENDING lists
the features an experiment waits for (the test fails once a feature lands, so the entry gets removed).

Regenerate the golden files after an intended change: `make golden` (python -m tests.config.test_experiments).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from slime_hydra.app.preflight import check_composed
from slime_hydra.config.compose import Composer, check_overrides
from slime_hydra.errors import Missing
from tests.support.runs import EXPERIMENTS, ROOT, run_cli

GOLDEN = ROOT / "tests" / "golden"
# experiment -> the problem it waits on (a feature another issue adds); a PENDING experiment is refused at validation
# (exit 2, before Ray starts), so it cannot pass here and then fail at launch
PENDING: dict[str, str] = {}


def compose(name: str):
    with Composer() as c:
        cfg, problems = check_overrides(c, [f"experiment={name}"])
    assert cfg is not None, problems
    return cfg, problems


def golden_text(cfg) -> str:
    body = OmegaConf.masked_copy(cfg, [k for k in cfg.keys() if k != "hydra"])
    text = OmegaConf.to_yaml(body, resolve=True).replace(str(ROOT), "<repo>")  # ${asset:...} paths: clone-independent
    return f"# composed by `slime-hydra experiment=...`; regenerate with `make golden`\n{text}"


def golden_path(name: str) -> Path:
    return GOLDEN / f"{name}.yaml"


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_composes_and_validates(name):
    cfg, problems = compose(name)
    typed, more, _ = check_composed(cfg)
    problems = [p for p in problems + more if not isinstance(p, Missing)]  # checkpoints/data of GPU machines
    if name in PENDING:
        assert any(PENDING[name] in p for p in problems), f"{name} no longer waits on {PENDING[name]!r}: drop it from PENDING"
        problems = [p for p in problems if PENDING[name] not in p]
    assert problems == [], problems
    assert typed.experiment_name == name  # the name is the file's path: one name per thing
    header = (ROOT / "experiments" / f"{name}.yaml").read_text().splitlines()
    assert header[0] == "# @package _global_" and any(line.startswith("# Run:") and "slime-hydra" in line for line in header)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_composed_config_matches_golden(name):
    path = golden_path(name)
    assert path.is_file(), f"no golden config for {name}: run `make golden` and check the file in"
    assert golden_text(compose(name)[0]) == path.read_text(), f"{name} drifted from {path}; if intended, run `make golden`"


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_a_later_version_can_build_on_it(name, tmp_path, monkeypatch):
    """A new version that lists this one in its defaults composes to the same config but its name (Hydra resolves a
    relative default against the including file's group, so bases are named by absolute /experiment/... paths)."""
    import shutil

    from slime_hydra.config import compose as composing

    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf, symlinks=False)  # experiment/ is a link to experiments/: copy the files
    later = conf / "experiment" / "later" / "v9.yaml"
    later.parent.mkdir(parents=True)
    later.write_text(f"# @package _global_\ndefaults:\n  - /experiment/{name}\n\nexperiment_name: later/v9\n")
    base_text = golden_text(compose(name)[0])
    monkeypatch.setattr(composing, "CONF_DIR", conf)
    derived, problems = compose("later/v9")
    assert derived is not None, problems
    assert golden_text(derived) == base_text.replace(f"experiment_name: {name}\n", "experiment_name: later/v9\n")


def test_an_option_file_written_after_a_compose_is_an_option(tmp_path, monkeypatch):
    """Groups and options are remembered for conf/'s listing of files (Hydra rebuilds its repository on every ask): an
    experiment written after a compose in the same process is an option at the next one, and one removed is not."""
    import shutil

    from slime_hydra.config import compose as composing

    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf, symlinks=False)
    monkeypatch.setattr(composing, "CONF_DIR", conf)
    with Composer() as c:
        cfg, problems = check_overrides(c, ["experiment=later/v9"])
    assert len(problems) == 1 and problems[0].startswith("experiment=later/v9: no such option in conf/experiment/")
    later = conf / "experiment" / "later" / "v9.yaml"
    later.parent.mkdir(parents=True)
    later.write_text("# @package _global_\nexperiment_name: later/v9\n")
    with Composer() as c:
        cfg, problems = check_overrides(c, ["experiment=later/v9"])
        assert not problems and cfg.experiment_name == "later/v9" and "later/v9" in c.group_options("experiment")
    later.unlink()
    with Composer() as c:
        assert "later/v9" not in c.group_options("experiment")


# A CPU experiment that another default-tier test already launches, with its shape, for more rollouts: not started
# again here (CI time; SGLang's CPU engines take a minute to start). The named module must name the experiment.
LAUNCHED_ELSEWHERE = {
    "grpo/qwen3-tiny-addition-cpu-local-torch-v4": ("tests/e2e/test_default_run.py", "learned_run: the embedded default (this "
                                                    "experiment) through the CLI, 100 rollouts"),
    "agent/qwen3-tiny-calculator-cpu-local-torch-v1": ("tests/e2e/test_agent.py", "the CLI, 2 rollouts"),
    "grpo/qwen3-tiny-addition-cpu-sglang-torch-v1": ("tests/rollout/sglang/test_backend.py", "sglang_run: app.build + engine.loop, as the "
                                                     "CLI's session runs them, 50 rollouts through 2 CPU engines"),
    # megatron-core needs the CPU shim, which `python -m slime_hydra` does not install
    "grpo/qwen3-tiny-moe-addition-cpu-ray-ep2-megatron-v1": ("tests/training/megatron/test_moe_experiment.py", "the CLI under the "
                                                             "CPU shim on the session's Ray head, 40 rollouts"),
}
CPU = [n for n in EXPERIMENTS if "cpu" in n]
# the smallest run of the same shape (backends, algorithm, group size, micro-batches, warm start): 1 rollout of 16
# prompts × the experiments' 8 samples = 128, so each of ray-dp2's 2 ranks still gets a micro-batch of 64; 2 SFT steps
ONE_ROLLOUT = ["num_rollout=1", "rollout.rollout_batch_size=16", "warmstart.steps=2",
               "warmstart.min_steps=0", "eval.eval_interval=null", "logger=none", "logger.progress_bar=false"]


def test_every_cpu_experiment_is_launched_somewhere():
    assert set(LAUNCHED_ELSEWHERE) <= set(CPU), "LAUNCHED_ELSEWHERE names an experiment that is gone"
    for name, (module, _) in LAUNCHED_ELSEWHERE.items():
        assert name in (ROOT / module).read_text(), f"{module} no longer runs {name}: launch it here (drop it from LAUNCHED_ELSEWHERE)"


@pytest.mark.parametrize("name", [n for n in CPU if n not in LAUNCHED_ELSEWHERE])
@pytest.mark.integration
def test_cpu_experiment_launches(name, tmp_path, request):
    """Through the CLI, as a user starts it: exit 0 and a rollout metric in the run's summary."""
    args = [f"experiment={name}", *ONE_ROLLOUT, f"hydra.run.dir={tmp_path}/run"]
    if "-ray-" in name:  # the session's `ray start --head` cluster, not a new one per run
        args.append(f"cluster.address={request.getfixturevalue('ray_head').gcs_address}")
    proc = run_cli(args, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert "rollout/reward_mean" in summary and "train/grad_norm" in summary, sorted(summary)  # generated, scored, trained


def regenerate() -> None:
    for name in EXPERIMENTS:
        path = golden_path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(golden_text(compose(name)[0]))
        print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    sys.exit(regenerate())
