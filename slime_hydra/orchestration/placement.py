"""Resource layout: one placement group from slime's cluster keys, checked against the Ray cluster.

One bundle per GPU: the actor slice (bundles 0 .. A-1, one data-parallel train rank each), then the
rollout slice (A .. A+R-1, one engine per `rollout_num_gpus_per_engine` bundles). Colocated, the
rollout slice *is* the actor slice (offset 0; the group has max(A, R) bundles) and a train rank and
an engine share each bundle by halves. Without GPUs a "GPU" is a bundle of one CPU, so CI runs the
same code. `plan_layout` and `layout_problems` are pure; the rest talks to Ray.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Optional

from slime_hydra import ports
from slime_hydra.config.schema import ClusterConfig
from slime_hydra.errors import UserError
from slime_hydra.orchestration import local_cluster


@dataclass(frozen=True)
class Layout:
    use_gpu: bool
    colocate: bool
    actor_bundles: tuple[int, ...]  # one per train rank
    engine_bundles: tuple[tuple[int, ...], ...]  # the bundles of each rollout engine
    num_bundles: int

    @property
    def bundle(self) -> dict[str, float]:
        return {"GPU": 1.0, "CPU": 1.0} if self.use_gpu else {"CPU": 1.0}

    @property
    def share(self) -> float:
        """The fraction of a bundle a train rank or an engine takes (halves when colocated)."""
        return 0.5 if self.colocate else 1.0

    def actor_options(self) -> dict[str, float]:
        """Ray resource options of a train rank or an engine on its bundle."""
        return {"num_cpus": self.share, "num_gpus": self.share if self.use_gpu else 0}


def plan_layout(c: ClusterConfig, use_gpu: bool) -> Layout:
    """The placement group of a validated ClusterConfig (rollout_num_gpus already derived)."""
    actor = c.actor_num_nodes * c.actor_num_gpus_per_node
    rollout = c.rollout_num_gpus
    offset = 0 if c.colocate else actor
    per = c.rollout_num_gpus_per_engine
    engines = tuple(tuple(range(offset + e * per, offset + (e + 1) * per)) for e in range(rollout // per))
    total = max(actor, rollout) if c.colocate else actor + rollout
    return Layout(use_gpu, c.colocate, tuple(range(actor)), engines, total)


def layout_problems(c: ClusterConfig, layout: Layout, total: dict[str, float], largest_node_gpus: float,
                    where: str) -> list[str]:
    """What the cluster (`total` resources, its largest node's GPUs) cannot hold, each with the fix."""
    kind = "GPU" if layout.use_gpu else "CPU"
    have = total.get(kind, 0.0)
    actor = len(layout.actor_bundles)
    ask = (f"cluster.actor_num_nodes × cluster.actor_num_gpus_per_node = {c.actor_num_nodes} × {c.actor_num_gpus_per_node} = {actor} "
           f"train bundle(s) {'shared with' if c.colocate else 'plus'} cluster.rollout_num_gpus = {c.rollout_num_gpus} rollout bundle(s) "
           f"(cluster.colocate={str(c.colocate).lower()}) = {layout.num_bundles} bundle(s) of {{{kind}: 1}}")
    problems = []
    if layout.num_bundles > have:
        fix = "set cluster.colocate=true, " if not c.colocate else ""
        problems.append(f"{ask}, but the Ray cluster ({where}) has {have:g} {kind}; {fix}lower cluster.actor_num_gpus_per_node "
                        f"or cluster.rollout_num_gpus, or point cluster.address at a cluster with {layout.num_bundles} {kind}")
    if layout.use_gpu and have >= layout.num_bundles and c.actor_num_gpus_per_node > largest_node_gpus:
        problems.append(f"cluster.actor_num_gpus_per_node={c.actor_num_gpus_per_node}, but the largest node of the Ray cluster "
                        f"({where}) has {largest_node_gpus:g} GPU; set cluster.actor_num_gpus_per_node<={largest_node_gpus:g} "
                        "and raise cluster.actor_num_nodes")
    if layout.use_gpu and total.get("CPU", 0.0) < layout.num_bundles:
        problems.append(f"{ask}: each bundle also takes 1 CPU, but the Ray cluster ({where}) has {total.get('CPU', 0):g} CPU")
    return problems


# -- Ray ---------------------------------------------------------------------------------------
def connect(c: ClusterConfig) -> tuple[bool, str]:
    """Join (or start) the Ray cluster; returns (whether we started it, a description for messages)."""
    import ray

    if ray.is_initialized():  # a Hydra Ray launcher job, a test's cluster
        return False, f"the connected cluster at {ray.get_runtime_context().gcs_address}"
    address = c.address if c.address is not None else os.environ.get("RAY_ADDRESS")
    if address in (None, "", "local"):
        local_cluster.start()  # token auth, loopback only: never another cluster found on the machine
        return True, "a new local cluster"
    probe_gcs(address, c.placement_timeout_s)
    try:
        with local_cluster.loopback_node() if local_cluster.is_loopback(address) else contextlib.nullcontext():
            ray.init(address=address, logging_level="WARNING")
    except (ConnectionError, RuntimeError) as e:
        if token_refused(e):
            raise UserError(f"cluster.address={address}: the Ray cluster there refused this process's token; set "
                            "RAY_AUTH_MODE=token and RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH) to the cluster's token "
                            "(docs/security.md)") from None
        raise UserError(f"cluster.address={address}: cannot connect to a Ray cluster there ({e}); start one with "
                        "`ray start --head` or set cluster.address=local") from None
    return False, f"cluster.address={address}"


def token_refused(e: BaseException) -> bool:
    """Whether ray.init failed on the cluster's token auth (Ray chains it under its ConnectionError, as an
    AuthenticationError or as a message from the GCS)."""
    import ray

    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, ray.exceptions.AuthenticationError) or "InvalidAuthToken" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


