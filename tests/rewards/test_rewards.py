"""Verifiers on hand-written cases, custom and remote rewards, pass@k and multi-task eval."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from slime_hydra.app.plugins import reward_scorer
from slime_hydra.app.preflight import compose_run, preflight
from slime_hydra.config.schema import RewardConfig
from slime_hydra.engine.steps import pass_at_k
from slime_hydra.errors import ConfigError, RunError, UserError
from slime_hydra.rewards.compute import RewardScorer
from slime_hydra.rewards.remote import RemoteRewardError
from slime_hydra.rewards.verifiers import last_boxed, verifier
from slime_hydra.types import Sample


@pytest.mark.parametrize("rm_type,response,label,expected", [
    ("math", "so the answer is 0.5", "\\frac{1}{2}", 1.0),  # 0.5 == 1/2
    ("math", "\\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("math", "total: 1,000", "1000", 1.0),  # thousands separator
    ("math", "I think 12, no wait, 13", "12", 0.0),  # two answers: the last one counts
    ("math", "I think 12, no wait, 13", "13", 1.0),
    ("math", "no idea", "7", 0.0),  # missing answer
    ("math", "95", "95", 1.0),
    ("math", "\\boxed{2} then \\boxed{3}", "2", 0.0),  # the last box counts
    ("deepscaler", "<think>maybe 3</think> it is \\boxed{4}", "4", 1.0),
    ("deepscaler", "it is \\boxed{4}", "4", 0.0),  # no </think>: 0 by definition
    ("deepscaler", "<think>x</think> \\boxed{\\frac{2}{4}}", "0.5", 1.0),  # symbolic equivalence
    ("f1", "The quick brown fox", "quick brown dog", 2 / 3),  # p = 2/3, r = 2/3 (articles dropped)
    ("f1", "Paris!", "paris", 1.0),
    ("f1", "", "paris", 0.0),
    ("exact_match", " 42 ", "42", 1.0),
    ("exact_match", "42.0", "42", 0.0),
    ("boxed_exact_match", "answer \\boxed{x^{2}}", "x^{2}", 1.0),  # nested braces
    ("boxed_exact_match", "answer x^{2}", "x^{2}", 0.0),  # no box
    ("boxed_math", "\\boxed{\\frac{1}{2}} and 0.7", "0.5", 1.0),  # the box wins over a later number
])
def test_verifiers(rm_type, response, label, expected):
    assert verifier(rm_type)(response, label) == pytest.approx(expected)


def test_last_boxed_nested_and_unclosed():
    assert last_boxed("a \\boxed{\\frac{1}{\\sqrt{2}}} b") == "\\frac{1}{\\sqrt{2}}"
    assert last_boxed("\\boxed{unclosed") is None and last_boxed("none") is None


def test_dapo_dict_reward_and_reward_key():
    fn = verifier("dapo")
    assert fn("work...\nAnswer: 1/2", "0.5") == {"score": 1.0, "acc": True, "pred": "1/2"}
    assert fn("work...\nAnswer: 3", "4") == {"score": -1.0, "acc": False, "pred": "3"}
    assert fn("no answer line", "4")["score"] == -1.0
    s = [Sample(prompt="p", label="4", response="Answer: 4")]
    RewardScorer(RewardConfig(rm_type="dapo", reward_key="score")).score(s)
    assert s[0].reward == 1.0 and s[0].metadata["reward_dict"]["acc"] is True


def test_per_sample_rm_type_overrides_the_default():
    s = [Sample(prompt="p", label="4", response=" 4 "), Sample(prompt="p", label="4", response=" 4 ", metadata={"rm_type": "exact_match"}),
         Sample(prompt="p", label="4", response="x4", metadata={"rm_type": "exact_match"})]
    RewardScorer(RewardConfig(rm_type="math")).score(s)
    assert [x.reward for x in s] == [1.0, 1.0, 0.0]


def length_reward(sample, scale=1.0):
    return scale * len(sample.response)


async def async_reward(sample):
    await asyncio.sleep(0)
    return 2.0


def group_reward(samples):
    return [float(i) for i in range(len(samples))]


def two_args(sample, other):
    return 0.0


def test_custom_rewards_sync_async_group():
    mk = lambda: [Sample(prompt="p", response="abc"), Sample(prompt="p", response="de")]  # noqa: E731
    s = mk()
    reward_scorer(RewardConfig(custom_rm={"_target_": f"{__name__}.length_reward", "scale": 0.5})).score(s)
    assert [x.reward for x in s] == [1.5, 1.0]
    s = mk()
    reward_scorer(RewardConfig(custom_rm={"_target_": f"{__name__}.async_reward"})).score(s)
    assert [x.reward for x in s] == [2.0, 2.0]
    s = mk()
    reward_scorer(RewardConfig(custom_rm={"_target_": f"{__name__}.group_reward"}, group_rm=True)).score(s)
    assert [x.reward for x in s] == [0.0, 1.0]


def test_custom_reward_checked_before_anything_starts():
    with pytest.raises(ConfigError) as info:
        preflight(["+reward.custom_rm._target_=tests.rewards.test_rewards.nope", "reward.rm_type=f2"])
    text = str(info.value)
    assert "tests.rewards.test_rewards.nope does not import" in text and "reward.rm_type='f2' is not one of" in text
    with pytest.raises(ConfigError, match="does not fit a call with 1 positional"):
        preflight([f"++reward.custom_rm={{_target_:{__name__}.two_args}}"])


def test_pass_at_k_closed_form():
    # n = 4 samples, c = 1 correct: pass@1 = 1/4; pass@2 = 1 - C(3,2)/C(4,2) = 1 - 3/6 = 1/2;
    # pass@4 = 1 - C(3,4)/C(4,4) = 1 (n - c < k)
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert pass_at_k(4, 1, 4) == 1.0
    # n = 5, c = 2, k = 3: 1 - C(3,3)/C(5,3) = 1 - 1/10 = 0.9
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9)
    assert pass_at_k(5, 0, 3) == 0.0


class _Handler(BaseHTTPRequestHandler):
    calls: dict = {}
    lock = threading.Lock()

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.lock:
            self.calls[self.path] = self.calls.get(self.path, 0) + 1
        if self.path == "/slow":
            time.sleep(1.0)
            return  # the client gave up after rm_timeout_s: nobody reads an answer (writing one may hit a closed socket)
        if self.path == "/error":
            self.send_response(500)
            self.end_headers()
            return
        out = json.dumps(float(body["response"].strip() == body["label"])).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def rm_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def remote(url, **kw):
    return RewardScorer(RewardConfig(rm_type="remote_rm", rm_url=url, rm_retry_backoff_s=0.01, **kw))


def samples(n=6):
    return [Sample(prompt="1+1=", label="2", response="2" if i % 2 == 0 else "3", index=i) for i in range(n)]


def test_remote_rm_scores(rm_server):
    s, scorer = samples(), remote(f"{rm_server}/score", rm_concurrency=2)
    scorer.score(s)
    assert [x.reward for x in s] == [1.0, 0.0] * 3
    m = scorer.metrics()
    assert m["reward/remote_retries"] == 0 and m["reward/remote_failures"] == 0 and m["perf/reward_time_s"] > 0


def test_remote_rm_slow_server_times_out_and_retries(rm_server):
    s, scorer = samples(2), remote(f"{rm_server}/slow", rm_timeout_s=0.2, rm_max_retries=2)
    scorer.score(s)
    assert [x.reward for x in s] == [0.0, 0.0]  # failure score
    m = scorer.metrics()
    assert m["reward/remote_retries"] == 4 and m["reward/remote_failures"] == 2  # 2 samples x 2 retries


def test_remote_rm_error_policy_zero_or_raise(rm_server):
    _Handler.calls.pop("/error", None)
    s, scorer = samples(3), remote(f"{rm_server}/error", rm_max_retries=1)
    scorer.score(s)
    assert scorer.metrics()["reward/remote_failures"] == 3 and _Handler.calls["/error"] == 6  # 3 x (1 + 1 retry)
    with pytest.raises(RemoteRewardError, match="reward.rm_on_failure=zero"):
        remote(f"{rm_server}/error", rm_max_retries=0, rm_on_failure="raise").score(samples(1))


def test_remote_rm_needs_url():
    with pytest.raises(ConfigError, match="reward.rm_url"):
        preflight(["reward.rm_type=remote_rm"])


def test_multi_task_eval_logs_both_datasets_and_writes_samples(tmp_path):
    from mlflow.tracking import MlflowClient

    from slime_hydra.app.session import run_session
    from slime_hydra.config.store import asset_path
    from tests.support.runs import FAST, mlflow_db

    db = mlflow_db(tmp_path / "m.db")
    sub = f"{{path:'{asset_path('subtraction/test.jsonl')}',n_samples_per_eval_prompt:4,eval_temperature:1.0,eval_top_k:-1}}"
    cfg = compose_run(FAST + ["num_rollout=2", f"logger.tracking_uri={db}", f"+eval.eval_prompt_data.subtraction={sub}"])
    assert cfg.eval.eval_prompt_data["subtraction"]["n_samples_per_eval_prompt"] == 4
    run_session(cfg, str(tmp_path / "out"), [])
    client = MlflowClient(db)
    (run,) = client.search_runs([client.get_experiment_by_name("slime_hydra").experiment_id])
    m = run.data.metrics
    for key in ("eval/addition/accuracy", "eval/addition/pass_at_1", "eval/subtraction/accuracy", "eval/subtraction/pass_at_1",
                "eval/subtraction/pass_at_2", "eval/subtraction/pass_at_4", "eval/subtraction/response_len_mean"):
        assert key in m, key  # pass@k is stored as pass_at_k: MLflow names may not hold '@'
    assert m["eval/subtraction/pass_at_4"] >= m["eval/subtraction/pass_at_1"]
    rows = [json.loads(line) for line in open(tmp_path / "out" / "eval" / "subtraction" / "step_000002.jsonl")]
    assert len(rows) == 200 * 4 and {"prompt", "response", "label", "reward"} <= set(rows[0])
    assert {a.path for a in client.list_artifacts(run.info.run_id, "eval/subtraction")} == {
        "eval/subtraction/step_000000.jsonl", "eval/subtraction/step_000002.jsonl"}


def test_math_equivalence_works_outside_the_main_thread():
    # the async collector scores in a worker thread, where math-verify's signal.alarm timeout cannot be set
    import threading

    from slime_hydra.rewards.verifiers import equivalent

    out = {}
    t = threading.Thread(target=lambda: out.update(v=equivalent("\\frac{1}{2}", "0.5")))
    t.start()
    t.join()
    assert out["v"] is True


@pytest.mark.parametrize("bad", ["nan", "inf", "str", "none"])
def test_a_reward_that_is_not_a_finite_number_is_a_reward_failure(bad, caplog):
    # samples 0 and 4 of 6 get the bad value; the others digit_reward's (digits of "2" or "3": 1 % 3 = 1)
    node = {"_target_": "tests.support.plugins.invalid_reward", "bad": bad}
    scorer = reward_scorer(RewardConfig(custom_rm=node, rm_failure_score=-1.0))
    s = samples()
    scorer.score(s)
    assert [x.reward for x in s] == [-1.0, 1.0, 1.0, 1.0, -1.0, 1.0]  # rm_on_failure=zero: rm_failure_score
    assert scorer.metrics()["reward/invalid_rewards"] == 2
    assert "sample 0" in caplog.text and "reward.rm_on_failure=zero" in caplog.text
    raising = reward_scorer(RewardConfig(custom_rm=node, rm_on_failure="raise"))
    with pytest.raises(RunError, match=r"gave sample 0 the reward .*reward.rm_on_failure=zero"):
        raising.score(samples())


def test_a_dict_reward_without_its_key_is_a_failure_and_without_reward_key_a_config_error():
    node = {"_target_": "tests.support.plugins.invalid_reward", "bad": "missing"}
    s = samples()
    scorer = reward_scorer(RewardConfig(custom_rm=node, reward_key="score"))
    scorer.score(s)
    assert s[0].reward == 0.0 and scorer.metrics()["reward/invalid_rewards"] == 2
    with pytest.raises(UserError, match="set reward.reward_key to one of"):
        reward_scorer(RewardConfig(custom_rm=node)).score(samples())


def test_rm_failure_score_must_be_finite():
    for value in ("nan", "inf", "-inf"):
        with pytest.raises(ConfigError, match="reward.rm_failure_score=.* must be a finite number"):
            preflight([f"reward.rm_failure_score={value}"])
