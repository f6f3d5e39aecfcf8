"""Composition and validation: every option composes, bad configs fail at once naming the fix."""

from __future__ import annotations

import pytest

from slime_hydra.app.preflight import compose_run
from slime_hydra.config.compose import expand_sweeps
from slime_hydra.config.schema import GROUP_SCHEMAS, RunConfig
from slime_hydra.errors import ConfigError
from tests.support.runs import ROOT, problems_of, run_cli

CONF = ROOT / "conf"


def all_options() -> list[tuple[str, str]]:
    return [(g, p.stem) for g in GROUP_SCHEMAS for p in sorted((CONF / g).glob("*.yaml"))]


@pytest.mark.parametrize("group,option", all_options())
def test_every_group_option_composes_and_validates(group, option):
    cfg = compose_run([f"{group}={option}"])
    assert isinstance(cfg, RunConfig)
    assert isinstance(getattr(cfg, group), GROUP_SCHEMAS[group])


# every experiment composes and validates: tests/config/test_experiments.py (with the golden composed configs)


def test_debug_option_composes():
    cfg = compose_run(["debug=fast"])
    assert cfg.num_rollout == 2 and cfg.rollout.rollout_batch_size == 4


def test_batch_identity_is_derived():
    cfg = compose_run(["rollout.rollout_batch_size=16", "rollout.n_samples_per_prompt=4", "train.num_steps_per_rollout=2",
                       "train.micro_batch_size=8"])
    assert (cfg.train.global_batch_size, cfg.train.num_steps_per_rollout) == (32, 2)  # 16*4 / 2
    cfg = compose_run(["rollout.rollout_batch_size=16", "rollout.n_samples_per_prompt=4", "train.global_batch_size=16",
                       "train.micro_batch_size=8"])
    assert cfg.train.num_steps_per_rollout == 4  # 64 / 16


def test_all_errors_reported_at_once_with_fixes():
    probs = problems_of(["model=qwen9", "rollout_batch_size=3", "+rollout.foo=1", "rollout.rollout_temperature=abc",
                         "train.global_batch_size=100", "rollout.rollout_tempreature=0.5"])
    assert len(probs) == 6, probs
    text = "\n".join(probs)
    assert "model=qwen9" in text and "qwen3_tiny" in text  # option and the nearest valid one
    assert "did you mean rollout.rollout_batch_size" in text  # top-level typo -> the nested key
    assert "unknown key 'rollout.foo'" in text  # `+key=` is no way around the schema
    assert "rollout.rollout_temperature=abc" in text
    assert "did you mean rollout.rollout_temperature" in text
    assert "train.global_batch_size=100" in text and "divisor of 256" in text  # 32 * 8 = 256


def test_impossible_values():
    probs = problems_of(["rollout.rollout_temperature=0", "rollout.n_samples_per_prompt=1", "train.micro_batch_size=7"])
    text = "\n".join(probs)
    assert "rollout.rollout_temperature=0.0 must be > 0" in text
    assert "rollout.n_samples_per_prompt=1" in text and "n_samples_per_prompt>=2" in text
    assert "train.micro_batch_size=7 must divide train.global_batch_size=32" in text  # 32 prompts * 1 sample


def test_a_floor_above_the_rate_is_refused_where_a_schedule_would_raise_the_rate():
    """The embedded default decays cosine from 2e-4 to train.min_lr=2e-5: `train.lr=1e-6` over it would climb to 2e-5
    (20x the rate asked for) if the floor were kept; constant never reads the floor."""
    (msg,) = problems_of(["train.lr=1e-6"])
    assert "train.min_lr=2e-05 must be in [0, train.lr=1e-06]" in msg and "cosine" in msg and "lower train.min_lr" in msg
    assert compose_run(["train.lr=1e-6", "train.min_lr=0"]).train.min_lr == 0
    assert compose_run(["train.lr=1e-6", "train.lr_decay_style=constant"]).train.lr == 1e-6
    (msg,) = problems_of(["train.min_lr=-1e-6"])
    assert "train.min_lr=-1e-06 must be in [0, train.lr=0.0002]" in msg


def test_batch_identity_mismatch_names_both_fixes():
    (msg,) = problems_of(["train.global_batch_size=128", "train.num_steps_per_rollout=1", "train.micro_batch_size=64"])
    assert msg == ("rollout.rollout_batch_size × rollout.n_samples_per_prompt = 32 × 8 = 256 must equal "
                   "train.global_batch_size × train.num_steps_per_rollout = 128 × 1; set train.global_batch_size=256 "
                   "or train.num_steps_per_rollout=2")


