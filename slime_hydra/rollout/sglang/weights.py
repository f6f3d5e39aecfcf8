"""Weight sync to SGLang engines: bucketed, from tensors (colocated) or from disk (the fallback).

Every path casts each tensor to the engine's dtype (`model.dtype`) first and then packs buckets of at most
`update_weight_buffer_size` bytes by size alone, so the number of requests is ceil(bytes / buffer) for
tensors small beside the buffer whatever order the dtypes come in (megatron's float32 norms between bf16
matrices once cost one request per dtype run: 114 instead of 3 for Qwen3-0.6B).
From tensors: each bucket is serialised with
sglang's MultiprocessingSerializer and posted to /update_weights_from_tensor; only handles travel over
HTTP. On CPU the handles must be shared-memory file names (torch's `file_system` strategy): the default
`file_descriptor` strategy passes fds through a socket whose auth key the server does not have, and
the server dies. On CUDA they are CUDA IPC handles (sglang's patched reductions). sglang >= 0.5.2x wants
the updates inside /begin_weight_update ... /end_weight_update; older releases have no such endpoints.
Where the tensors are serialised (here, or in colocated train ranks under Ray, which post the same payloads through
update_from_payloads) is the choice of the weights' sources.Sender.
From disk: a safetensors file beside the engine's config, then /update_weights_from_disk.
Over a distributed update group (disaggregated engines): `distributed`.
Every request carries the engine's key (an endpoint.Endpoint: its URL in messages, never the key).
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Iterable, Iterator, Optional

import httpx
import torch

from slime_hydra.errors import RunError
from slime_hydra.rollout.sglang.endpoint import Endpoint, tls

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}


class WeightSyncError(RunError):
    pass


def buckets(named_tensors: Iterable[tuple[str, torch.Tensor]], max_bytes: int,
            dtype: Optional[torch.dtype] = None) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive tensors, each cast to `dtype` (the engine's; None keeps each tensor's own), in groups of
    total size <= max_bytes in that dtype; a tensor larger than max_bytes goes alone. A change of dtype in
    the input does not start a new group: after the cast there is one dtype. Casts are made one group at a
    time (a tensor already in `dtype` is not copied)."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, t in named_tensors:
        t = t.detach() if dtype is None else t.detach().to(dtype)
        nbytes = t.numel() * t.element_size()
        if bucket and size + nbytes > max_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, t))
        size += nbytes
    if bucket:
        yield bucket


def post(engine: Endpoint, path: str, payload: dict | None = None, timeout: float = 600.0) -> httpx.Response:
    try:
        return httpx.post(engine.url + path, json=payload or {}, headers=engine.headers, timeout=timeout, verify=tls())
    except httpx.TimeoutException as e:
        raise WeightSyncError(f"POST {engine.url}{path}: no answer within {timeout:g} s ({type(e).__name__}); the engine is "
                              "stuck or overloaded: raise rollout.sglang_request_timeout_s if it is only slow, and "
                              "resume from the last checkpoint") from None


def ok(r: httpx.Response, what: str) -> dict:
    if r.status_code != 200:
        raise WeightSyncError(f"{what}: HTTP {r.status_code}: {r.text[:500]}")
    try:
        body = r.json()
    except ValueError:
        return {}
    if isinstance(body, dict) and body.get("success") is False:
        raise WeightSyncError(f"{what}: {body.get('message')}")
    return body if isinstance(body, dict) else {}


@contextlib.contextmanager
def sharing_strategy(device_type: str):
    if device_type != "cpu":
        yield
        return
    import torch.multiprocessing as mp

    old = mp.get_sharing_strategy()
    mp.set_sharing_strategy("file_system")
    try:
        yield
    finally:
        mp.set_sharing_strategy(old)


def serialize_bucket(bucket: list[tuple[str, torch.Tensor]], dtype: torch.dtype) -> tuple[str, str | None, list]:
    """-> (serialised payload, load_format, tensors to keep alive until the server has read them)."""
    from sglang.srt.utils import MultiprocessingSerializer

    tensors = [(n, t.detach().to(dtype).contiguous()) for n, t in bucket]
    device_type = tensors[0][1].device.type
    if device_type == "cuda":
        with contextlib.suppress(ImportError):
            from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions

            monkey_patch_torch_reductions()
    try:
        from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket
    except ImportError:
        FlattenedTensorBucket = None
    with sharing_strategy(device_type):
        if FlattenedTensorBucket is not None:
            fb = FlattenedTensorBucket(named_tensors=tensors)
            obj = {"flattened_tensor": fb.get_flattened_tensor(), "metadata": fb.get_metadata()}
            return MultiprocessingSerializer.serialize(obj, output_str=True), "flattened_bucket", [obj]
        if device_type == "cpu":
            for _, t in tensors:
                t.share_memory_()
        return MultiprocessingSerializer.serialize(tensors, output_str=True), None, tensors


def has_endpoint(engine: Endpoint, path: str, timeout: float) -> bool:
    r = post(engine, path, {}, timeout)
    if r.status_code == 404:
        return False
    ok(r, path)
    return True


def update_from_payloads(engine: Endpoint, payloads: Iterable[tuple[list[str], Optional[str]]], version: int, timeout: float) -> int:
    """Post each bucket's payloads (one per engine TP rank, from serialize_bucket) to /update_weights_from_tensor,
    inside /begin_weight_update ... /end_weight_update where the release has them; -> the number of requests. A
    bucket's tensors must stay alive until its request returned: `payloads` yields the next one only then."""
    session = has_endpoint(engine, "/begin_weight_update", timeout)
    n = 0
    try:
        for parts, load_format in payloads:
            body = {"serialized_named_tensors": parts, "flush_cache": False, "weight_version": str(version)}
            if load_format:
                body["load_format"] = load_format
            ok(post(engine, "/update_weights_from_tensor", body, timeout), "update_weights_from_tensor")
            n += 1
    finally:
        if session:
            ok(post(engine, "/end_weight_update", {}, timeout), "end_weight_update")
    return n


