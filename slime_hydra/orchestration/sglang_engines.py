"""`rollout.backend=sglang` under `cluster.backend=ray`: each SGLang server owned by a Ray actor on its bundle(s).

The driver keeps what it has in one process: the SGLangRollout (generation, weight sync, health monitor,
restarts, all over HTTP) and the sglang-router in front of the engines. Only where a server process runs
changes: `RayLauncher` (the engines.Launcher seam) places one `SGLangEngineActor` (orchestration/engine_actor.py, which
leaves torch unimported) per engine on the engine's first bundle (its share of the bundle: `Layout.actor_options`),
and the actor starts the server as its own child (ManagedProcess: the server's process group gets SIGTERM when the
actor dies) and reports where it listens. A restart relaunches through the same actor, or through a new one on the same
bundle if the actor died. Every wait on an actor is a RayCalls wait with `cluster.ray_call_timeout_s`.

Weights come from the train ranks (orchestration/rank_weights.py, slime's routes; each pipeline stage's from a rank of
that stage): colocated engines get handles to the tensors of ranks on their own node (CUDA IPC on GPUs), the others a
broadcast over update groups the feeding ranks open (NCCL on GPUs, gloo on CPU). Otherwise (disk sync, local weights)
the driver fetches train rank 0's weights from the object store and sends them as in one process.

Engines on every node: each engine's actor runs on its own bundle's node and its server listens there, on the
loopback when that is the driver's node (nothing else reaches it) and on the node's IP otherwise, where the router in
the driver reaches it (every request carries the run's API key). Such an engine loads the initial checkpoint from the
driver's output directory and writes its log there (and disk sync writes there): on several machines that directory
must be on a filesystem every node mounts, as slime's checkpoint paths are. Only handles posted from the driver's own
memory (weight_sync=tensor where the ranks cannot send) need every engine on the driver's node; that is refused at
launch with the keys to change. On GPUs an engine of several bundles sees the GPUs of all its bundles
(CUDA_VISIBLE_DEVICES from a probe on each bundle, as slime does).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

import ray

from slime_hydra.errors import RunError, UserError
from slime_hydra.orchestration.calls import RayCalls
from slime_hydra.orchestration.engine_actor import SGLangEngineActor, probe_bundle
from slime_hydra.orchestration.placement import Layout, on_bundle
from slime_hydra.rollout.sglang.backend import SGLangRollout
from slime_hydra.rollout.sglang.engines import Argv


class RemoteServer:
    """The driver's handle on a server process inside an engine actor (engines.ServerProcess)."""

    def __init__(self, actor, pid: int, log_path: Path, calls: RayCalls, label: str):
        self.actor, self._pid, self.log_path, self.calls, self.label = actor, pid, Path(log_path), calls, label

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def returncode(self) -> Optional[int]:
        try:
            return self.calls.get(self.actor.returncode.remote(), "server exit code", [self.label])
        except RunError:
            return None

    def alive(self) -> bool:
        """A dead actor (its server died with it) or one that does not answer within the deadline: not alive."""
        try:
            return bool(self.calls.get(self.actor.alive.remote(), "server health", [self.label]))
        except RunError:
            return False

    def stop(self, grace_s: float = 10.0) -> None:
        self.calls.shutdown(self.actor.stop.remote(grace_s), "stopping the server", [self.label])

    def kill(self) -> None:
        self.calls.shutdown(self.actor.kill.remote(), "killing the server", [self.label])

    def listens_on(self, port: int) -> bool:
        """Asked where the server runs (the actor reads its own children's sockets); an actor that does not answer: no."""
        try:
            return bool(self.calls.get(self.actor.listens_on.remote(port), "server's socket", [self.label]))
        except RunError:
            return False

    def log_tail(self, n: int = 30) -> str:
        try:
            return self.calls.get(self.actor.log_tail.remote(n), "server log", [self.label])
        except RunError:  # the actor is gone: the file is in the driver's output directory (a shared one across nodes)
            try:
                return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
            except OSError:
                return ""


