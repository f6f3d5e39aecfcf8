"""`rollout.backend=local`: batched generation with a KV cache on the rollout's own model copy.

The rollout holds its own weights, as an inference engine does, and sees the trainer's weights
only through `update_weights`; each sample records the weight version that generated it.
Left out on purpose: continuous batching and prefix caching (that is what SGLang is for).
"""

from __future__ import annotations

import copy
from typing import Iterable

import torch

from slime_hydra.rollout.sampling import sample_tokens
from slime_hydra.types import Sample, SamplingParams, Status


class LocalRollout:
    def __init__(self, model: torch.nn.Module, tokenizer, seed: int, generation_batch_size: int = 256):
        self.model = copy.deepcopy(model).eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.pad_id = tokenizer.pad_token_id
        self.generation_batch_size = generation_batch_size
        self.device = next(self.model.parameters()).device
        self.generator = torch.Generator(device="cpu").manual_seed(seed)
        self.weight_version = 0

    async def generate(self, samples: list[Sample], sampling: SamplingParams) -> list[Sample]:
        for start in range(0, len(samples), self.generation_batch_size):
            self._generate_chunk(samples[start : start + self.generation_batch_size], sampling)
        return samples

    @torch.no_grad()
    def _generate_chunk(self, samples: list[Sample], sp: SamplingParams) -> None:
        from transformers import DynamicCache

        B = len(samples)
        L = max(len(s.prompt_tokens) for s in samples)
        ids = torch.full((B, L), self.pad_id, dtype=torch.long)
        attn = torch.zeros((B, L), dtype=torch.long)
        for i, s in enumerate(samples):  # left padding
            ids[i, L - len(s.prompt_tokens) :] = torch.tensor(s.prompt_tokens)
            attn[i, L - len(s.prompt_tokens) :] = 1
        ids, attn = ids.to(self.device), attn.to(self.device)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)  # [B, L]
        cache = DynamicCache(config=self.model.config)
        logits = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, past_key_values=cache, use_cache=True).logits[:, -1]
        stop_ids = torch.tensor(sorted(set(sp.stop_token_ids)), dtype=torch.long, device=self.device)
        finished = torch.zeros(B, dtype=torch.bool, device=self.device)
        out_tokens, out_logps = [], []
        for _ in range(sp.max_new_tokens):
            tok, logp = sample_tokens(logits, sp.temperature, sp.top_k, sp.top_p, self._gen_for(logits))
            tok = torch.where(finished, torch.full_like(tok, self.pad_id), tok)
            out_tokens.append(tok)
            out_logps.append(logp)
            finished = finished | torch.isin(tok, stop_ids)
            if sp.stop:
                finished = finished | self._hit_stop_string(out_tokens, finished, sp.stop)
            if bool(finished.all()):
                break
            attn = torch.cat([attn, torch.ones((B, 1), dtype=attn.dtype, device=self.device)], dim=1)
            pos = pos[:, -1:] + 1
            logits = self.model(input_ids=tok[:, None], attention_mask=attn, position_ids=pos, past_key_values=cache, use_cache=True).logits[:, -1]
        toks = torch.stack(out_tokens, 1).cpu()  # [B, R]
        logps = torch.stack(out_logps, 1).float().cpu()  # [B, R]
        for i, s in enumerate(samples):
            self._finish(s, toks[i].tolist(), logps[i].tolist(), set(sp.stop_token_ids), sp.stop)

    def _gen_for(self, logits: torch.Tensor):
        return self.generator if logits.device.type == "cpu" else None

    def _hit_stop_string(self, out_tokens: list[torch.Tensor], finished: torch.Tensor, stops: tuple[str, ...]) -> torch.Tensor:
        recent = torch.stack(out_tokens, 1)[:, -8:].tolist()
        hit = [not f and any(self.tokenizer.decode(r).endswith(st) for st in stops) for r, f in zip(recent, finished.tolist())]
        return torch.tensor(hit, device=finished.device)

    def _finish(self, s: Sample, toks: list[int], logps: list[float], stop_ids: set[int], stops: tuple[str, ...]) -> None:
        n, status = len(toks), Status.TRUNCATED
        for j, t in enumerate(toks):
            text_so_far = self.tokenizer.decode(toks[: j + 1]) if stops else ""
            if t in stop_ids or (stops and any(text_so_far.endswith(st) for st in stops)):
                n, status = j + 1, Status.COMPLETED
                break
        s.tokens = list(s.prompt_tokens) + toks[:n]
        s.response_length = n
        s.response = self.tokenizer.decode(toks[:n], skip_special_tokens=True)
        s.rollout_log_probs = logps[:n]
        s.loss_mask = [1] * n
        s.status = status
        s.weight_version = self.weight_version

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        params = dict(self.model.named_parameters())
        for name, tensor in named_tensors:
            params[name].copy_(tensor)
        self.weight_version = version

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state(), "weight_version": self.weight_version}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
        self.weight_version = state["weight_version"]

    def shutdown(self) -> None:
        pass
