"""A Ray cluster a run starts for itself (`cluster.backend=ray` without `cluster.address`): token auth, loopback only.

Anyone who can reach a Ray cluster's GCS can run code on it as the user who started it, with that user's GPUs and
credentials. A run's own cluster is reached by nothing but the run, so:
- token auth is on (Ray's default for a new local cluster since 2.59): a token of the process's own (RAY_AUTH_TOKEN,
  random, in this process's environment, which the cluster's processes inherit and other users cannot read), unless
  the user gave one (RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH). Ray's own default would write a token shared by every run
  of the user to ~/.ray/auth_token, readable under a permissive umask. RAY_AUTH_MODE=disabled is refused.
- every server binds the loopback: Ray binds its servers to the node's IP, which for a single-node cluster it takes
  to be 127.0.0.1 when `ray_constants.ENABLE_RAY_CLUSTER` is off (its setting for machines without multi-node
  clusters); it is off only while ray.init starts the node (`loopback_node`, also used to join a cluster named by a
  loopback address, which Ray would otherwise look for at the node's outside IP).
Both are checked once the cluster is up; a cluster that came up otherwise is stopped and reported.
A cluster named by `cluster.address` (or $RAY_ADDRESS) is the user's: its auth and interfaces are theirs to set.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import tempfile
from typing import Iterator

from slime_hydra.errors import RunError, UserError


def check_auth_mode() -> None:
    mode = os.environ.get("RAY_AUTH_MODE")
    if mode not in (None, "", "token"):
        raise UserError(f"RAY_AUTH_MODE={mode}: the Ray cluster a run starts for itself runs with token auth (without it, "
                        "anyone who can reach this node can run code as you on it); unset RAY_AUTH_MODE, or point "
                        "cluster.address at a cluster you started yourself")


@contextlib.contextmanager
def loopback_node():
    """While ray.init runs in it, this node's address is 127.0.0.1 (Ray otherwise takes the IP other hosts reach it at,
    and turns a 127.0.0.1 address into that IP too)."""
    from ray._private import ray_constants

    multi_node, ray_constants.ENABLE_RAY_CLUSTER = ray_constants.ENABLE_RAY_CLUSTER, False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = multi_node  # the node's address is fixed now; a later cluster decides anew


def is_loopback(address: str) -> bool:
    """A `host:port` on this machine's loopback (a cluster started as docs/security.md shows)."""
    host = address.rpartition(":")[0].strip("[]")
    return host in ("127.0.0.1", "localhost", "::1")


@contextlib.contextmanager
def signals_left_to_the_driver() -> Iterator[None]:
    """SIGTERM and SIGINT blocked while a local cluster starts: its processes (GCS, raylet, and the workers and actors
    they start) inherit the mask, so a scheduler's signal to the whole process group leaves them running while the
    driver finishes its step and checkpoints through them (app/stop.py); the driver then stops them. Ray blocks
    SIGINT in them itself. The cost: Ray's own shutdown waits a second per process before its SIGKILL."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def run_temp_dir() -> str:
    """A local cluster's own temp dir (sessions, sockets, logs), so two users (or two runs) on one node never share
    /tmp/ray: `<ray-XXXX>/r`, where ray-XXXX is made owner-only (mkdtemp: mode 0700) and `r` is Ray's (which Ray makes
    world-writable, as it makes /tmp/ray: the owner-only parent closes it). $RAY_TMPDIR, if set, is where it goes; the
    system temp dir otherwise (a short path: Ray's socket paths must fit in 107 bytes)."""
    return os.path.join(tempfile.mkdtemp(prefix="ray-", dir=os.environ.get("RAY_TMPDIR") or None), "r")


def start() -> None:
    """ray.init of a new local cluster, token-authenticated and bound to the loopback."""
    import ray

    check_auth_mode()
    if not (os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")):
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)  # once per process: Ray's token loader caches it
    with loopback_node(), signals_left_to_the_driver():
        ray.init(address="local", include_dashboard=False, logging_level="WARNING", _temp_dir=run_temp_dir())
    gcs = ray.get_runtime_context().gcs_address
    if not is_loopback(gcs) or os.environ.get("RAY_AUTH_MODE") != "token":
        ray.shutdown()
        raise RunError(f"the local Ray cluster came up at {gcs} with RAY_AUTH_MODE={os.environ.get('RAY_AUTH_MODE')}, "
                       "not on the loopback with token auth (a Ray release that binds or authenticates differently); "
                       "start a cluster yourself (`ray start --head`, docs/security.md) and set cluster.address")
