"""`rollout.custom_generate`: slime's custom generate function as a `_target_`, and the backend wrapper that runs it.

The contract (checked at validation time, before anything heavy starts):

    async def my_generate(sample: Sample, *, generate: GenerateFn, tokenizer, sampling: SamplingParams,
                          max_turns: int, **kwargs) -> Sample | list[Sample]

- `sample` has `prompt`, `prompt_tokens`, `label`, `metadata`; the hook fills `tokens` (prompt + response),
  `response`, `response_length`, `loss_mask` and `rollout_log_probs` (one per response token), `status` and
  `weight_version`, and returns it (or a replacement Sample).
- Or it returns `list[Sample]`, several trainable samples for one (slime's list return: multi-agent turns, sub-agents,
  a context split at a compaction), each with its own tokens, `loss_mask` and, if the hook scores them, `reward`
  (a sample left at `reward=None` is scored by reward.* like any other). They take the prompt sample's place in
  its group, in order, so a group of n prompt samples trains as n*k samples; the advantage step centres rewards
  over that whole group, so every sample of a rollout must return the same number k. In eval only the first of the
  list is scored (eval counts one answer per sample). Where slime's hook receives (args, sample, sampling_params)
  and marks siblings with a shared `rollout_id`, here siblings keep the prompt sample's `group_index`.
- `await generate(tokens, sampling) -> Completion` continues from token ids with the rollout backend
  (whichever it is: only the RolloutBackend Protocol is used) and returns the new ids, their log-probs and
  why it stopped. Concurrent calls of all samples are batched into one backend call.
- `sampling` is the rollout's (or eval's) SamplingParams; `max_new_tokens` is the budget of the whole response.
- `kwargs` are the node's other keys (`{"_target_": "pkg.mod.fn", "max_calls": 3}` passes `max_calls=3`); a key that
  is itself a `_target_` node arrives as a factory (`{"env": {"_target_": "pkg.Env"}}` passes `env=`, and `env()`
  builds a fresh environment).

A sample's `metadata.custom_generate` overrides the configured hook for that sample, as slime's per-sample
`generate_function_path` does, but by name only: it names a hook of `rollout.generate_hooks`, a registry filled
from the config (verl's agent registry), never a dotted path of its own. Data is not code: a row could otherwise
import and run anything. Rows are checked as they are read (data/rows.py: a row naming anything else is a bad
row, in memory and streamed alike), and a sample naming an unregistered hook is refused here too. The composition
floor's loader (app/plugins.load_hook, handed to `AgentRollout`) turns each registered hook into its function once.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import inspect
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Optional

from slime_hydra.config.plugins import check_target, import_target
from slime_hydra.errors import UserError
from slime_hydra.protocols import RolloutBackend, Weights
from slime_hydra.types import Sample, SamplingParams, Status

HOOK_KWARGS = ("generate", "tokenizer", "sampling", "max_turns")


@dataclass
class Completion:
    tokens: list[int]  # the new ids only
    log_probs: list[float]  # [len(tokens)]
    status: Status  # COMPLETED: ended on a stop token (the last id); TRUNCATED: hit max_new_tokens
    weight_version: int


GenerateFn = Callable[[list[int], SamplingParams], Awaitable[Completion]]


def as_node(spec: Any) -> dict:
    return {"_target_": spec} if isinstance(spec, str) else dict(spec or {})


def check_generate(key: str, spec: Any, problems: list[str]) -> None:
    """The hook imports, is async, and binds (sample, generate=, tokenizer=, sampling=, max_turns=, **kwargs);
    nested `_target_` nodes among its kwargs (an env) import and bind their own keys."""
    node = as_node(spec)
    if not node:
        return
    fn, target = import_target(key, node, problems, "an async generate function"), node.get("_target_")
    if fn is None:
        return
    if not inspect.iscoroutinefunction(fn):
        problems.append(f"{key}._target_={target} must be an `async def` function (it awaits the backend's generate)")
    kwargs = {k: v for k, v in node.items() if k != "_target_"}
    try:
        inspect.signature(fn).bind(None, **{k: None for k in HOOK_KWARGS}, **kwargs)
    except TypeError as e:
        problems.append(f"{key}._target_={target}: signature {inspect.signature(fn)} does not fit a call "
                        f"fn(sample, {', '.join(f'{k}=...' for k in HOOK_KWARGS)}{''.join(f', {k}=...' for k in kwargs)}) ({e})")
    for name, value in kwargs.items():
        if isinstance(value, dict) and "_target_" in value:
            check_target(f"{key}.{name}", value, 0, problems)


def check_hooks(custom_generate: dict, generate_hooks: dict) -> list[str]:
    """rollout.custom_generate and every hook of rollout.generate_hooks import, are async and bind their call."""
    problems: list[str] = []
    check_generate("rollout.custom_generate", custom_generate, problems)
    for name, spec in generate_hooks.items():
        if not spec:
            problems.append(f"rollout.generate_hooks.{name} is empty; give it a _target_ (an async generate function)")
        check_generate(f"rollout.generate_hooks.{name}", spec, problems)
    return problems


class BatchedGenerate:
    """The `generate` handed to hooks: continuations from token ids, batched across the hooks awaiting it.

    Requests that differ only in max_new_tokens share one backend call with the largest budget, each cut
    to its own afterwards (sampling the first n tokens of a longer continuation is sampling n tokens).
    One backend call runs at a time: requests that arrive meanwhile (hooks back from a slow tool) make the
    next batch. That also keeps a backend's thread-global state (torch's grad mode, set by a `no_grad`
    block around an await) from being interleaved by two of its calls.
    """

    def __init__(self, backend):
        self.backend = backend
        self.pending: list[tuple[list[int], SamplingParams, asyncio.Future]] = []
        self.collecting = False
        self.tasks: set[asyncio.Task] = set()
        self.lock = asyncio.Lock()
        self.backend_calls = 0

    async def __call__(self, tokens: list[int], sampling: SamplingParams) -> Completion:
        fut = asyncio.get_running_loop().create_future()
        self.pending.append((list(tokens), sampling, fut))
        if not self.collecting:
            self.collecting = True
            task = asyncio.ensure_future(self._flush())
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        return await fut

    async def _flush(self) -> None:
        async with self.lock:
            seen, stable = -1, 0
            while stable < 2:  # let every hook that is ready queue its request first
                stable = stable + 1 if len(self.pending) == seen else 0
                seen = len(self.pending)
                await asyncio.sleep(0)
            batch, self.pending, self.collecting = self.pending, [], False
            groups: dict[SamplingParams, list] = {}
            for req in batch:
                groups.setdefault(dataclasses.replace(req[1], max_new_tokens=0), []).append(req)
            for reqs in groups.values():
                await self._run(reqs)

    async def _run(self, reqs: list) -> None:
        budget = max(sp.max_new_tokens for _, sp, _ in reqs)
        samples = [Sample(prompt=None, prompt_tokens=toks) for toks, _, _ in reqs]
        try:
            self.backend_calls += 1
            await self.backend.generate(samples, dataclasses.replace(reqs[0][1], max_new_tokens=budget))
        except Exception as e:  # noqa: BLE001 - handed to every waiting hook
            for _, _, fut in reqs:
                fut.set_exception(e)
            return
        for s, (_, sp, fut) in zip(samples, reqs):
            toks, logps, status = s.response_tokens, list(s.rollout_log_probs or []), s.status
            if len(toks) > sp.max_new_tokens:
                toks, logps, status = toks[: sp.max_new_tokens], logps[: sp.max_new_tokens], Status.TRUNCATED
            fut.set_result(Completion(list(toks), logps, status, s.weight_version))


def take_result(s: Sample, out: Any) -> Sample:
    """The hook's result written into `s`, the object its group holds: a replacement Sample's fields, or a list's first
    sample's with the rest as `s.siblings` (the collector puts them into the group after `s`)."""
    items = out if isinstance(out, list) else [out]
    if not items or not all(isinstance(x, Sample) for x in items):
        got = f"list of {[type(x).__name__ for x in items][:4]}" if isinstance(out, list) else type(out).__name__
        raise TypeError(f"rollout.custom_generate returned {got}; it must return a Sample or a non-empty list[Sample]")
    items = [copy.copy(x) if x is s else x for x in items]  # `s` is overwritten below; a list may hold it anywhere
    for f in dataclasses.fields(Sample):
        setattr(s, f.name, getattr(items[0], f.name))
    s.siblings = items[1:]
    for x in s.siblings:
        x.group_index = s.group_index
    return s


