"""`rollout.backend=sglang`: the RolloutBackend over SGLang engines behind the sglang-router.

Generation posts each sample's token ids to the router (concurrency `sglang_server_concurrency` per
engine) and reads back token ids, logprobs and the weight version that produced them. Weight sync
goes to every engine directly, bucketed, inside pause_generation / continue_generation, and the
version is stamped on the engine with the weights. Where the tensors are sent from is the weights'
own business (Weights.sender on this rollout's route: the train ranks under Ray, else this process); over update groups
the engines are synced at once (each engine's group has its own sender). With `use_fault_tolerance`, a dead engine is
restarted by the health monitor and resynced (the last synced weights: the trainer's tensors, which
do not change between a sync and the next train step, or the last checkpoint written for disk sync)
before it serves; its in-flight requests fail, and are sent again through the router.
Colocated memory (`offload`: cluster.offload_rollout, GPUs only): the engines run with SGLang's memory saver and
release their KV cache and CUDA graphs right after they start and after every generation, and resume them before the
next; their weights stay, so a weight sync needs nothing resumed and a generation after a release nothing re-sent.
`starting`: what the engines start inside (cluster.offload_train: the trainer released, so that each engine sizes
its KV cache on a GPU the trainer does not hold: docs/memory.md).
Engines the run did not start (rollout.rollout_external_engine_addrs: `key` given, engines.ExternalLauncher): checked
with the key and against the run's options before the router starts (`check_attached`), then reset to the model's
weights as version 0 and checked equal (`attach`); the run never stops them.
A router the run did not start (rollout.sglang_router_ip/port: `external_router`): the engines are registered with it
once they answer (and are checked, when attached), and removed from it at shutdown (external_router.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Callable, ContextManager, Optional

import httpx
import torch

from slime_hydra.config.schema import RolloutConfig
from slime_hydra.protocols import Weights
from slime_hydra.rollout.sglang import distributed as D
from slime_hydra.rollout.sglang import sources as S
from slime_hydra.rollout.sglang import weights as W
from slime_hydra.rollout.sglang.checks import weight_sync_mode
from slime_hydra.rollout.sglang.client import Generated, RouterClient
from slime_hydra.rollout.sglang.endpoint import tls
from slime_hydra.rollout.sglang.engines import (
    Engine,
    EngineGroup,
    EngineStartError,
    Launcher,
    engine_info,
    same_option,
    server_memory,
    wait_routed,
)
from slime_hydra.rollout.sglang.external_router import ExternalRouter
from slime_hydra.types import Sample, SamplingParams, Status

log = logging.getLogger(__name__)
RELEASED = ("kv_cache", "cuda_graph")  # what cluster.offload_rollout releases (SGLang's memory tags); the weights stay


class SGLangRollout:
    cooperative = False  # generate() awaits HTTP requests: collect polls for finished groups

    def __init__(self, cfg: RolloutConfig, model: torch.nn.Module, tokenizer, *, num_engines: int, tp_size: int,
                 seed: int, dtype: str, output_dir: str, colocate: bool, offload: bool, device: str,
                 launcher: Optional[Launcher] = None, starting: Callable[[], ContextManager] = contextlib.nullcontext,
                 keep_on_host: bool = False, post_write: Optional[Callable[[str, int], None]] = None,
                 key: Optional[str] = None, external_router: Optional[ExternalRouter] = None):
        """model: what the engines start from (anything with HF `save_pretrained`: under Ray, train rank 0 saves it).
        launcher: where the server processes run (engines.LocalLauncher, children of this process, unless given).
        starting: a context the engines start inside (the module docstring). keep_on_host (cluster.offload_train): the
        weights kept for a restarted engine's resync are host copies, not the trainer's tensors, which are released
        while the engines generate. post_write (rollout.custom_update_weight_post_write): fn(version_dir, version) after a disk
        sync's files are written, before any engine reads them. key: the engines' API key when the run attaches to
        engines it did not start (rollout.rollout_external_engine_addrs, engines.ExternalLauncher): see `attach`.
        external_router: a router already running (rollout.sglang_router_ip/port), which the engines are registered with."""
        self.cfg, self.tokenizer, self.tp_size, self.dtype = cfg, tokenizer, tp_size, dtype
        self.post_write = post_write
        self.mode = weight_sync_mode(cfg.weight_sync, colocate)
        self.route = S.route_of(cfg.weight_sync, colocate)  # None: disk sync
        self.device, self.offload, self.keep_on_host = device, offload, keep_on_host
        self.dir = Path(output_dir) / "sglang"
        self.init_dir = self.dir / "model_init"
        model.save_pretrained(self.init_dir, safe_serialization=True)  # what the engines load at start
        tokenizer.save_pretrained(self.init_dir)
        options = {"dtype": dtype, **cfg.sglang}
        if offload and device != "cpu":  # SGLang releases nothing without its memory saver (slime sets it likewise)
            options.setdefault("enable_memory_saver", True)
        self.group = EngineGroup(str(self.init_dir), num_engines, tp_size, seed, options, cfg.sglang_router_policy,
                                 dict(cfg.sglang_router), self.dir / "logs", cfg.sglang_server_start_timeout_s,
                                 dict(cfg.sglang_env), launcher, key, external_router)
        self.weight_version = 0
        self.synced_version: Optional[int] = None  # None until the first sync: engines report "default"
        self._update_groups = D.UpdateGroups(device)  # weight_sync=distributed from this process: one group per engine
        self._groups = self._update_groups.groups
        self._last_weights: S.Sender = S.LocalTensors([], self._update_groups)
        self._last_disk: Optional[Path] = None
        self._sync_lock = threading.Lock()
        self._aborted = False
        self._released: tuple[str, ...] = ()  # the memory tags released now
        self._weights_lost = False  # released since the last sync: /resume_memory_occupation brings back memory, not weights
        self.sync_stats: dict[str, float] = {}  # the last sync's, until metrics() reports them
        self._stats_lock = threading.Lock()
        t0 = time.perf_counter()
        with starting():
            self.group.start(partial(self.check_attached, options) if key is not None else None)
            self.client = RouterClient(self.group.router_endpoint, cfg.sglang_server_concurrency * num_engines,
                                       cfg.sglang_request_timeout_s, cfg.sglang_max_retries, cfg.sglang_retry_backoff_s)
            self._wait_router()
            if self.offload:
                self.release_memory()  # the engines hold their KV cache only while they generate
        if key is not None:  # after `starting`: the trainer's tensors (the model's, for the torch trainer) are back
            try:
                self.attach(model)
            except BaseException:
                self.shutdown()
                raise
        self.start_time_s = time.perf_counter() - t0
        self.engine_memory = server_memory(self.group.engines[0].endpoint, 30.0)  # engine 0's; the others alike
        if cfg.use_fault_tolerance:
            self.group.start_monitor(cfg.rollout_health_check_interval, cfg.rollout_health_check_first_wait,
                                     cfg.rollout_health_check_max_failures, self._resync)

    def _wait_router(self) -> None:
        body = {"input_ids": [self.tokenizer.eos_token_id], "sampling_params": {"max_new_tokens": 1}}
        try:
            wait_routed(self.group.router_endpoint, body, self.cfg.sglang_server_start_timeout_s, self.group.router_log)
        except BaseException:
            self.shutdown()
            raise

    def check_attached(self, options: dict, engines: list[Engine]) -> None:
        """Engines this run did not start (before its router starts): each must answer with the key and run with the
        run's options (rollout.sglang, model.dtype, the tp size), else an EngineStartError names every key that differs."""
        timeout = self.cfg.sglang_request_timeout_s
        wanted = {**{k: v for k, v in options.items() if v is not None}, "tp_size": self.tp_size}
        problems = []
        for e in engines:
            info = engine_info(e.endpoint, timeout)
            for k, v in wanted.items():
                if k in info and not same_option(info[k], v):
                    name = {"dtype": "model.dtype", "tp_size": "cluster.rollout_num_gpus_per_engine"}.get(k, f"rollout.sglang.{k}")
                    problems.append(f"{name}={v!r}, but the engine at {e.url} runs with {k}={info[k]!r}")
        if problems:
            raise EngineStartError("rollout.rollout_external_engine_addrs: engines this run did not start keep the options "
                                   "they were started with:\n  " + "\n  ".join(problems) +
                                   "\nset each key to the engine's value (or drop it from rollout.sglang), or restart the "
                                   "engines with the run's")

    def attach(self, model: torch.nn.Module) -> None:
        """Engines this run did not start hold weights of their own (another run's, its last sync's): they are replaced
        by the model's as version 0 (from the model's files with weight_sync=disk, as an engine this run starts loads
        them; from its tensors otherwise) and checked equal on every engine before anything generates."""
        timeout = self.cfg.sglang_request_timeout_s
        named = [(n, p.detach()) for n, p in model.named_parameters()]
        source = S.LocalTensors(named, self._update_groups)
        with self._sync_lock:
            for e in self.group.engines:
                if self.route is None:
                    W.update_from_disk(e.endpoint, self.init_dir, 0, timeout)
                else:
                    self._sync_engine(e, source, 0)
            self._last_weights, self.weight_version, self.synced_version = source, 0, 0
        for e in self.group.engines:
            W.check_equal(e.endpoint, named, self.dtype, timeout)
        if self.keep_on_host:  # the trainer's tensors are released while the engines generate: a resync sends copies
            self._last_weights = source.to_host()

    # -- generate -------------------------------------------------------------------------------------

    async def generate(self, samples: list[Sample], sampling: SamplingParams) -> list[Sample]:
        """A sample with a partial response (status ABORTED) continues from its tokens."""
        self._aborted = False
        if self._released:
            self.resume_memory()
        if self._weights_lost:
            self._restore_weights()
        n = self.client.concurrency
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=n, max_keepalive_connections=n), verify=tls()) as client:
            sem = asyncio.Semaphore(n)
            await asyncio.gather(*(self._batch(client, sem, chunk, sampling) for chunk in self._chunks(samples, sampling)))
        if self.offload:
            self.release_memory()
        return samples

    def _chunks(self, samples: list[Sample], sp: SamplingParams) -> list[list[Sample]]:
        """Requests of up to sglang_request_batch_size samples with the same token budget."""
        by_budget: dict[int, list[Sample]] = {}
        for s in samples:
            if sp.max_new_tokens - s.response_length > 0:
                by_budget.setdefault(sp.max_new_tokens - s.response_length, []).append(s)
        size = self.cfg.sglang_request_batch_size
        return [group[i:i + size] for group in by_budget.values() for i in range(0, len(group), size)]

    async def _batch(self, client: httpx.AsyncClient, sem: asyncio.Semaphore, chunk: list[Sample], sp: SamplingParams) -> None:
        budget = sp.max_new_tokens - chunk[0].response_length
        ctxs = [list(s.tokens) if s.response_length else list(s.prompt_tokens) for s in chunk]
        got = await self.client.generate(client, sem, ctxs, sp, budget, self.synced_version, lambda: self._aborted)
        for s, g in zip(chunk, got, strict=True):
            self._finish(s, g)

    def _finish(self, s: Sample, got: Generated) -> None:
        """Append the new tokens to the sample's response (empty unless it continues a partial one)."""
        prev = s.response_tokens if s.response_length else []
        response = prev + got.output_ids
        s.tokens = list(s.prompt_tokens) + response
        s.response_length = len(response)
        s.response = self.tokenizer.decode(response, skip_special_tokens=True)
        s.rollout_log_probs = list(s.rollout_log_probs or [])[: len(prev)] + got.logprobs
        s.loss_mask = list(s.loss_mask or [1] * len(prev))[: len(prev)] + [1] * len(got.output_ids)
        s.status = {"stop": Status.COMPLETED, "length": Status.TRUNCATED, "abort": Status.ABORTED}.get(got.finish, Status.COMPLETED)
        s.weight_version = got.weight_version if got.weight_version is not None else self.weight_version

    def abort(self) -> None:
        """Abort every in-flight request on every engine; they return with what they generated so far."""
        self._aborted = True
        for e in self.group.engines:
            try:
                httpx.post(e.url + "/abort_request", json={"abort_all": True}, headers=e.endpoint.headers, timeout=10, verify=tls())
            except httpx.HTTPError as exc:
                log.warning("abort on sglang engine %d failed: %s", e.index, exc)

    # -- weights --------------------------------------------------------------------------------------

    def update_weights(self, weights: Weights, version: int) -> None:
        """weights: the trainer's. Those that send themselves by this rollout's route (the Ray ranks, sources.Sender) are
        staged and send from where they live; any others are iterated (fetched here) and sent from this process."""
        t0 = time.perf_counter()
        own = weights.sender(self.route) if self.route is not None else None
        local = S.LocalTensors(weights, self._update_groups) if own is None else None  # iterated: fetched here
        source = own if own is not None else local
        assert source is not None
        with self._sync_lock:
            if "weights" in self._released:  # the KV cache may stay released: a sync writes weights only
                self.resume_memory()
            source.stage()  # here, in the caller's thread: a restart's resync later re-sends what is staged
            if self.route is None and local is not None:  # disk sync: a checkpoint the engines reload
                self._last_disk = W.write_checkpoint(local.tensors, self.init_dir, self.dir / "weights", self.dtype)
                if self.post_write is not None:  # publish the files (a shared file system) before the engines read them
                    self.post_write(str(self._last_disk), version)
            t1 = time.perf_counter()
            requests = sum(self._on_engines([e for e in self.group.engines if e.healthy.is_set()],
                                            lambda e: self._sync_engine(e, source, version)))
            self._last_weights, self.weight_version, self.synced_version = source, version, version
            self._weights_lost = False
        t2 = time.perf_counter()
        if self.cfg.check_weight_update_equal:
            for e in self.group.engines:
                if e.healthy.is_set():
                    source.check_equal(e.index, e.endpoint, self.dtype, self.cfg.sglang_request_timeout_s)
        if self.keep_on_host:
            with self._sync_lock:
                self._last_weights = source.to_host()
        with self._stats_lock:  # metrics() may read from the loop's thread while a worker syncs (train_mode=async)
            self.sync_stats = {"rollout/weight_sync_requests": float(requests), "perf/weight_sync_write_s": t1 - t0,
                               "perf/weight_sync_send_s": t2 - t1, "perf/weight_sync_check_s": time.perf_counter() - t2}

    def _on_engines(self, engines: list[Engine], sync) -> list[int]:
        """sync(e) for each engine: at once over update groups (engines fed by different senders receive in parallel),
        one after another otherwise (handles and disk reloads share this host's memory and disk)."""
        if self.mode != "distributed" or len(engines) < 2:
            return [sync(e) for e in engines]
        with ThreadPoolExecutor(len(engines), thread_name_prefix="sglang-weight-sync") as pool:
            return list(pool.map(sync, engines))

    def _sync_engine(self, e: Engine, source: S.Sender, version: int) -> int:
        """-> the number of weight-update requests the engine got (buckets; 1 from disk)."""
        timeout = self.cfg.sglang_request_timeout_s
        paused = W.post(e.endpoint, "/pause_generation", {}, timeout).status_code == 200
        try:
            if self.mode == "tensor":
                n = source.send(e.index, e.endpoint, version, self.tp_size, self.cfg.update_weight_buffer_size, self.dtype, timeout)
            elif self.mode == "distributed":
                n = source.broadcast(e.index, e.endpoint, e.launches, version, self.tp_size, self.cfg.update_weight_buffer_size,
                                     self.dtype, timeout)
            else:
                n = W.update_from_disk(e.endpoint, self._last_disk, version, timeout)
            if self.mode != "disk":  # update_weights_from_disk flushes itself
                r = W.post(e.endpoint, "/flush_cache", {}, timeout)
                if r.status_code != 200:  # the next prefill recomputes; only the radix cache is stale
                    log.warning("sglang engine %d: flush_cache after a weight update answered %d", e.index, r.status_code)
        finally:
            if paused:
                W.post(e.endpoint, "/continue_generation", {}, timeout)
        return n

    def _restore_weights(self) -> None:
        """Generation after a release with no sync in between (an eval, then the next rollout; or two evals) would
        run on whatever the resumed memory holds: re-send the last synced weights first. They are still the
        trainer's (no train step ran since that sync, or a sync would have followed it)."""
        with self._sync_lock:
            for e in self.group.engines:
                if not e.healthy.is_set():
                    continue
                if self.synced_version is not None:
                    self._sync_engine(e, self._last_weights, self.synced_version)
                else:  # nothing synced yet: the weights the engine started from
                    W.update_from_disk(e.endpoint, self.init_dir, 0, self.cfg.sglang_request_timeout_s)
            self._weights_lost = False

    def _resync(self, e: Engine) -> None:
        """A restarted engine gets the last synced weights and version before it serves."""
        with self._sync_lock:
            if self.synced_version is not None:
                self._sync_engine(e, self._last_weights, self.synced_version)

    # -- colocated memory -----------------------------------------------------------------------------

    def release_memory(self, tags: tuple[str, ...] = RELEASED) -> None:
        """SGLang's memory tags `tags` released on every engine (with "weights": a generation first re-sends them)."""
        if self.device == "cpu":
            if not getattr(self, "_said_cpu", False):
                log.warning("sglang release_memory_occupation skipped: not supported on CPU (the server crashes)")
                self._said_cpu = True
            return
        for e in self.group.engines:
            W.ok(W.post(e.endpoint, "/release_memory_occupation", {"tags": list(tags)}, self.cfg.sglang_request_timeout_s),
                 "release_memory_occupation")
        self._released = tuple(tags)
        self._weights_lost |= "weights" in tags

    def resume_memory(self) -> None:
        for e in self.group.engines:
            W.ok(W.post(e.endpoint, "/resume_memory_occupation", {"tags": list(self._released)}, self.cfg.sglang_request_timeout_s),
                 "resume_memory_occupation")
        self._released = ()

    # -- state ----------------------------------------------------------------------------------------

    def metrics(self) -> dict[str, float]:
        """The last weight sync's request count (all engines) and seconds (checkpoint write for disk sync, the
        updates, the equality check), once, at the first call after it; the requests re-sent and the engines
        restarted so far."""
        with self._stats_lock:
            sync, self.sync_stats = self.sync_stats, {}
        return {**sync, **self.engine_memory, "rollout/sglang_retries": float(self.client.retried),
                "rollout/sglang_restarts": float(sum(e.restarts for e in self.group.engines))}

    def state_dict(self) -> dict:
        return {"weight_version": self.weight_version}

    def load_state_dict(self, state: dict) -> None:
        self.weight_version = state["weight_version"]

    def shutdown(self) -> None:
        self.group.shutdown()