class RayLauncher:
    """engines.Launcher: engine e's server in an SGLangEngineActor on `layout.engine_bundles[e]`, listening on the
    loopback on the driver's node and on its node's IP elsewhere (where the router in the driver reaches it).
    driver_node_only: why every engine must share the driver's node (the weights are handles to the driver's own
    memory), or None."""

    def __init__(self, pg, layout: Layout, calls: RayCalls, driver_node_only: Optional[str] = None):
        self.pg, self.layout, self.calls, self.driver_node_only = pg, layout, calls, driver_node_only
        self.actors: dict[int, object] = {}
        self.actor_pids: dict[int, int] = {}
        self.gpus: dict[int, list[str]] = {}
        self.nodes: dict[int, tuple[str, str]] = {}  # engine -> (node id, the host its server listens on)
        self.here = ray.get_runtime_context().get_node_id()

    def _label(self, index: int) -> str:
        return f"sglang engine actor {index}"

    def _new_actor(self, index: int):
        bundles = self.layout.engine_bundles[index]
        actor = ray.remote(SGLangEngineActor).options(**self.layout.actor_options(), **on_bundle(self.pg, bundles[0]),
                                                      max_concurrency=1).remote(index)
        node, ip, pid, gpus = self.calls.get(actor.where.remote(), "starting the engine actor", [self._label(index)])
        if self.layout.use_gpu and len(bundles) > 1:  # the other bundles' GPUs: probed where Ray placed them
            probe = ray.remote(probe_bundle)
            found = self.calls.get([probe.options(num_cpus=0, num_gpus=0.01, **on_bundle(self.pg, b)).remote() for b in bundles[1:]],
                                   "probing the engine's bundles", [f"bundle {b}" for b in bundles[1:]])
            if any(n != node for n, _ in found):
                ray.kill(actor)
                raise UserError(f"SGLang engine {index} spans bundles {list(bundles)} on more than one node; an engine of "
                                f"cluster.rollout_num_gpus_per_engine GPUs must fit on one node: lower it to the GPUs per node")
            gpus = gpus + [g for _, ids in found for g in ids]
        if node != self.here and self.driver_node_only:
            ray.kill(actor)
            raise UserError(f"SGLang engine {index} was placed on node {ip} ({node}), the driver runs on another: "
                            f"{self.driver_node_only}")
        self.actors[index], self.actor_pids[index], self.gpus[index] = actor, pid, gpus
        self.nodes[index] = (node, "127.0.0.1" if node == self.here else ip)
        return actor

    def launch(self, index: int, argv: Argv, log_path: Path, env: dict[str, str],
               port: Optional[int]) -> tuple[RemoteServer, str, int]:
        env = dict(env)
        actor = self.actors.get(index) or self._new_actor(index)
        for attempt in (0, 1):
            if self.layout.use_gpu:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(self.gpus[index])
            try:
                host = self.nodes[index][1]
                pid, port = self.calls.get(actor.launch.remote(argv, str(log_path), env, port, host),
                                           "launching the SGLang server", [self._label(index)])
                return RemoteServer(actor, pid, log_path, self.calls, self._label(index)), host, port
            except RunError:
                if attempt:
                    raise
                ray.kill(actor)  # dead (or stuck): a new actor on the same bundle
                actor = self._new_actor(index)
        raise AssertionError("unreachable")

    def shutdown(self) -> None:
        """The servers were stopped through their actors; the actors go (a server still there gets SIGTERM)."""
        for actor in self.actors.values():
            ray.kill(actor)
        self.actors.clear()


class SaveThroughRank0:
    """What the engines start from: train rank 0's model, saved by the rank (the driver builds no model)."""

    def __init__(self, trainer, tokenizer):
        self.trainer, self.tokenizer = trainer, tokenizer

    def save_pretrained(self, path, safe_serialization: bool = True) -> None:
        self.trainer.save_hf(str(path), self.tokenizer)


class RaySGLangRollout(SGLangRollout):
    """SGLangRollout whose engines are Ray actors; its shutdown then releases the train group and placement."""

    def __init__(self, *args, on_shutdown: Optional[Callable[[], None]] = None, **kwargs):
        self._on_shutdown = None  # a start that fails shuts the engines down; the driver then removes the placement
        super().__init__(*args, **kwargs)
        self._on_shutdown = on_shutdown

    def shutdown(self) -> None:
        done, self._on_shutdown = self._on_shutdown, None  # once: the placement group goes with it
        try:
            super().shutdown()
        finally:
            if done is not None:
                done()
