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


def start() -> None:
    """ray.init of a new local cluster, token-authenticated and bound to the loopback."""
    import ray

    check_auth_mode()
    if not (os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")):
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)  # once per process: Ray's token loader caches it
    with loopback_node():
        ray.init(address="local", include_dashboard=False, logging_level="WARNING")
    gcs = ray.get_runtime_context().gcs_address
    if not is_loopback(gcs) or os.environ.get("RAY_AUTH_MODE") != "token":
        ray.shutdown()
        raise RunError(f"the local Ray cluster came up at {gcs} with RAY_AUTH_MODE={os.environ.get('RAY_AUTH_MODE')}, "
                       "not on the loopback with token auth (a Ray release that binds or authenticates differently); "
                       "start a cluster yourself (`ray start --head`, docs/security.md) and set cluster.address")
