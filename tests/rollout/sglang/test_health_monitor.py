"""The engines' health monitor on a real server process: a stand-in engine (a Python HTTP server answering /health,
started by the same launcher as an SGLang server) that stops answering for one check (SIGSTOP: the 5 s ping times out,
as on a loaded node) is taken out, and once it answers again it is resynced and serves again, without a restart.
Before, a missed check left a serving engine out for good: no later sync or request reached it."""

from __future__ import annotations

import os
import signal
import sys

from slime_hydra.rollout.sglang.engines import EngineGroup, wait_healthy

ANSWERS_HEALTH = ("import sys\n"
                  "from http.server import BaseHTTPRequestHandler, HTTPServer\n"
                  "class H(BaseHTTPRequestHandler):\n"
                  "    def do_GET(self):\n"
                  "        self.send_response(200); self.send_header('Content-Length', '0'); self.end_headers()\n"
                  "    def log_message(self, *args):\n"
                  "        pass\n"
                  "HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n")


def test_an_engine_that_misses_a_check_is_resynced_and_serves_again_without_a_restart(tmp_path):
    group = EngineGroup("unused", 1, 1, 0, {}, "round_robin", {}, tmp_path, 60)
    (e,) = group.engines
    e.argv = lambda host, port: [sys.executable, "-c", ANSWERS_HEALTH, str(port)]
    e.launch()
    try:
        wait_healthy(e.process, e.url, 60, "stand-in engine")
        e.ever_healthy = True
        e.healthy.set()
        resynced: list[int] = []

        def check() -> None:
            group._check(e, first_wait_s=0.0, max_failures=3, on_restart=lambda eng: resynced.append(eng.index))

        check()  # answering: nothing changes
        assert e.healthy.is_set() and (e.failures, e.restarts, resynced) == (0, 0, [])
        os.killpg(e.process.pid, signal.SIGSTOP)  # alive, but no answer within the check's timeout
        try:
            check()
        finally:
            os.killpg(e.process.pid, signal.SIGCONT)
        assert not e.healthy.is_set() and e.failures == 1  # out: syncs and requests skip it
        check()
        assert e.healthy.is_set() and (e.failures, e.restarts, e.launches) == (0, 0, 1)  # back, the same process
        assert resynced == [0]  # the weights it may have missed while out, before it serves
    finally:
        e.process.stop(grace_s=1.0)
