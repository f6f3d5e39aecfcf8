"""slime's rollout hooks under cluster.backend=ray: the loop and the collector run in the driver, so every hook runs
there, over the rollout manager's engine and the train rank's batch, as in one process."""

from __future__ import annotations

import json

import pytest

from slime_hydra.app.preflight import compose_run
from tests.support import rollout_plugins as P
from tests.support.runs import FAST
from tests.support.servers import join_ray

pytestmark = pytest.mark.integration  # starts Ray: not in `make test-fast`

PLUGINS = "tests.support.rollout_plugins"


@pytest.fixture(scope="module")
def ray_cluster(ray_head):
    """This process joins the session's `ray start --head` cluster as a driver, in this module's namespace."""
    import ray

    join_ray(ray_head, "ray_rollout_hooks")
    yield ray_head.gcs_address
    ray.shutdown()


def test_every_rollout_hook_runs_under_ray(ray_cluster, tmp_path):
    """One train rank + one engine; the rollout function (one token per response) calls the engine through the
    three-draft generate hook; the filter, the all-samples process, the conversion and the postprocess follow."""
    from slime_hydra.app.session import run_session

    for recorded in (P.ROLLOUT_CALLS, P.JUDGED, P.BATCHES):
        recorded.clear()
    args = FAST + ["logger=none", "num_rollout=2", "cluster.backend=ray",
                   "+reward.custom_rm._target_=tests.support.plugins.digit_reward",
                   f"+rollout.rollout_function._target_={PLUGINS}.one_token_rollout",
                   f"+rollout.custom_generate._target_={PLUGINS}.three_drafts",
                   f"+rollout.rollout_sample_filter._target_={PLUGINS}.remove_below",
                   f"+rollout.rollout_all_samples_process._target_={PLUGINS}.record_judged",
                   f"+rollout.custom_convert_samples_to_train_data._target_={PLUGINS}.first_tokens_only",
                   f"+rollout.rollout_data_postprocess._target_={PLUGINS}.scale_advantages"]
    run_session(compose_run(args), str(tmp_path), args)
    s = json.loads((tmp_path / "summary.json").read_text())
    assert P.ROLLOUT_CALLS == [0, 1] and [r for r, _ in P.BATCHES] == [0, 1]
    assert s["rollout/response_len_mean"]["max"] <= 1.0 and s["rollout/one_token_rollouts"]["count"] == 2
    for (_, batch), judged in zip(P.BATCHES, P.JUDGED):
        rows = [x for g in judged for x in g]
        assert len(judged) == 8 and [x["draft"] for x in rows] == [0, 1, 2] * 32  # 3 drafts after each prompt sample
        # one response token at most: draft 0 trains it, drafts 1 and 2 mask it; a removed sample trains nothing
        expected = [float(x["response_length"] > 0 and x["draft"] == 0 and not x["removed"]) for x in rows]
        assert batch["loss_mask"].sum(-1).tolist() == expected
        assert [x["removed"] for x in rows] == [x["reward"] < 1.0 for x in rows]
