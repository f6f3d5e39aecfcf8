"""`rollout.backend=local`: batched generation with a KV cache on the rollout's own model copy.

The rollout holds its own weights, as an inference engine does, and sees the trainer's weights
only through `update_weights`; each sample records the weight version that generated it.
Left out on purpose: continuous batching and a radix prefix cache (that is what SGLang is for); a
rollout's identical contexts (a prompt's group) are prefilled once. The forward passes themselves are
rollout/decoders.py's (model.model_impl).
"""

from __future__ import annotations

import asyncio
import copy
from typing import Iterable

import torch

from slime_hydra.models.hf_names import hub_names
from slime_hydra.rollout.decoders import Decoder, PackedDecoder, TransformersDecoder
from slime_hydra.rollout.sampling import sample_tokens
from slime_hydra.types import Sample, SamplingParams, Status


class LocalRollout:
    cooperative = True  # generate() yields to the event loop after every decode step

    def __init__(self, model: torch.nn.Module, tokenizer, seed: int, generation_batch_size: int = 256,
                 model_impl: str = "transformers"):
        self.model = copy.deepcopy(model).eval().requires_grad_(False)
        self.model_impl = model_impl  # transformers | native (rollout/decoders.py)
        self.tokenizer = tokenizer
        self.pad_id = tokenizer.pad_token_id
        self.generation_batch_size = generation_batch_size
        self.device = next(self.model.parameters()).device
        self.generator = torch.Generator(device="cpu").manual_seed(seed)
        self.weight_version = 0
        self._aborted = False

    async def generate(self, samples: list[Sample], sampling: SamplingParams) -> list[Sample]:
        """A sample with a partial response (status ABORTED) continues from its tokens. Yields to the event
        loop after every decode step, so a caller can watch samples finish and call `abort()`."""
        self._aborted = False
        for start in range(0, len(samples), self.generation_batch_size):
            if self._aborted:
                break  # the rest were never started: they stay as they are
            await self._decode(samples[start : start + self.generation_batch_size], sampling)
        return samples

    def abort(self) -> None:
        """Stop the current generate() after its next decode step; unfinished samples keep their partial
        response with status ABORTED."""
        self._aborted = True

    async def _decode(self, samples: list[Sample], sp: SamplingParams) -> None:
        # a partial sample's context is prompt + response so far; a group's samples share one context,
        # so each distinct context is prefilled once and its KV cache repeated to its rows
        distinct: dict[tuple[int, ...], int] = {}
        inv = [distinct.setdefault(tuple(s.tokens or s.prompt_tokens), len(distinct)) for s in samples]
        budget = torch.tensor([sp.max_new_tokens - s.response_length for s in samples], device=self.device)  # [B]
        decoder = self._decoder()
        logits = decoder.prefill(list(distinct), inv, max(int(budget.max().item()), 1))  # [B, V]
        stop_ids = torch.tensor(sorted(set(sp.stop_token_ids)), dtype=torch.long, device=self.device)
        finished = budget <= 0
        out_tokens, out_logps = [], []
        for step in range(int(budget.max().item())):
            tok, logp = sample_tokens(logits, sp.temperature, sp.top_k, sp.top_p, self._gen_for(logits))
            tok = torch.where(finished, torch.full_like(tok, self.pad_id), tok)
            out_tokens.append(tok)
            out_logps.append(logp)
            newly = ~finished & (torch.isin(tok, stop_ids) | (budget <= step + 1))
            if sp.stop:
                newly = newly | self._hit_stop_string(out_tokens, finished, sp.stop)
            finished = finished | newly
            rows = newly.nonzero().flatten()
            if len(rows):  # finish each sample as soon as it is done, so a watcher sees it
                toks, logps = torch.stack(out_tokens, 1)[rows].tolist(), torch.stack(out_logps, 1)[rows].float().tolist()
                self._finish([samples[i] for i in rows.tolist()], toks, logps, sp, False)
            if bool(finished.all()):
                break
            await asyncio.sleep(0)
            if self._aborted:
                break
            logits = decoder.step(tok, ~finished)
        if out_tokens and not bool(finished.all()):  # aborted: keep what each unfinished sample has
            toks, logps = torch.stack(out_tokens, 1).cpu(), torch.stack(out_logps, 1).float().cpu()  # [B, R]
            rows = (~finished).nonzero().flatten()
            self._finish([samples[i] for i in rows.tolist()], toks[rows].tolist(), logps[rows].tolist(), sp, True)

    def _decoder(self) -> Decoder:
        return PackedDecoder(self.model) if self.model_impl == "native" else TransformersDecoder(self.model, self.pad_id)

    def _gen_for(self, logits: torch.Tensor):
        return self.generator if logits.device.type == "cpu" else None

    def _hit_stop_string(self, out_tokens: list[torch.Tensor], finished: torch.Tensor, stops: tuple[str, ...]) -> torch.Tensor:
        recent = torch.stack(out_tokens, 1)[:, -8:].tolist()
        hit = [not f and any(self.tokenizer.decode(r).endswith(st) for st in stops) for r, f in zip(recent, finished.tolist())]
        return torch.tensor(hit, device=finished.device)

    def _finish(self, samples: list[Sample], toks: list[list[int]], logps: list[list[float]], sp: SamplingParams,
                aborted: bool) -> None:
        """Append each row's new tokens to its sample's response; the texts are decoded in one batch."""
        for s, t, lp in zip(samples, toks, logps):
            self._append(s, t, lp, sp, aborted)
        texts = self.tokenizer.batch_decode([s.response_tokens for s in samples], skip_special_tokens=True)
        for s, text in zip(samples, texts):
            s.response = text

    def _append(self, s: Sample, toks: list[int], logps: list[float], sp: SamplingParams, aborted: bool) -> None:
        """Append the new tokens to the sample's response (empty unless it continues a partial one)."""
        stop_ids, stops = set(sp.stop_token_ids), sp.stop
        prev = s.response_tokens if s.response_length else []
        n, status = len(toks), (Status.ABORTED if aborted else Status.TRUNCATED)
        for j, t in enumerate(toks):
            text_so_far = self.tokenizer.decode(prev + toks[: j + 1]) if stops else ""
            if t in stop_ids or (stops and any(text_so_far.endswith(st) for st in stops)):
                n, status = j + 1, Status.COMPLETED
                break
        response = prev + toks[:n]
        s.tokens = list(s.prompt_tokens) + response
        s.response_length = len(response)
        s.rollout_log_probs = list(s.rollout_log_probs or [])[: len(prev)] + logps[:n]
        s.loss_mask = list(s.loss_mask or [1] * len(prev))[: len(prev)] + [1] * n
        s.status = status
        s.weight_version = self.weight_version

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        params = hub_names(dict(self.model.named_parameters()))  # per-expert names write into fused MoE experts (views)
        for name, tensor in named_tensors:
            params[name].copy_(tensor)
        self.weight_version = version

    def metrics(self) -> dict[str, float]:
        return {}  # a sync is a copy_ per parameter: the loop's perf/weight_sync_time_s says all there is

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state(), "weight_version": self.weight_version}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
        self.weight_version = state["weight_version"]

    def shutdown(self) -> None:
        pass
