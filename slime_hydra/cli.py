"""`slime-hydra` / `python -m slime_hydra`: preflight (compose + validate all jobs), then the Hydra app.

The front door only: it reads the command line, prints the program's own --help, runs `check-hf` (the composed
model option against models/hf_check.py), hands `plan` to app/plan.py and the run to the composition floor (app/). Bad input exits with code 2 and one
clear message, never a traceback.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys

from slime_hydra.app import plan
from slime_hydra.app.preflight import compose_run, preflight
from slime_hydra.config.compose import Composer
from slime_hydra.config.store import CONF_DIR, register
from slime_hydra.errors import RunError, UserError
from slime_hydra.models.hf_check import check_hf_config

# flags of Hydra's own CLI that take a value
_VALUE_FLAGS = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn", "--config-dir",
                "-cd", "--experimental-rerun", "--info", "-i"}
_NO_PREFLIGHT = {"--help", "-h", "--hydra-help", "--version", "--shell-completion", "-sc", "--info", "-i"}


def split_argv(argv: list[str]) -> tuple[list[str], bool, str]:
    """(overrides, multirun, config_name) from Hydra's command line."""
    overrides, multirun, config_name, skip = [], False, "config", False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg in ("-m", "--multirun"):
            multirun = True
        elif arg in ("--config-name", "-cn") and i + 1 < len(argv):
            config_name, skip = argv[i + 1], True
        elif arg in _VALUE_FLAGS:
            skip = arg not in ("--info", "-i")
        elif arg.startswith("-"):
            continue
        else:
            overrides.append(arg)
    return overrides, multirun, config_name


def _set_env_defaults() -> None:
    for key, value in (("HF_HUB_OFFLINE", "1"), ("TOKENIZERS_PARALLELISM", "false")):
        os.environ.setdefault(key, value)


QUICK_START = """\
Quick start:
  slime-hydra                                   the embedded default: a tiny Qwen3 learns addition on CPU
  slime-hydra num_rollout=3 algorithm=dapo      pick group options, override any key of the schema
  slime-hydra -m algorithm=grpo,gspo seed=1,2   a sweep: every job is checked before the first starts"""

MORE = """\
More:
  slime-hydra experiment=grpo/<name>            a named, versioned experiment (experiments/, listed above)
  slime-hydra --cfg job [overrides]             print the composed config and stop
  slime-hydra plan [overrides]                  the placement plan (bundles, ranks, TP/PP/DP groups, engines, memory,
                                                weight sync) printed without starting anything; missing paths listed
  slime-hydra check-hf DIR [model=<option>]     does a model option match a Hugging Face config.json?
  slime-hydra --hydra-help                      Hydra's own flags (launchers, sweepers, output directories)
Every default lives in slime_hydra/config/schema.py; a bad key or value stops before anything starts,
naming the key and the fix (exit code 2)."""


def help_text(config_name: str = "config") -> str:
    """The front door: what this is, a quick start, and the groups a user picks from (their default marked)."""
    with Composer(config_name) as composer:
        picked = composer.choices()
        groups = {g: composer.group_options(g) for g in sorted(composer.groups())}
    lines = ["slime-hydra: declarative RL post-training for LLMs (GRPO, PPO, DAPO, ...), composed with Hydra.",
             "usage: slime-hydra [group=option ...] [key=value ...] [-m]", "", QUICK_START, "",
             "Config groups (group=option; * the default):"]
    for group, options in groups.items():
        marked = [f"{o}*" if o == picked.get(group) else o for o in options]
        if group == "experiment":  # long names: one a line
            lines.append(f"  {group}:")
            lines += [f"    {o}" for o in marked]
        else:
            lines.append(f"  {group}: {', '.join(marked)}")
    return "\n".join(lines + ["", MORE])


def task(cfg) -> float | None:
    """The Hydra task (app/session.py), with bad input or a named failure printed and the exit code set."""
    from slime_hydra.app.session import task as run_task  # torch, mlflow, the engine: once the config is valid

    try:
        return run_task(cfg)
    except (UserError, RunError) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(e.exit_code)


def plan_command(argv: list[str]) -> int:
    """`slime-hydra plan [overrides...]`: app/plan.py prints the placement plan; one job, no Hydra flags."""
    if "-h" in argv or "--help" in argv:
        print(plan.USAGE)
        return 0
    gpus_per_node = None
    if "--gpus-per-node" in argv:
        i = argv.index("--gpus-per-node")
        value = argv[i + 1] if i + 1 < len(argv) else ""
        if not value.isdigit():
            print(f"{plan.USAGE}\nerror: --gpus-per-node takes a number of GPUs, got {value!r}", file=sys.stderr)
            return 2
        gpus_per_node, argv = int(value), argv[:i] + argv[i + 2:]
    overrides, multirun, config_name = split_argv(argv)
    flags = [a for a in argv if a.startswith("-") and a not in ("--config-name", "-cn")]
    if multirun or flags:
        print(f"{plan.USAGE}\nerror: a plan is of one job; {' '.join(flags)} is not taken here", file=sys.stderr)
        return 2
    return plan.main(overrides, config_name, gpus_per_node)


CHECK_HF_USAGE = "usage: slime-hydra check-hf CONFIG_JSON_OR_DIR [model=<option> overrides...]"


def check_hf_command(argv: list[str]) -> int:
    """`slime-hydra check-hf DIR [model=<option> overrides...]`: does the composed model option match a Hugging Face
    config.json? Prints each mismatch; exit 0 when they match, 2 otherwise."""
    if not argv or argv[0].startswith("-") or "=" in argv[0]:
        print(CHECK_HF_USAGE, file=sys.stderr)
        return 2
    try:
        model = compose_run(argv[1:]).model
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    problems = check_hf_config(model, argv[0])
    for p in problems:
        print(f"mismatch: {p}")
    if not problems:
        print(f"model={model.name} matches {argv[0]}")
    return 2 if problems else 0


def main() -> None:
    # The interpreter's last garbage collection walks every object of the stack the run imported (torch, transformers,
    # mlflow, sympy): 10-15 s measured on a busy 2-core machine, after the run has ended, inside a scheduler's stop
    # grace. Registered first, so it runs after every other exit handler: what is left is frozen, never walked.
    atexit.register(gc.freeze)
    _set_env_defaults()
    argv = sys.argv[1:]
    if argv[:1] == ["check-hf"]:
        sys.exit(check_hf_command(argv[1:]))
    if argv[:1] == ["plan"]:
        sys.exit(plan_command(argv[1:]))
    if "--help" in argv or "-h" in argv:
        print(help_text(split_argv(argv)[2]))
        return
    register()
    if not _NO_PREFLIGHT.intersection(argv):
        overrides, multirun, config_name = split_argv(argv)
        try:
            preflight(overrides, multirun=multirun, config_name=config_name)
        except UserError as e:
            print(f"error: {e}", file=sys.stderr, flush=True)
            sys.exit(e.exit_code)
    import hydra

    hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")(task)()


if __name__ == "__main__":
    main()
