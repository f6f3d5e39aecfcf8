"""Secrets given on the command line are written down nowhere: not in the MLflow store (params, tags, artifacts), not
in the run directory (composed_config.yaml, run_info.json, Hydra's .hydra/ files, the job's log, checkpoints), not in
what the run prints."""

from __future__ import annotations

from pathlib import Path

import pytest

from slime_hydra.config.redact import redact_argv, redact_config, redact_override, redact_text, secret_name, secrets_in
from tests.support.runs import FAST, run_cli


def files_holding(root: Path, needle: bytes) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes())


@pytest.mark.integration
def test_a_url_password_and_an_engine_token_appear_nowhere_after_a_run(tmp_path):
    secret = "SECRET" + "x7Qz"  # not a word any file holds by chance
    args = [*FAST, "num_rollout=2", "save_interval=1", f"hydra.run.dir={tmp_path}/run",
            f"reward.rm_url=https://u:{secret}@host/x", f"+rollout.sglang_env.HF_TOKEN={secret}"]
    proc = run_cli(args, tmp_path)  # the default store: sqlite:///mlruns.db and mlruns/ in the working directory
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "mlruns.db").is_file() and (tmp_path / "run" / ".hydra" / "config.yaml").is_file()
    assert files_holding(tmp_path, secret.encode()) == []
    assert secret not in proc.stdout + proc.stderr
    composed = (tmp_path / "run" / "composed_config.yaml").read_text()  # what is kept instead: the rest, masked
    assert "rm_url: https://***@host/x" in composed and "HF_TOKEN: '***'" in composed
    from mlflow.tracking import MlflowClient

    run = MlflowClient(f"sqlite:///{tmp_path}/mlruns.db").search_runs(["0", "1"])[0]
    assert run.data.params["reward.rm_url"] == "https://***@host/x" and run.data.params["rollout.sglang_env.HF_TOKEN"] == "***"
    assert "reward.rm_url=https://***@host/x" in run.data.tags["overrides"]


def test_what_counts_as_a_secret():
    assert [n for n in ("HF_TOKEN", "api_key", "admin_api_key", "AWS_SECRET_ACCESS_KEY", "password", "token", "db_passwd")
            if not secret_name(n)] == []
    # field names and counts are not secrets
    assert [n for n in ("input_key", "label_key", "reward_key", "tool_key", "tokenizer", "rollout_stop_token_ids",
                        "max_tokens_per_gpu", "tracking_uri", "rm_url") if secret_name(n)] == []
    config = {"reward": {"rm_url": "https://u:pw1@host/x?token=abcd&n=1"},
              "rollout": {"sglang_env": {"HF_TOKEN": "hf_1234", "OMP_NUM_THREADS": "1"}, "sglang": {"api_key": "k-9876"}},
              "data": {"input_key": "prompt"}}
    assert redact_config(config) == {"reward": {"rm_url": "https://***@host/x?token=***&n=1"},
                                     "rollout": {"sglang_env": {"HF_TOKEN": "***", "OMP_NUM_THREADS": "***"},
                                                 "sglang": {"api_key": "***"}},
                                     "data": {"input_key": "prompt"}}
    assert secrets_in(config) == {"u:pw1", "abcd", "hf_1234", "1", "k-9876"}
    assert redact_text("POST https://u:pw1@host/x failed; hf_1234 refused", {"hf_1234", "1"}) == \
        "POST https://***@host/x failed; *** refused"  # a value under 4 characters masks nothing in free text
    assert [redact_override(o) for o in ("+rollout.sglang_env.HF_TOKEN=hf_1", "reward.rm_url=http://a:b@h", "seed=3")] == \
        ["+rollout.sglang_env.HF_TOKEN=***", "reward.rm_url=http://***@h", "seed=3"]
    assert redact_argv(["sglang_router.launch_router", "--api-key", "k-9876", "--token=t", "--port", "3"]) == \
        ["sglang_router.launch_router", "--api-key", "***", "--token=***", "--port", "3"]
