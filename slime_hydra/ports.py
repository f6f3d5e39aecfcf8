"""Ports for the servers a run starts: SGLang engines and the router, process-group stores, weight-update groups.

A port is picked before the server that binds it has started, which on a loaded node can be a minute later. A port
the kernel picks (a bind to port 0) comes from its ephemeral range, which it also hands to outgoing connections as
their local ports in that minute: such a connection then holds the port, and the server fails to bind ("address
already in use"). So ports are drawn below the ephemeral range and above Ray's worker ports, at random from the
OS's entropy (the run's generators are seeded alike in every process of a run), and checked free when drawn.
"""

from __future__ import annotations

import secrets
import socket

EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
LOW = 20000  # Ray's worker ports end at 19999 (its default --max-worker-port)
TRIES = 200


def ephemeral_start() -> int:
    try:
        with open(EPHEMERAL_RANGE) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default range: 32768-60999


def is_free(port: int) -> bool:
    """Nothing is bound to `port` on any of this host's addresses (a bind to all of them succeeds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def free_port(avoid: frozenset[int] | set[int] = frozenset()) -> int:
    """A free port outside the kernel's ephemeral range, none of `avoid` (ports picked but not bound yet)."""
    top = ephemeral_start()
    if top - LOW >= 1000:
        for _ in range(TRIES):
            port = LOW + secrets.randbelow(top - LOW)
            if port not in avoid and is_free(port):
                return port
    while True:  # no room below the ephemeral range (or all of it taken): the kernel's pick
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        if port not in avoid:
            return port


def free_ports(n: int) -> list[int]:
    """`n` distinct free ports."""
    picked: set[int] = set()
    for _ in range(n):
        picked.add(free_port(picked))
    return sorted(picked, key=lambda p: secrets.randbelow(1 << 30))
