"""Server ports are drawn outside the kernel's ephemeral range (which outgoing connections take their local ports
from, in the minute between a pick and a loaded server's bind), free when drawn, and distinct."""

from __future__ import annotations

import socket

from slime_hydra import ports


def test_ports_come_from_below_the_ephemeral_range_and_are_free():
    top = ports.ephemeral_start()
    picked = [ports.free_port() for _ in range(50)]
    assert all(ports.LOW <= p < top for p in picked), (top, picked)
    assert len(set(picked)) > 40  # drawn at random, not in sequence from one seed
    assert all(ports.is_free(p) for p in picked)


def test_a_bound_port_and_the_avoided_ones_are_never_drawn(monkeypatch):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        assert not ports.is_free(taken)  # bound on the loopback: a bind to every address fails
    draws = iter([30001, 30002, 30003])
    monkeypatch.setattr(ports.secrets, "randbelow", lambda n: next(draws) - ports.LOW)
    monkeypatch.setattr(ports, "is_free", lambda p: p != 30002)
    assert ports.free_port(avoid={30001}) == 30003


def test_free_ports_are_distinct():
    assert len(set(ports.free_ports(20))) == 20