def probe_gcs(address: str, timeout_s: float) -> None:
    """A `host:port` that nothing answers at fails here, within timeout_s: ray.init itself retries a dead address
    for ~20 x 40 s before giving up. ("auto" and ray:// addresses are left to Ray.)"""
    import socket

    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "://" in address:
        return
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise UserError(f"cluster.address={address}: no Ray cluster answers there within cluster.placement_timeout_s="
                        f"{timeout_s:g} s ({e.strerror or repr(e)}); start one with `ray start --head`, fix the address, or set "
                        "cluster.address=local") from None


def resolve_use_gpu(c: ClusterConfig, total: dict[str, float]) -> bool:
    if c.device == "cpu":
        return False
    if c.device == "cuda":
        return True
    return total.get("GPU", 0.0) > 0


def create_placement_group(c: ClusterConfig, where: str):
    """Check the layout against the cluster, then reserve it. Raises UserError (exit 2) naming the keys."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    total = ray.cluster_resources()
    use_gpu = resolve_use_gpu(c, total)
    layout = plan_layout(c, use_gpu)
    largest = max((n["Resources"].get("GPU", 0.0) for n in ray.nodes() if n.get("Alive")), default=0.0)
    problems = layout_problems(c, layout, total, largest, where)
    if problems:
        from slime_hydra.errors import ConfigError

        raise ConfigError(problems)
    pg = placement_group([layout.bundle] * layout.num_bundles, strategy="PACK")
    ready = ray.wait([pg.ready()], timeout=c.placement_timeout_s)[0]
    if not ready:
        remove_placement_group(pg)
        raise UserError(f"the placement group of {layout.num_bundles} bundle(s) of {layout.bundle} was not scheduled within "
                        f"cluster.placement_timeout_s={c.placement_timeout_s:g} s on {where} (free now: "
                        f"{free_resources()}); other jobs hold the resources, or raise cluster.placement_timeout_s")
    return pg, layout


def free_resources() -> dict[str, float]:
    """What the cluster has free, without the per-placement-group names Ray adds (CPU_group_<id>, bundle_group_...)."""
    import ray

    return {k: v for k, v in ray.available_resources().items() if "_group_" not in k and not k.startswith("node:")}


def on_bundle(pg, index: int) -> dict:
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return {"scheduling_strategy": PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=index)}


def bundle_nodes(pg) -> dict[int, str]:
    """Where Ray placed each bundle of the (ready) group: bundle index -> node id."""
    from ray.util import placement_group_table

    return {int(b): node for b, node in placement_group_table(pg)["bundles_to_node_id"].items()}


def node_ip_and_free_port() -> tuple[str, int]:
    """Run inside rank 0: the address its process group listens on."""
    import ray

    return ray.util.get_node_ip_address(), ports.free_port()


def shutdown(pg: Optional[object], started: bool) -> None:
    import ray
    from ray.util.placement_group import remove_placement_group

    if pg is not None:
        remove_placement_group(pg)
    if started:
        ray.shutdown()