def test_sweep_rank_keys_checked_before_the_sweep():
    """Which jobs report logger.sweep_rank_metric is known only at the sweep's end (tests/tracking/test_sweep_summary.py);
    its form and the direction are checked with every other key."""
    probs = problems_of(["logger.sweep_rank_metric=accuracy", "logger.sweep_rank_direction=up"])
    text = "\n".join(probs)
    assert len(probs) == 2, probs
    assert "logger.sweep_rank_metric='accuracy' is not a metric name" in text
    assert "logger.sweep_rank_direction='up' is not one of ['max', 'min']" in text
    cfg = compose_run(["logger.sweep_rank_metric=rollout/reward_mean", "logger.sweep_rank_direction=min"])
    assert (cfg.logger.sweep_rank_metric, cfg.logger.sweep_rank_direction) == ("rollout/reward_mean", "min")


def test_kl_coef_without_kl_loss():
    (msg,) = problems_of(["algorithm.kl_loss_coef=0.01"])
    assert "algorithm.use_kl_loss=true" in msg


def test_free_form_dict_fields_accept_new_keys(tmp_path):
    extra = tmp_path / "sub.jsonl"
    extra.write_text('{"prompt": "1-1=", "label": "0"}\n')
    cfg = compose_run([f"+eval.eval_prompt_data.sub={extra}"])
    assert set(cfg.eval.eval_prompt_data) == {"addition", "sub"}


def test_sweep_jobs_each_validated():
    assert expand_sweeps(["seed=1,2", "algorithm=grpo,dr_grpo", "train.lr=1e-4"]) == [
        ["seed=1", "algorithm=grpo", "train.lr=1e-4"], ["seed=1", "algorithm=dr_grpo", "train.lr=1e-4"],
        ["seed=2", "algorithm=grpo", "train.lr=1e-4"], ["seed=2", "algorithm=dr_grpo", "train.lr=1e-4"]]
    probs = problems_of(["seed=1,2", "rollout.rollout_temperature=1.0,-1.0"], multirun=True)
    assert len(probs) == 2 and all("rollout_temperature=-1.0 must be > 0" in p for p in probs)


def test_every_default_lives_once_in_the_schema():
    """YAML options hold deltas only: no option repeats its schema's default value."""
    import yaml

    for group, schema in GROUP_SCHEMAS.items():
        defaults = schema()
        for path in (CONF / group).glob("*.yaml"):
            text = path.read_text()
            body = yaml.safe_load(text) or {}
            if text.startswith("# @package _global_"):  # e.g. dapo: its own group's keys sit under the group name
                body = body.get(group, {})
            for key, value in body.items():
                if key == "defaults":
                    continue
                assert hasattr(defaults, key), f"{path}: {key} is not a field of {schema.__name__}"
                assert getattr(defaults, key) != value, f"{path}: {key}={value!r} repeats the schema default"


def test_cli_bad_override_exits_2_without_traceback(workdir):
    proc = run_cli(["model=qwen9", "rollout.rollout_temperature=-1"], workdir)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "model=qwen9" in proc.stderr and "rollout.rollout_temperature=-1.0 must be > 0" in proc.stderr


def test_cli_cfg_job_prints_composed_config(workdir):
    proc = run_cli(["--cfg", "job", "rollout.rollout_batch_size=16"], workdir)
    assert proc.returncode == 0, proc.stderr
    assert "rollout_batch_size: 16" in proc.stdout and "advantage_estimator: grpo" in proc.stdout


def test_cli_help_lists_groups_and_options(workdir):
    proc = run_cli(["--help"], workdir)
    assert proc.returncode == 0
    for group in GROUP_SCHEMAS:
        assert f"{group}:" in proc.stdout, group
    assert "qwen3_tiny" in proc.stdout and "dr_grpo" in proc.stdout


def test_null_micro_batch_with_a_bad_batch_shape_is_a_config_error():
    # micro_batch_size=null is derived only once the batch identity holds; 32 x 8 = 256 is not divisible by 100, so the
    # identity error is reported (no TypeError from the later per-rank micro-batch check)
    with pytest.raises(ConfigError, match="is not divisible by train.global_batch_size=100"):
        compose_run(["cluster.backend=ray", "cluster.actor_num_gpus_per_node=2", "train.global_batch_size=100",
                     "train.micro_batch_size=null"])