class AgentRollout:
    """A RolloutBackend that runs each sample through its generate hook over the wrapped backend.

    `default_hook` is rollout.custom_generate (None: plain generation for a sample that names no hook), `hooks`
    rollout.generate_hooks (name -> spec: what a sample's metadata.custom_generate may name); `load_hook` turns a
    hook's spec into the hook (the composition floor's: app/plugins.load_hook)."""

    def __init__(self, backend: RolloutBackend, tokenizer, default_hook: Optional[dict], max_turns: int,
                 load_hook: Callable[[Any], Callable[..., Awaitable[Sample]]], hooks: Optional[dict[str, Any]] = None):
        self.backend = backend
        self.tokenizer = tokenizer
        self.load_hook = load_hook
        self.default_hook = load_hook(default_hook) if default_hook else None
        self.max_turns = max_turns
        self.hooks = {name: load_hook(spec) for name, spec in (hooks or {}).items()}  # rollout.generate_hooks

    @property
    def weight_version(self) -> int:
        return self.backend.weight_version

    def hook_for(self, s: Sample) -> Optional[Callable]:
        name = s.metadata.get("custom_generate")
        if name is None:
            return self.default_hook
        if not isinstance(name, str) or name not in self.hooks:  # rows are checked when read: a sample from elsewhere
            raise UserError(f"sample {s.index}: metadata.custom_generate={name!r:.80} is not a hook of "
                            f"rollout.generate_hooks ({sorted(self.hooks)}); a sample names a registered hook only")
        return self.hooks[name]

    async def generate(self, samples: list[Sample], sampling: SamplingParams) -> list[Sample]:
        plain = [s for s in samples if self.hook_for(s) is None]
        gen = BatchedGenerate(self.backend)

        async def one(s: Sample) -> Sample:
            out = await self.hook_for(s)(s, generate=gen, tokenizer=self.tokenizer, sampling=sampling,
                                         max_turns=self.max_turns)
            return take_result(s, out)

        hooked = [s for s in samples if self.hook_for(s) is not None]
        if plain:  # before the hooks, not beside them: one backend call at a time (see BatchedGenerate)
            await self.backend.generate(plain, sampling)
        results = await asyncio.gather(*(one(s) for s in hooked))
        replaced = {id(a): b for a, b in zip(hooked, results)}
        samples[:] = [replaced.get(id(s), s) for s in samples]
        return samples

    @property
    def cooperative(self) -> bool:  # the hooks' turns run on the wrapped backend's decode steps
        return self.backend.cooperative

    def abort(self) -> None:
        self.backend.abort()

    def update_weights(self, weights: Weights, version: int) -> None:
        self.backend.update_weights(weights, version)

    def metrics(self) -> dict[str, float]:
        return self.backend.metrics()

    def state_dict(self) -> dict:
        return self.backend.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.backend.load_state_dict(state)

    def shutdown(self) -> None:
        self.backend.shutdown()


def wrap_rollout(backend, tokenizer, custom_generate: dict, max_turns: int, load_hook: Callable[[Any], Callable],
                 generate_hooks: Optional[dict] = None):
    """The backend itself when no hook is configured (no sample may then name one: rows are checked); else an
    AgentRollout."""
    if not custom_generate and not generate_hooks:
        return backend
    return AgentRollout(backend, tokenizer, custom_generate or None, max_turns, load_hook, generate_hooks)