def local_payloads(named_tensors: list[tuple[str, torch.Tensor]], tp_size: int, buffer_bytes: int,
                   dtype: str) -> Iterator[tuple[list[str], Optional[str]]]:
    """This process's tensors, bucket by bucket, the same handles for every engine TP rank."""
    for bucket in buckets(named_tensors, buffer_bytes, DTYPES[dtype]):
        payload, load_format, keep = serialize_bucket(bucket, DTYPES[dtype])
        yield [payload] * tp_size, load_format
        del keep


def update_from_tensors(engine: Endpoint, named_tensors: list[tuple[str, torch.Tensor]], version: int, tp_size: int,
                        buffer_bytes: int, dtype: str, timeout: float) -> int:
    """All buckets to one engine; returns the number of /update_weights_from_tensor requests (= buckets)."""
    return update_from_payloads(engine, local_payloads(named_tensors, tp_size, buffer_bytes, dtype), version, timeout)


def write_checkpoint(named_tensors: list[tuple[str, torch.Tensor]], init_dir: Path, out_dir: Path, dtype: str) -> Path:
    """The engine's initial directory (config, tokenizer) with the new weights in model.safetensors."""
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    for f in init_dir.iterdir():
        if f.is_file() and not f.name.endswith((".safetensors", ".safetensors.index.json")):
            shutil.copy2(f, out_dir / f.name)
    for f in out_dir.glob("*.safetensors*"):
        f.unlink()
    save_file({n: t.detach().to(DTYPES[dtype]).contiguous().cpu() for n, t in named_tensors}, str(out_dir / "model.safetensors"))
    return out_dir


