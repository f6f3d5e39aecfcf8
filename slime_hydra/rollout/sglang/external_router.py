"""A sglang-router this run did not start (rollout.sglang_router_ip / rollout.sglang_router_port, slime's
`--sglang-router-ip/--sglang-router-port`): the run registers its engines with it and removes them when it ends.

The router's API (sglang-router >= 0.3): `GET /workers` lists what it routes to, `POST /workers {"url", "api_key"}`
queues an engine's registration (202 and a worker id; the router then checks the engine's /health and lists it),
`DELETE /workers/{id}` queues its removal. Every call sends the router's key ($SLIME_HYDRA_SGLANG_ROUTER_API_KEY,
`ROUTER_KEY_ENV`); each engine is registered with its own key, which the router sends on to it (an engine registered
without one answers the router's /generate with 401).

What the run checks, before anything generates:
- the router answers, and accepts the key (else an error naming the variable);
- it routes to nothing but this run's engines: a worker the run does not own (another run's engine, with other
  weights) would serve part of this run's rollouts, so the run refuses such a router and registers nothing. A
  registration of one of the run's own engine URLs left behind (a run that was killed) is removed and made again, with
  the engine's key of now;
- every engine is listed healthy within the start timeout.
At shutdown the run removes the workers it registered, and leaves the router running with what it had before.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Sequence

import httpx

from slime_hydra.errors import RunError
from slime_hydra.rollout.sglang.endpoint import ROUTER_KEY_ENV, Endpoint, tls

log = logging.getLogger(__name__)


class RouterAttachError(RunError):
    pass


class ExternalRouter:
    def __init__(self, endpoint: Endpoint, timeout_s: float):
        """endpoint: the router's URL and key; timeout_s: the deadline of each wait (registration, removal)."""
        self.endpoint, self.timeout_s = endpoint, timeout_s
        self.registered: set[str] = set()  # the engine URLs this run registered

    @property
    def log_hint(self) -> str:
        return f"the router at {self.endpoint.url} was not started by this run: its log is where it was started"

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            r = httpx.request(method, self.endpoint.url + path, headers=self.endpoint.headers,
                              timeout=min(30.0, self.timeout_s), verify=tls(), **kwargs)
        except httpx.HTTPError as e:
            raise RouterAttachError(f"no sglang-router answered {method} {self.endpoint.url}{path} ({type(e).__name__}: "
                                    f"{e}): check rollout.sglang_router_ip / rollout.sglang_router_port, or unset them "
                                    "and let the run start a router of its own") from None
        if r.status_code in (401, 403):
            raise RouterAttachError(f"the sglang-router at {self.endpoint.url} refused the key in ${ROUTER_KEY_ENV} "
                                    f"(HTTP {r.status_code}): export the key the router was started with "
                                    "(sglang_router.launch_router --api-key)")
        return r

    def workers(self) -> list[dict[str, Any]]:
        """What the router routes to now: [{"id", "url", "is_healthy", ...}]."""
        r = self._call("GET", "/workers")
        try:
            listed = r.json()["workers"]
        except (ValueError, KeyError, TypeError):
            raise RouterAttachError(f"{self.endpoint.url}/workers answered HTTP {r.status_code} with no worker list "
                                    f"({r.text[:200]!r}): is it an sglang-router of version 0.3 or later?") from None
        return [w for w in listed if isinstance(w, dict)]

    def register(self, engines: Sequence[Endpoint]) -> None:
        """Each engine registered with its key and listed healthy, on a router that routes to nothing else."""
        urls = {e.url for e in engines}
        listed = self.workers()
        foreign = sorted(str(w.get("url")) for w in listed if w.get("url") not in urls)
        if foreign:
            raise RouterAttachError(
                f"the sglang-router at {self.endpoint.url} also routes to {foreign}, which this run did not start: "
                "part of its rollouts would be generated there, with other weights. Remove them from the router "
                "(DELETE /workers/{id}), point rollout.sglang_router_ip / rollout.sglang_router_port at a router of "
                "this run's own, or unset them and let the run start one")
        if listed:  # only our own URLs: a killed run's registrations, whose key may not be the engine's of now
            self._drop(urls, "old registrations of")
        try:
            for e in engines:
                self.registered.add(e.url)
                r = self._call("POST", "/workers", json={"url": e.url, "api_key": e.key})
                if r.status_code not in (200, 201, 202):
                    raise RouterAttachError(f"the sglang-router at {self.endpoint.url} did not take the engine at "
                                            f"{e.url} (HTTP {r.status_code}: {r.text[:300]})")
            self._wait(lambda ws: urls <= {w.get("url") for w in ws if w.get("is_healthy", True)},
                       f"the engines {sorted(urls)} to be listed healthy")
        except BaseException:
            self.remove()
            raise

    def _wait(self, done, what: str) -> None:
        deadline = time.monotonic() + self.timeout_s
        while True:
            listed = self.workers()
            if done(listed):
                return
            if time.monotonic() > deadline:
                raise RouterAttachError(f"the sglang-router at {self.endpoint.url} did not finish waiting for {what} "
                                        f"within {self.timeout_s:g} s (it lists {[w.get('url') for w in listed]}); raise "
                                        "rollout.sglang_server_start_timeout_s if the router is only slow")
            time.sleep(0.2)

    def _drop(self, urls: set[str], what: str) -> None:
        """The router's workers at `urls` removed (by the ids it lists them under), and waited for."""
        for w in self.workers():
            if w.get("url") in urls and "id" in w:
                r = self._call("DELETE", f"/workers/{w['id']}")
                if r.status_code not in (200, 202, 204, 404):
                    raise RouterAttachError(f"the sglang-router at {self.endpoint.url} did not remove the worker at "
                                            f"{w['url']} (HTTP {r.status_code}: {r.text[:300]})")
        self._wait(lambda ws: not {w.get("url") for w in ws} & urls, f"{what} {sorted(urls)} to be removed")

    def remove(self) -> None:
        """The workers this run registered, removed (a router that is gone or refuses is logged, not raised: the run is
        ending) and waited for, so that the next run that attaches finds the router as it was."""
        if not self.registered:
            return
        try:
            self._drop(self.registered, "the engines")
        except RouterAttachError as e:
            log.warning("sglang-router: this run's engines may still be registered: %s", e)
        self.registered = set()
