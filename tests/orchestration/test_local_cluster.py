"""The Ray cluster a run starts for itself (cluster.backend=ray, no cluster.address): every server it runs listens on
127.0.0.1 only, and a client without the run's token cannot join it, from this host either."""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slime_hydra.errors import UserError

# a run's connect() in a process of its own, with no token given (it makes its own); it prints its token (for the
# test's control only), its GCS address and its pid, then holds the cluster until its stdin closes
RUN = """
import os, sys
import ray
from slime_hydra.config.schema import ClusterConfig
from slime_hydra.orchestration.placement import connect
started, _ = connect(ClusterConfig(backend="ray", address="local"))
assert started
print(os.environ["RAY_AUTH_TOKEN"], ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()
"""
JOIN = "import ray; ray.init(address=%r, logging_level='ERROR'); print('JOINED', flush=True)"
# a run given cluster.address=<that cluster>
CONNECT = """
from slime_hydra.config.schema import ClusterConfig
from slime_hydra.errors import UserError
from slime_hydra.orchestration.placement import connect
try:
    connect(ClusterConfig(backend="ray", address=%r))
    print("JOINED", flush=True)
except UserError as e:
    print(e, flush=True)
"""


def descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (ValueError, OSError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(d.name))
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        out.add(p)
        todo += children.get(p, [])
    return out


def listening(pids: set[int]) -> list[tuple[str, int, str]]:
    """(address, port, process name) of every TCP socket the processes listen on, from /proc/net/tcp{,6}."""
    inodes: dict[str, str] = {}
    for pid in pids:
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes[target[8:-1]] = name
        except OSError:
            continue
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] != "0A" or cols[9] not in inodes:  # 0A: LISTEN
                continue
            hexaddr, port = cols[1].split(":")
            raw = bytes.fromhex(hexaddr)
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))  # each 32-bit word is host-endian
            addr = ipaddress.ip_address(raw)
            addr = getattr(addr, "ipv4_mapped", None) or addr
            out.append((str(addr), int(port, 16), inodes[cols[9]]))
    return out


def outside_ip() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # no packet is sent: the route picks the interface
        return s.getsockname()[0]


@pytest.mark.integration
def test_a_runs_own_cluster_listens_on_the_loopback_and_refuses_a_client_without_its_token(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}  # as a user's shell: no token, no mode
    run = subprocess.Popen([sys.executable, "-c", RUN], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=open(tmp_path / "run.log", "w"), text=True, env={**env, "HOME": str(tmp_path)})
    try:
        token, gcs = run.stdout.readline().split()
        assert gcs.startswith("127.0.0.1:"), (tmp_path / "run.log").read_text()[-2000:]
        sockets = listening(descendants(run.pid))
        names = {name for _, _, name in sockets}
        assert {"gcs_server", "raylet"} <= names, sockets
        assert ("127.0.0.1", int(gcs.rsplit(":", 1)[1]), "gcs_server") in sockets
        assert all(addr == "127.0.0.1" for addr, _, _ in sockets), sockets  # nothing on * or the node's IP
        assert not (tmp_path / ".ray" / "auth_token").exists()  # the run's own token, in no shared file
        # clients on this host, dialling 127.0.0.1 itself: Ray's with no token and with the run's (the control), and
        # another run (cluster.address, which dials a loopback address there by itself) with a wrong one
        here = {**env, "HOME": str(tmp_path), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
        tries = {"no token": (JOIN, here), "the run's token": (JOIN, {**here, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}),
                 "wrong token": (CONNECT, {**env, "HOME": str(tmp_path), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64})}
        procs = {what: subprocess.Popen([sys.executable, "-c", script % gcs], env=penv,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for what, (script, penv) in tries.items()}
        got = {what: p.communicate(timeout=180) for what, p in procs.items()}
        assert "JOINED" in got["the run's token"][0], got["the run's token"][1][-2000:]
        out, err = got["no token"]
        assert procs["no token"].returncode != 0 and "JOINED" not in out and "InvalidAuthToken" in err, err[-2000:]
        out, err = got["wrong token"]
        assert out.strip() == (f"cluster.address={gcs}: the Ray cluster there refused this process's token; set "
                               "RAY_AUTH_MODE=token and RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH) to the cluster's token "
                               "(docs/security.md)"), (out, err[-2000:])
        # and from the node's outside address nothing answers at all
        with socket.socket() as s:
            assert s.connect_ex((outside_ip(), int(gcs.rsplit(":", 1)[1]))) != 0
    finally:
        run.stdin.close()
        run.wait(timeout=60)


def test_auth_disabled_is_refused_for_a_runs_own_cluster(monkeypatch):
    from slime_hydra.orchestration import local_cluster

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    with pytest.raises(UserError, match="RAY_AUTH_MODE=disabled: the Ray cluster a run starts for itself runs with "
                                        "token auth .* unset RAY_AUTH_MODE"):
        local_cluster.check_auth_mode()


@pytest.mark.integration
def test_the_sessions_head_node_listens_on_the_loopback_and_its_job_api_asks_for_the_token(ray_head):
    """The tests' shared `ray start --head` (tests/support/servers.py) runs as docs/security.md tells users to start
    theirs: every server on 127.0.0.1, and its dashboard (the job API: code submitted to the cluster) answers 401
    without the token."""
    import urllib.error
    import urllib.request

    starts = []  # the `ray start --block` process of the session's head (its temp dir is its own)
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and f"--temp-dir\0{ray_head.temp_dir}\0" in (d / "cmdline").read_bytes().decode(errors="replace"):
                starts.append(int(d.name))
        except OSError:
            continue
    assert starts, ray_head
    deadline = time.monotonic() + 120  # on a loaded machine the raylet may listen a while after the dashboard answers
    while True:
        sockets = listening(set().union(*(descendants(p) for p in starts)))
        if {"gcs_server", "raylet"} <= {name for _, _, name in sockets} or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert {"gcs_server", "raylet"} <= {name for _, _, name in sockets}, sockets
    # Ray's own servers; its workers ("ray::<actor>") run the tests' code, whose sockets (torch.distributed's store,
    # gloo) are that code's, not the cluster's
    ray_own = [s for s in sockets if not s[2].startswith("ray::")]
    assert [s for s in ray_own if s[0] != "127.0.0.1"] == [], ray_own
    for headers, code in (({}, 401), ({"Authorization": f"Bearer {os.environ['RAY_AUTH_TOKEN']}"}, 200)):
        try:
            with urllib.request.urlopen(urllib.request.Request(ray_head.dashboard_url + "/api/jobs/", headers=headers),
                                        timeout=30) as r:
                got = r.status
        except urllib.error.HTTPError as e:
            got = e.code
        assert got == code, (headers.keys(), got)
