"""Weight sync over a distributed update group (disaggregated engines): `rollout.weight_sync=distributed`.

Per engine, one torch process group of 1 + tp ranks: rank 0 is the process holding the trainer's tensors,
ranks 1..tp are the engine's tp workers, joined by SGLang's /init_weights_update_group. That process is
this one (one process, or the driver's copy from the object store when the ranks cannot send) or, under
Ray, the train rank chosen to feed the engine (orchestration/rank_weights.py: it opens the group and
broadcasts its own staged tensors, as slime's ranks do; the driver only pauses, flushes and continues).
A bucket (at most `update_weight_buffer_size` bytes in the engine's dtype, packed by size alone, as
`weights.buckets` does for every path) is one /update_weights_from_distributed
request naming its tensors, dtypes and shapes, posted from a thread of rank 0's process; while the
engine waits in it, rank 0 broadcasts the tensors in that order. The backend is gloo on CPU and NCCL on
CUDA (the device of the process holding the tensors: a rank's own GPU under Ray).
One group per engine, not one for all: a restarted engine gets a new group without touching the
others, and engines fed by different ranks receive at the same time (slime uses one group; on many
engines that broadcasts once instead of once per engine). `UpdateGroups` keeps a process's groups.
An engine on another host (a multi-node Ray placement) reaches rank 0 at rank 0's host IP, not the loopback.
"""

from __future__ import annotations

import datetime
import itertools
import os
import threading
import time
from typing import Optional

import torch

from slime_hydra.rollout.sglang import weights as W
from slime_hydra.rollout.sglang.endpoint import Endpoint
from slime_hydra.rollout.sglang.process import free_port

_OPENED = itertools.count()  # groups opened by this process
_OPENING = threading.Lock()  # torch's group registry is process-global: one group built at a time


def open_rank0_group(backend: str, host: str, port: int, world_size: int, group_name: str, timeout_s: float):
    """Rank 0 of a process group outside torch's default group, rendezvous at tcp://host:port (this process's host).

    The same torch calls SGLang's engine side makes (rendezvous, a store prefixed by the group name,
    a group built on that store), so both sides meet on the same keys; no sglang import here."""
    from torch.distributed import distributed_c10d as c10d

    timeout = datetime.timedelta(seconds=timeout_s)
    store, rank, world_size = next(c10d.rendezvous(f"tcp://{host}:{port}", 0, world_size, timeout=timeout))
    store.set_timeout(timeout)
    store = c10d.PrefixStore(group_name, store)
    pg, _ = c10d._new_process_group_helper(world_size, rank, [], c10d.Backend(backend), store, group_name=group_name,
                                           timeout=timeout)
    c10d._world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg


def _post_in_thread(url: Endpoint, path: str, body: dict, timeout: float) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def go() -> None:
        try:
            out["response"] = W.post(url, path, body, timeout)
        except Exception as e:  # noqa: BLE001 - reported by the caller after join
            out["error"] = e

    t = threading.Thread(target=go, name=f"sglang{path}", daemon=True)
    t.start()
    return t, out


def _result(t: threading.Thread, out: dict, what: str, timeout: float) -> dict:
    t.join(timeout)
    if t.is_alive():
        raise W.WeightSyncError(f"{what}: no answer within {timeout:.0f} s")
    if "error" in out:
        raise W.WeightSyncError(f"{what}: {out['error']!r}")
    return W.ok(out["response"], what)


