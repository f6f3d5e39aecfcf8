"""The front door: `slime-hydra --help` is the program's own, and `slime-hydra check-hf` checks a config.json."""

from __future__ import annotations

import json

import pytest

from slime_hydra.cli import split_argv
from tests.support.runs import run_cli


@pytest.mark.integration
def test_help_is_the_programs_own(workdir):
    out = run_cli(["--help"], workdir, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("slime-hydra: ") and lines[3] == "Quick start:"
    assert [line.split()[0] for line in lines[4:7]] == ["slime-hydra"] * 3  # three commands to start from
    assert "powered by Hydra" not in out.stdout and "== Config ==" not in out.stdout  # not Hydra's template
    groups = {line.split(":")[0].strip() for line in lines if line.startswith("  ") and ":" in line and "slime-hydra" not in line}
    # the groups a user picks (conf/<group>/), and not the internal schema group or hydra's own
    assert groups == {"algorithm", "cluster", "data", "debug", "eval", "experiment", "logger", "model", "parallelism",
                      "reward", "rollout", "train", "warmstart"}
    assert "  algorithm: cispo, dapo, dr_grpo, grpo*, gspo," in out.stdout  # conf/config.yaml picks grpo
    assert "    grpo/qwen3-tiny-addition-cpu-local-torch-v4*" in out.stdout  # the embedded default experiment
    assert "check-hf DIR" in out.stdout and "--hydra-help" in out.stdout and "  slime-hydra plan [overrides]" in out.stdout
    short = run_cli(["-h", "algorithm=dapo"], workdir, timeout=300)  # -h wins over overrides, as --help does
    assert short.returncode == 0 and short.stdout == out.stdout


@pytest.mark.integration
def test_check_hf_subcommand(workdir):
    usage = run_cli(["check-hf"], workdir, timeout=300)
    assert usage.returncode == 2 and usage.stderr.startswith("usage: slime-hydra check-hf CONFIG_JSON_OR_DIR")
    # conf/model/qwen3_tiny.yaml: 4 layers, hidden 128, 4 heads, 2 query groups of 32 channels, rope base 1e4
    hf = {"num_hidden_layers": 4, "hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 32, "rope_theta": 10000.0, "intermediate_size": 384}
    (workdir / "ok").mkdir()
    (workdir / "ok" / "config.json").write_text(json.dumps(hf))
    (workdir / "bad").mkdir()
    (workdir / "bad" / "config.json").write_text(json.dumps({**hf, "num_hidden_layers": 6}))
    ok = run_cli(["check-hf", "ok", "model=qwen3_tiny"], workdir, timeout=300)
    assert ok.returncode == 0 and ok.stdout.strip() == "model=qwen3-tiny matches ok", ok.stdout + ok.stderr
    bad = run_cli(["check-hf", "bad", "model=qwen3_tiny"], workdir, timeout=300)
    assert bad.returncode == 2
    assert bad.stdout.strip() == ("mismatch: bad/config.json: model.num_layers=4 does not match config.json num_hidden_layers=6; "
                                  "set model.num_layers to match the checkpoint (or pick the model option for it)")


def test_split_argv():
    assert split_argv(["-m", "algorithm=grpo,gspo", "--config-name", "other", "--cfg", "job", "seed=1"]) == (
        ["algorithm=grpo,gspo", "seed=1"], True, "other")
