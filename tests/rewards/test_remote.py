"""The remote reward client trusts the server with nothing but scores (rewards/remote.py): a body without end is cut
at reward.rm_max_response_bytes with the driver's memory flat, a redirect is refused, headers come from named
environment variables, and only http(s) URLs pass validation."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from slime_hydra.app.preflight import preflight
from slime_hydra.config.schema import RewardConfig
from slime_hydra.errors import ConfigError
from slime_hydra.rewards.compute import RewardScorer
from slime_hydra.types import Sample

GB = 1 << 30
CHUNK = b" " * (1 << 16)


class Handler(BaseHTTPRequestHandler):
    calls: dict = {}
    sent: dict = {}
    seen_headers: dict = {}
    lock = threading.Lock()

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        with self.lock:
            self.calls[self.path] = self.calls.get(self.path, 0) + 1
            self.seen_headers[self.path] = dict(self.headers)
        if self.path == "/endless":  # 1 GB, generated as it is sent, no Content-Length (the body ends at close)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            sent = 0
            try:
                while sent < GB:
                    self.wfile.write(CHUNK)
                    sent += len(CHUNK)
            except OSError:  # the client hung up
                pass
            self.sent[self.path] = sent
            return
        if self.path == "/declared":  # a Content-Length over the limit: refused before a byte of the body is read
            self.send_response(200)
            self.send_header("Content-Length", str(GB))
            self.end_headers()
            return
        if self.path == "/redirect":
            self.send_response(307)
            self.send_header("Location", f"http://127.0.0.1:{self.server.server_address[1]}/elsewhere")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        out = b"1.0"
        self.send_response(200)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def rss_mb() -> float:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def scorer(url: str, **kw) -> RewardScorer:
    return RewardScorer(RewardConfig(rm_type="remote_rm", rm_url=url, rm_retry_backoff_s=0.01, **kw))


def samples(n: int = 1) -> list[Sample]:
    return [Sample(prompt="1+1=", label="2", response="2", index=i) for i in range(n)]


def test_an_endless_body_is_cut_at_the_limit_with_memory_flat(server):
    peak, before, done = [0.0], rss_mb(), threading.Event()

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], rss_mb())
            time.sleep(0.01)

    threading.Thread(target=watch, daemon=True).start()
    s, sc = samples(4), scorer(f"{server}/endless", rm_max_retries=2, rm_failure_score=-1.0)
    t0 = time.monotonic()
    sc.score(s)
    done.set()
    assert [x.reward for x in s] == [-1.0] * 4  # each cut at 1 MiB: a failure, not retried (it would come again)
    m = sc.metrics()
    assert m["reward/remote_failures"] == 4 and m["reward/remote_retries"] == 0
    assert Handler.calls["/endless"] == 4
    deadline = time.monotonic() + 30
    while len(Handler.sent) < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert Handler.sent["/endless"] < 64 << 20  # the server stopped far short of 1 GB: the client hung up
    assert peak[0] - before < 200, (before, peak[0])
    assert time.monotonic() - t0 < 30


def test_a_declared_length_over_the_limit_is_refused_unread(server, caplog):
    s, sc = samples(), scorer(f"{server}/declared", rm_max_response_bytes=1000)
    sc.score(s)
    assert s[0].reward == 0.0 and sc.metrics()["reward/remote_failures"] == 1


def test_a_redirect_is_refused_and_not_followed(server):
    Handler.calls.pop("/elsewhere", None)
    s, sc = samples(2), scorer(f"{server}/redirect", rm_max_retries=3)
    sc.score(s)
    assert [x.reward for x in s] == [0.0, 0.0]
    assert "/elsewhere" not in Handler.calls  # the label went nowhere else
    assert Handler.calls["/redirect"] == 2 and sc.metrics()["reward/remote_retries"] == 0
    from slime_hydra.rewards.remote import RemoteRewardError

    with pytest.raises(RemoteRewardError, match=r"HTTP 307 redirect to '.*/elsewhere' refused"):
        scorer(f"{server}/redirect", rm_on_failure="raise").score(samples())


def test_headers_come_from_the_named_environment_variables(server, monkeypatch):
    monkeypatch.setenv("TEST_RM_AUTH", "Bearer s3cr3t")
    s = samples()
    scorer(f"{server}/score", rm_headers={"Authorization": "TEST_RM_AUTH"}).score(s)
    assert s[0].reward == 1.0 and Handler.seen_headers["/score"]["Authorization"] == "Bearer s3cr3t"


def test_validation_refuses_other_schemes_and_unset_header_variables(monkeypatch):
    monkeypatch.delenv("TEST_RM_UNSET", raising=False)
    with pytest.raises(ConfigError) as info:
        preflight(["reward.rm_type=remote_rm", "reward.rm_url=file:///etc/passwd", "+reward.rm_headers.Authorization=TEST_RM_UNSET"])
    text = str(info.value)
    assert "reward.rm_url=file://... must be an http:// or https:// URL" in text
    assert "reward.rm_headers.Authorization='TEST_RM_UNSET' names an environment variable that is not set" in text
