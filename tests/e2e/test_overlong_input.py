"""Overlong input ends in a clear error or a counted drop, never a traceback: a 50 MB line and a 100,000-deep nested
line exit 2 naming their file and line (or are skipped with data.on_bad_row=skip), and a prompt longer than the model's
context minus the response length is dropped at load and counted in data/overlong_rows, in memory and streamed."""

from __future__ import annotations

import json

import pytest

from slime_hydra.app.preflight import compose_run
from slime_hydra.app.session import run_session
from tests.data.test_rows import NESTED, long_line
from tests.support.runs import FAST, run_cli

pytestmark = pytest.mark.integration  # whole runs

ROWS = [json.dumps({"prompt": f"{a}+{a}=", "label": str(2 * a)}) for a in range(10, 18)]  # one rollout of 8 prompts


def test_a_50_mb_line_and_a_deep_line_exit_2_naming_them_or_are_skipped(workdir):
    path = long_line(workdir / "big.jsonl", 50 << 20)  # lines 1-3: good, 50 MB, good
    with open(path, "a") as f:
        f.write(NESTED + "\n" + "\n".join(ROWS[:6]) + "\n")  # line 4: nested 100,000 deep
    common = ["logger=none", "warmstart=none", *FAST, f"data.prompt_data={path}", "num_rollout=1", "eval=none"]
    proc = run_cli([*common, f"hydra.run.dir={workdir}/err"], workdir)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr + proc.stdout
    assert f"{path}:2: the line is {50 << 20:,} bytes, over data.max_line_bytes" in proc.stderr
    assert f"{path}:4: JSON nested too deeply to parse (RecursionError)" in proc.stderr
    proc = run_cli([*common, "data.on_bad_row=skip", f"hydra.run.dir={workdir}/skip"], workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((workdir / "skip" / "summary.json").read_text())["data/skipped_rows"]["last"] == 2


@pytest.mark.parametrize("streaming", [False, True])
def test_an_overlong_prompt_is_dropped_at_load_and_counted(tmp_path, streaming):
    path = tmp_path / "data.jsonl"
    overlong = json.dumps({"prompt": "1+" * 150 + "1=", "label": "151"})  # 302 characters > 256 - 6
    path.write_text("\n".join(ROWS[:4] + [overlong] + ROWS[4:]) + "\n")
    extra = [f"data.prompt_data={path}", "num_rollout=1", f"data.streaming={str(streaming).lower()}",
             f"save_debug_rollout_data={tmp_path}/dump"]
    cfg = compose_run(FAST + ["logger=none", "eval=none", *extra])
    assert cfg.data.rollout_max_prompt_len == 250
    summary = run_session(cfg, str(tmp_path / "run"), extra)
    assert summary["data/overlong_rows"]["last"] == 1.0
    served = {json.loads(x)["prompt"] for x in list(open(tmp_path / "dump" / "rollout_000000.jsonl"))[1:]}
    assert served == {json.loads(r)["prompt"] for r in ROWS}  # the 8 good prompts: one rollout, one epoch
