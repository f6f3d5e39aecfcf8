"""`python -m tests.support.megatron_cpu.cli ARGS`: the slime-hydra CLI with the CPU shim installed (megatron on CPU), in
this process and, under cluster.backend=ray, in every Ray worker of the run (ray.init's worker_process_setup_hook)."""

from pathlib import Path

import ray

from tests.support.megatron_cpu import shim

shim.install()
_ray_init = ray.init
ROOT = str(Path(__file__).resolve().parents[3])


def _init_with_shim(*args, **kwargs):
    """ray.init whose job runs the shim in each worker first (the repository on the workers' path for the hook)."""
    env = dict(kwargs.pop("runtime_env", None) or {})
    env.setdefault("worker_process_setup_hook", "tests.support.megatron_cpu.shim.install")
    env.setdefault("env_vars", {}).setdefault("PYTHONPATH", ROOT)
    return _ray_init(*args, runtime_env=env, **kwargs)


ray.init = _init_with_shim

from slime_hydra.cli import main  # noqa: E402

if __name__ == "__main__":
    main()
