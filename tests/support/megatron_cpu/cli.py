"""`python -m tests.support.megatron_cpu.cli ARGS`: the slime-hydra CLI with the CPU shim installed (megatron on CPU)."""

from tests.support.megatron_cpu import shim

shim.install()

from slime_hydra.cli import main  # noqa: E402

if __name__ == "__main__":
    main()