class UpdateGroup:
    """This process (rank 0) and one engine's tp ranks; `send` pushes named tensors to the engine."""

    def __init__(self, url: Endpoint, tp_size: int, backend: str, timeout_s: float, name: str, master_address: str = "127.0.0.1"):
        """master_address: where the engine reaches this process (the loopback on its own host, else this host's IP)."""
        self.url, self.tp_size, self.backend, self.timeout_s, self.name = url, tp_size, backend, timeout_s, name
        self.master_address = master_address
        self.device = "cpu" if backend == "gloo" else "cuda"
        self.pg, self.pg_name = None, ""

    def open(self) -> None:
        """A torch group name is taken for good in a process once used (the engine's too, whoever opened it): every group
        opened gets a new one, unique across the processes that feed the engine (the pid)."""
        port, self.pg_name = free_port(), f"{self.name}_{os.getpid()}_{next(_OPENED)}"
        body = {"master_address": self.master_address, "master_port": port, "rank_offset": 1, "world_size": 1 + self.tp_size,
                "group_name": self.pg_name, "backend": self.backend}
        t, out = _post_in_thread(self.url, "/init_weights_update_group", body, self.timeout_s)
        try:
            with _OPENING:
                self.pg = open_rank0_group(self.backend, self.master_address, port, 1 + self.tp_size, self.pg_name, self.timeout_s)
        except Exception as e:
            t.join(self.timeout_s)
            detail = out.get("response").text[:300] if "response" in out else out.get("error")
            raise W.WeightSyncError(f"init_weights_update_group({self.backend}) with {self.url} failed: {e!r}; "
                                    f"engine: {detail}") from e
        _result(t, out, f"init_weights_update_group({self.backend}) on {self.url}", self.timeout_s)

    def send(self, named_tensors: list[tuple[str, torch.Tensor]], version: int, buffer_bytes: int, dtype: str) -> int:
        """All buckets to the engine (inside its weight-update session); returns the number of
        /update_weights_from_distributed requests (= buckets)."""
        if self.pg is None:
            self.open()
        session = W.has_endpoint(self.url, "/begin_weight_update", self.timeout_s)
        n = 0
        try:
            for bucket in W.buckets(named_tensors, buffer_bytes, W.DTYPES[dtype]):
                tensors = [t.to(self.device).contiguous() for _, t in bucket]
                body = {"names": [name for name, _ in bucket], "dtypes": [str(t.dtype).removeprefix("torch.") for t in tensors],
                        "shapes": [list(t.shape) for t in tensors], "group_name": self.pg_name, "flush_cache": False,
                        "weight_version": str(version)}
                th, out = _post_in_thread(self.url, "/update_weights_from_distributed", body, self.timeout_s)
                try:
                    self._broadcast(tensors, th, out)
                except Exception as e:
                    self.pg = None  # a failed collective leaves the group unusable: open a new one next time
                    detail = out["response"].text[:300] if "response" in out else out.get("error")
                    raise W.WeightSyncError(f"broadcast to {self.url} ({self.backend}) failed: {e!r}; engine: {detail}") from e
                _result(th, out, f"update_weights_from_distributed on {self.url}", self.timeout_s)
                n += 1
        finally:
            if session:
                W.ok(W.post(self.url, "/end_weight_update", {}, self.timeout_s), "end_weight_update")
        return n

    def _broadcast(self, tensors: list[torch.Tensor], request: threading.Thread, out: dict) -> None:
        """In the order of the request's `names`; fails at once if the request ends before the tensors are
        received (the engine refused them) instead of waiting out the group's timeout."""
        # group_src: this process may be a train rank of another group too (its global rank is not this group's)
        works = [torch.distributed.broadcast(t, group=self.pg, async_op=True, group_src=0) for t in tensors]
        deadline = time.monotonic() + self.timeout_s
        while not all(w.is_completed() for w in works):
            if not request.is_alive():
                if "response" in out and out["response"].status_code == 200:
                    break  # received; our side's completion flags are a moment behind
                raise W.WeightSyncError("the engine's request ended before it received every tensor")
            if time.monotonic() > deadline:
                raise W.WeightSyncError(f"not received within {self.timeout_s:.0f} s")
            time.sleep(0.002)
        for w in works:
            w.wait()  # raises what the collective raised


def group_backend(device_type: str) -> str:
    return "gloo" if device_type == "cpu" else "nccl"


def new_group(url: Endpoint, engine_index: int, launch: int, tp_size: int, device_type: str, timeout_s: float,
              old: Optional[UpdateGroup] = None, master_address: str = "127.0.0.1") -> UpdateGroup:
    """The engine's group for this launch (a relaunched engine has none of the old one's state)."""
    name = f"slime_hydra_engine{engine_index}_launch{launch}"
    if old is not None and old.name == name:
        return old
    return UpdateGroup(url, tp_size, group_backend(device_type), timeout_s, name, master_address)


class UpdateGroups:
    """The update groups this process is rank 0 of, one per engine index, each opened at its first send and kept
    until the engine is relaunched (a new `launch`: new_group). The device type of the tensors sent (this process's:
    a train rank's own device under Ray) picks gloo or NCCL."""

    def __init__(self, device_type: str):
        self.device_type = device_type
        self.groups: dict[int, UpdateGroup] = {}
        self._lock = threading.Lock()

    def send(self, engine: int, url: Endpoint, launch: int, named_tensors: list[tuple[str, torch.Tensor]], version: int,
             tp_size: int, buffer_bytes: int, dtype: str, timeout: float, master_address: str = "127.0.0.1") -> int:
        """All buckets to engine `engine` at `url` (paused by the caller) -> the number of requests. master_address: where
        the engine reaches this process (UpdateGroup)."""
        with self._lock:
            self.groups[engine] = g = new_group(url, engine, launch, tp_size, self.device_type, timeout, self.groups.get(engine),
                                                master_address)
        return g.send(named_tensors, version, buffer_bytes, dtype)