def update_from_disk(engine: Endpoint, path: Path, version: int, timeout: float) -> int:
    """The engine reloads `path` (written by write_checkpoint, already in its dtype); one request."""
    ok(post(engine, "/update_weights_from_disk", {"model_path": str(path), "weight_version": str(version), "flush_cache": True},
            timeout), "update_weights_from_disk")
    return 1


# SGLang's native models (on GPU) hold q/k/v and gate/up as one tensor each, concatenated along dim 0
FUSED = ((("q_proj", "k_proj", "v_proj"), "qkv_proj"), (("gate_proj", "up_proj"), "gate_up_proj"))


def engine_layout(named_tensors: list[tuple[str, torch.Tensor]], engine_names) -> list[tuple[str, torch.Tensor]]:
    """The trainer's HF-named tensors under the engine's names: fused where the engine has only the fused
    name (`...self_attn.qkv_proj.weight` = cat(q, k, v)); unchanged otherwise (the transformers model
    implementation on CPU keeps HF names)."""
    have = dict(named_tensors)
    fused, used = [], set()
    for parts, into in FUSED:
        for name in have:
            if f".{parts[0]}." not in name:
                continue
            names = [name.replace(f".{parts[0]}.", f".{p}.") for p in parts]
            target = name.replace(f".{parts[0]}.", f".{into}.")
            if target in engine_names and name not in engine_names and all(n in have for n in names):
                fused.append((target, torch.cat([have[n] for n in names], 0)))
                used.update(names)
    return [(n, t) for n, t in named_tensors if n not in used] + fused


def check_equal(engine: Endpoint, named_tensors: list[tuple[str, torch.Tensor]], dtype: str, timeout: float) -> int:
    """Compare the engine's weights with the trainer's, tensor by tensor; returns how many were compared.

    /weights_checker (sglang >= 0.5.2x) returns a hash per tensor, computed with sglang's own
    `tensor_hash` over the engine's bytes; the same function over the trainer's tensor (cast to the
    engine's dtype) must give the same hash. Older releases: /get_weights_by_name (first values)."""
    r = post(engine, "/weights_checker", {"action": "checksum"}, timeout)
    if r.status_code != 404:
        from sglang.srt.managers.mm_utils import tensor_hash

        ranks = ok(r, "weights_checker").get("ranks") or []
        engine = ranks[0]["checksums"]

        def same(name: str, t: torch.Tensor) -> bool:
            t = t.detach().to(DTYPES[dtype]).contiguous()
            if engine[name] == f"{tensor_hash(t):016x}":
                return True
            # vocabulary-parallel embeddings are padded with zero rows to a multiple of 64
            rows = -(-t.shape[0] // 64) * 64
            padded = torch.cat([t, t.new_zeros(rows - t.shape[0], *t.shape[1:])]) if t.dim() == 2 and rows > t.shape[0] else None
            return padded is not None and engine[name] == f"{tensor_hash(padded):016x}"

        named_tensors = engine_layout(named_tensors, engine)
        bad = [n for n, t in named_tensors if n in engine and not same(n, t)]
        missing = [n for n, _ in named_tensors if n not in engine]
        if bad or missing:
            raise WeightSyncError(f"check_weight_update_equal: {engine} differs from the trainer in {bad[:5]} "
                                  f"({len(bad)} tensors) and lacks {missing[:5]} ({len(missing)})")
        return len(named_tensors)
    for n, t in named_tensors:
        r = post(engine, "/get_weights_by_name", {"name": n, "truncate_size": 64}, timeout)
        if r.status_code != 200:
            raise WeightSyncError(f"check_weight_update_equal: get_weights_by_name({n}) on {engine}: HTTP {r.status_code} {r.text[:300]}")
        got = r.json()
        want = t.detach().to(DTYPES[dtype]).float().flatten()[: torch.tensor(got).numel()].cpu()
        if not torch.allclose(torch.tensor(got, dtype=torch.float32).flatten()[: want.numel()], want):
            raise WeightSyncError(f"check_weight_update_equal: {engine} differs from the trainer in {n}")
    return len(named_tensors)
