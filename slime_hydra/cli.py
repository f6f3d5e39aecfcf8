"""`slime-hydra` / `python -m slime_hydra`: preflight (compose + validate all jobs), then the Hydra app.

Bad input exits with code 2 and one clear message, never a traceback.
"""

from __future__ import annotations

import os
import sys

from slime_hydra.errors import RunError, UserError

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
    for key, value in (("HF_HUB_OFFLINE", "1"), ("RAY_AUTH_MODE", "disabled"), ("TOKENIZERS_PARALLELISM", "false")):
        os.environ.setdefault(key, value)


def task(cfg) -> float | None:
    """The Hydra task: typed config -> validated -> run. Returns the final eval accuracy (for sweepers)."""
    from hydra.core.hydra_config import HydraConfig

    from slime_hydra.config.preflight import validate_composed
    from slime_hydra.errors import ConfigError

    try:
        typed, problems, notes = validate_composed(cfg)
        if problems:
            raise ConfigError(problems)
        from hydra.types import RunMode

        from slime_hydra.orchestration.sweep import absolute_tracking_uri, parent_run_id

        hc = HydraConfig.get()
        output_dir = typed.output_dir or hc.runtime.output_dir
        typed.logger.tracking_uri = absolute_tracking_uri(typed.logger.tracking_uri, hc.runtime.cwd)
        parent = parent_run_id(hc.sweep.dir) if hc.mode == RunMode.MULTIRUN else None
        for note in notes:
            print(note, flush=True)
        from slime_hydra.engine.session import run_session

        summary = run_session(typed, output_dir, list(hc.overrides.task), parent)
    except (UserError, RunError) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(e.exit_code)
    accs = [v["last"] for k, v in summary.items() if k.startswith("eval/") and k.endswith("/accuracy")]
    return sum(accs) / len(accs) if accs else summary.get("rollout/reward_mean", {}).get("last")


def main() -> None:
    _set_env_defaults()
    from slime_hydra.config.store import register

    register()
    argv = sys.argv[1:]
    if not _NO_PREFLIGHT.intersection(argv):
        from slime_hydra.config.preflight import preflight

        overrides, multirun, config_name = split_argv(argv)
        try:
            preflight(overrides, multirun=multirun, config_name=config_name)
        except UserError as e:
            print(f"error: {e}", file=sys.stderr, flush=True)
            sys.exit(e.exit_code)
    import hydra

    from slime_hydra.config.store import CONF_DIR

    hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")(task)()


if __name__ == "__main__":
    main()
