"""The Ray actor that owns one SGLang server process on its engine's bundle, and the probe of an engine's other bundles.

Kept apart from the driver's side (orchestration/sglang_engines.py) so that the worker process Ray starts for it imports
only Ray and process management: the actor starts a server as its own child and reports on it, and never touches a
tensor, so it leaves torch unimported (CPU-seconds and memory per actor, on every node that runs an engine;
tests/orchestration/test_sglang_engines.py checks it after a whole run).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import ray

from slime_hydra.rollout.sglang.process import ManagedProcess, free_port

if TYPE_CHECKING:
    from slime_hydra.rollout.sglang.engines import Argv


class SGLangEngineActor:
    """Owns one engine's server process (a Ray actor on the engine's first bundle)."""

    def __init__(self, index: int):
        self.index = index
        self.process: Optional[ManagedProcess] = None

    def where(self) -> tuple[str, str, int, list]:
        """(node id, node ip, this actor's pid, the GPU ids Ray gave it)."""
        return (ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address(), os.getpid(),
                [str(g) for g in ray.get_gpu_ids()])

    def launch(self, argv: Argv, log_path: str, env: dict[str, str], port: Optional[int], host: str) -> tuple[int, int]:
        """Start the server on `host`:`port` (a free port if None) -> (its pid, the port)."""
        if self.process is not None:
            self.process.stop(grace_s=2.0)
        port = port if port is not None else free_port()
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        self.process = ManagedProcess(f"sglang-engine-{self.index}", argv(host, port), Path(log_path), env).start()
        return self.process.pid, port

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()

    def returncode(self) -> Optional[int]:
        return self.process.returncode if self.process else None

    def stop(self, grace_s: float) -> None:
        if self.process is not None:
            self.process.stop(grace_s=grace_s)

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()

    def log_tail(self, n: int) -> str:
        return self.process.log_tail(n) if self.process else ""

    def listens_on(self, port: int) -> bool:
        return self.process is not None and self.process.listens_on(port)


def probe_bundle() -> tuple[str, list]:
    """Run on one bundle: its node and the GPU ids Ray assigned there."""
    return ray.get_runtime_context().get_node_id(), [str(g) for g in ray.get_gpu_ids()]
