"""Checks of the reward group: every rm_type in use is a known verifier, and the remote/custom RM keys make sense.

Called by the composition floor (app/checks.py) with the reward group and the rm_type of each place that
scores (the run's and every eval set's).
"""

from __future__ import annotations

import math
import os
import re
from urllib.parse import urlsplit

from slime_hydra.config.schema import RewardConfig

HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 token
from slime_hydra.rewards.verifiers import known_rm_types


def check(rm: RewardConfig, rm_types: dict[str, str]) -> list[str]:
    """`rm_types`: config key -> rm_type, e.g. {"reward.rm_type": "math", "eval.eval_prompt_data.aime.rm_type": "dapo"}."""
    problems = []
    for key, value in rm_types.items():
        if value not in known_rm_types():
            problems.append(f"{key}={value!r} is not one of {known_rm_types()}")
        if value == "remote_rm" and not rm.rm_url:
            problems.append(f"{key}=remote_rm needs reward.rm_url=http://host:port/path")
    problems += check_remote(rm)
    if rm.rm_type == "dapo" and rm.reward_key is None and not rm.custom_rm:
        problems.append("reward.rm_type=dapo returns a dict reward; set reward.reward_key=score")
    for key in ("rm_concurrency", "rm_max_retries"):
        if getattr(rm, key) < (1 if key == "rm_concurrency" else 0):
            problems.append(f"reward.{key}={getattr(rm, key)} must be >= {1 if key == 'rm_concurrency' else 0}")
    if rm.rm_timeout_s <= 0:
        problems.append(f"reward.rm_timeout_s={rm.rm_timeout_s} must be > 0")
    if not math.isfinite(rm.rm_failure_score):
        problems.append(f"reward.rm_failure_score={rm.rm_failure_score} must be a finite number (it is the reward a failed "
                        "or invalid score trains on); set reward.rm_failure_score=0")
    if rm.custom_rm_timeout_s <= 0:
        problems.append(f"reward.custom_rm_timeout_s={rm.custom_rm_timeout_s} must be > 0 (seconds)")
    return problems


def check_remote(rm: RewardConfig) -> list[str]:
    """rm_url is an http(s) URL with a host; every rm_headers entry is a header name and a variable set here."""
    problems = []
    if rm.rm_url:
        url = urlsplit(rm.rm_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            problems.append(f"reward.rm_url={url.scheme + '://' if url.scheme else ''}{url.hostname or ''}... must be an "
                            "http:// or https:// URL with a host, e.g. reward.rm_url=https://rm.example:8000/score")
    for header, var in rm.rm_headers.items():
        if not HEADER_NAME.fullmatch(str(header)):
            problems.append(f"reward.rm_headers: {header!r} is not an HTTP header name")
        if not isinstance(var, str) or var not in os.environ:
            problems.append(f"reward.rm_headers.{header}={var!r} names an environment variable that is not set; export "
                            f"{var}=<the header's value> (the value is read from there, never from the config)")
    if rm.rm_max_response_bytes < 1:
        problems.append(f"reward.rm_max_response_bytes={rm.rm_max_response_bytes} must be >= 1")
    return problems
