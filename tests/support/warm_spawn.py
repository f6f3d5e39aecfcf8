"""`torch.multiprocessing.spawn` for the tests' rank processes (torch and megatron ranks over gloo outside Ray), each
forked from the warm interpreter (tests/support/warm_cli.py's forkserver) instead of started cold.

A spawned rank starts a fresh interpreter and imports torch, transformers and slime_hydra before it runs a line of the
test's function; the forkserver has imported them once for the whole test process. What a rank needs of its
environment it sets itself (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; the megatron CPU shim), and a fork of the
forkserver has the session's environment, as the CLI runs forked from it have. Where the forkserver cannot be used
(no session environment, SLIME_HYDRA_TEST_COLD_CLI=1) the ranks are spawned as torch does.
"""

from __future__ import annotations

import torch.multiprocessing

from tests.support import warm_cli

STARTS = {"warm": 0, "cold": 0}  # this process's ranks by how they started


def spawn(fn, args: tuple = (), nprocs: int = 1, join: bool = True):
    """As torch.multiprocessing.spawn(fn, args, nprocs, join): fn(i, *args) in each of nprocs processes; with join, wait
    and raise a rank's error (ProcessRaisedException naming the rank); without, the ProcessContext to join."""
    if not warm_cli.usable(warm_cli.SESSION_ENV):  # no session environment, or SLIME_HYDRA_TEST_COLD_CLI=1
        STARTS["cold"] += nprocs
        return torch.multiprocessing.spawn(fn, args=args, nprocs=nprocs, join=join)
    warm_cli.start()
    STARTS["warm"] += nprocs
    return torch.multiprocessing.start_processes(fn, args=args, nprocs=nprocs, join=join, start_method="forkserver")
