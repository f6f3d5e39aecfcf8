"""Where an SGLang server or the router listens, and the key it asks for.

Engines and the router listen on the loopback, which every user of the node shares: each runs with this run's API key
(random, made when the engines start: `new_key`), so only a holder of the key can generate, update or release the
weights, pause the engines or read their state. Every client in the project sends it (`headers`). The key never goes
on a command line, which `ps` shows to everyone: a server gets it in its environment (`KEY_ENV`, readable by its own
user only) and the launcher `keyed.py` hands it to the server's own arguments inside the process.
/health answers without the key (SGLang keeps it open for probes): a health check sends none, so a process that took a
server's port learns nothing from it, and the answer counts only from the process that was started
(ServerProcess.listens_on).
Every request goes out with the process's one TLS context (`tls`), not a new one each time.
"""

from __future__ import annotations

import functools
import secrets
import ssl
from dataclasses import dataclass, field

import httpx

KEY_ENV = "SLIME_HYDRA_SGLANG_API_KEY"
# the key of a router this run did not start (rollout.sglang_router_ip / rollout.sglang_router_port): the environment
# only, like KEY_ENV for engines it did not start, so no config dump or tracked run holds it
ROUTER_KEY_ENV = "SLIME_HYDRA_SGLANG_ROUTER_API_KEY"


@functools.cache
def tls() -> ssl.SSLContext:
    """httpx's default TLS context (its CA bundle, SSL_CERT_FILE / SSL_CERT_DIR honoured), built once for the process and
    passed as every request's `verify`. httpx builds one for each client, and `httpx.post` and its kin make a client per
    request: about 30 ms of CPU each (the CA bundle's parse), even for plain http://, where the context goes unused. A
    weight sync makes about 7 requests per engine and a health check one per engine per interval, so against a CPU
    engine the context was most of their cost. An https:// endpoint is verified as before."""
    return httpx.create_ssl_context()


def new_key() -> str:
    return secrets.token_urlsafe(32)


@dataclass(frozen=True)
class Endpoint:
    url: str  # http://127.0.0.1:PORT
    key: str = field(repr=False)  # never in a message: str() and repr() give the URL alone

    def __str__(self) -> str:
        return self.url

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}
