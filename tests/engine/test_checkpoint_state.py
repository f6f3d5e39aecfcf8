"""A checkpoint's resume state is plain data: every kind of value a run saves comes back bit-exact and of the same type,
and a state file that asks to run code is refused, naming it, with nothing of it run."""

from __future__ import annotations

import json
import random

import pytest
import torch

from slime_hydra.data.dataset import Prompt
from slime_hydra.data.readers import Pending
from slime_hydra.engine import checkpoint_state as S
from slime_hydra.engine.checkpoint import load_state, resolve_checkpoint, save_checkpoint
from tests.support.crafted import crafted_state


def trained_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(5, 3), torch.nn.Linear(3, 5, bias=False))
    model[1].weight = model[0].weight  # tied: one tensor under two names, as a tied LM head
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    model(torch.tensor([1, 2])).sum().backward()
    opt.step()
    sched.step()
    return model, opt, sched


def same(a, b) -> bool:
    """Equal values of the same types all the way down; tensors bit for bit (NaN where NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.reshape(-1).view(torch.uint8),
                                                                          b.reshape(-1).view(torch.uint8))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and a != a:
        return b != b
    return a == b


def test_every_kind_of_state_comes_back_bit_exact_and_of_the_same_type(tmp_path):
    model, opt, sched = trained_optimizer()
    random.seed(3)
    gen = torch.Generator().manual_seed(5)
    state = {
        "rollout_id": 4,
        "trainer": {"optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "ref_model": model.state_dict()},
        "torch_rng": torch.get_rng_state(), "python_rng": random.getstate(), "rollout": {"generator": gen.get_state()},
        "history": [(1, {"rollout/reward_mean": 0.25, "train/grad_norm": float("nan"), "x": float("-inf")})],
        "stream": {"buffer": [Prompt("1+1", "1+1=", [5, 6], "2", {"__state__": "a row's own key", "n": (1, 2)}),
                              Pending({"prompt": "2+2", "label": "4"}, None, (0, 7, 512))]},  # a row read ahead
        "odd_keys": {3: "int", (1, "a"): "tuple", None: "none"}, "bf16": torch.arange(6, dtype=torch.bfloat16).view(2, 3).t(),
        "empty": torch.zeros(0), "tracker_run_id": None,
    }
    S.write(tmp_path, state)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json", "state.safetensors"]
    got = S.read(tmp_path)
    assert same(got, state)
    assert got["trainer"]["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.95)  # a tuple stays a tuple
    assert list(got["trainer"]["optimizer"]["state"]) == [0]  # int parameter ids stay ints
    assert got["trainer"]["ref_model"]._metadata == state["trainer"]["ref_model"]._metadata  # the modules' versions
    json.loads((tmp_path / "state.json").read_text())  # standard JSON: NaN and inf are tagged, not bare tokens
    assert "NaN" not in (tmp_path / "state.json").read_text()
    # the optimizer resumes from it exactly: one more step from the saved state equals one more from the live one
    model2, opt2, _ = trained_optimizer()
    opt2.load_state_dict(got["trainer"]["optimizer"])
    for o, m in ((opt, model), (opt2, model2)):
        o.zero_grad()
        m(torch.tensor([3])).sum().backward()
        o.step()
    assert torch.equal(model[0].weight, model2[0].weight)


def test_anything_but_plain_data_is_refused_at_save(tmp_path):
    with pytest.raises(TypeError, match="plain data only, not builtins.set"):
        S.write(tmp_path, {"x": {1, 2}})


def test_a_state_pt_that_runs_a_command_is_refused_naming_it_and_never_runs(tmp_path):
    root, marker = tmp_path / "save", tmp_path / "ran"
    for i in (1, 3):
        save_checkpoint(str(root), i, lambda path: None, {"rollout_id": i})
    bad = crafted_state(root / "rollout_000003", marker)
    for load in (root, root / "rollout_000003"):  # the save root (latest names it) and the checkpoint itself
        with pytest.raises(S.UnsafeState) as e:
            resolve_checkpoint(str(load))
        assert e.value.exit_code == 2
        assert str(e.value).startswith(f"{bad}: refused: its pickle asks to run code when loaded (")
        assert "posix.system" in str(e.value) and "Nothing of it was run" in str(e.value)
    with pytest.raises(S.UnsafeState):
        load_state(root / "rollout_000003")
    assert not marker.exists()


def test_an_older_releases_state_pt_of_plain_data_still_loads(tmp_path):
    root = tmp_path / "save"
    save_checkpoint(str(root), 1, lambda path: None, {"rollout_id": 1})
    ckpt = root / "rollout_000001"
    state = {"rollout_id": 1, "torch_rng": torch.get_rng_state(), "python_rng": random.getstate(),
             "buffer": [Prompt("p", "t", [1], None)], "opt": {0: {"step": torch.tensor(3.0)}}}
    for f in ("state.json", "state.safetensors", "manifest.json"):  # written before manifests and the JSON state
        (ckpt / f).unlink()
    torch.save(state, ckpt / "state.pt")
    assert resolve_checkpoint(str(root)) == ckpt
    assert same(load_state(ckpt), state)
