"""Where a command's CPU goes, by kind of process: run it and sample every process on the machine meanwhile.

    .venv/bin/python -m benchmarks.tier_cpu_profile [--out bench_out/tier_cpu.json] -- .venv/bin/python -m pytest -q -n 2 --dist loadfile

On a two-core machine the test tier keeps both cores busy throughout (dozens of runnable processes), so a test's wall
time is mostly its wait for a core, and only less CPU work makes the tier faster. This says which work: every
process's user + system CPU (/proc/PID/stat, read every --interval seconds, the last reading kept; a process that lives
less than one interval is missed), grouped by what it is: the pytest workers, Ray workers (actors included), CLI runs,
SGLang servers and schedulers, spawned children (torch and megatron ranks), and Ray's and MLflow's own servers.
Processes already running when the command starts are left out. The JSON holds each process's command and CPU.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

HZ = os.sysconf("SC_CLK_TCK")


def kind(cmd: str, comm: str) -> str:
    if cmd.startswith("[pytest-xdist") or "sys.stdin.readline()" in cmd:  # its title, or execnet's bootstrap before it
        return "pytest-xdist worker (the tests that run in-process)"
    if "spawn_main" in cmd:
        return "spawned child (multiprocessing: torch / megatron ranks)"
    if "sglang.launch_server" in cmd:
        return "SGLang server (its main process)"
    if comm.startswith("sglang::"):
        return f"SGLang {comm.split('::', 1)[1]}"
    if "sglang_router" in cmd:
        return "sglang-router"
    if "megatron_cpu.cli" in cmd or "-m slime_hydra" in cmd or "bin/slime-hydra" in cmd:
        return "CLI run"
    if "default_worker.py" in cmd or "setup_worker.py" in cmd or comm.startswith("ray::"):
        return "Ray worker (actors and tasks)"
    for part, name in (("raylet", "Ray raylet"), ("gcs_server", "Ray GCS"), ("log_monitor", "Ray log monitor"),
                       ("dashboard", "Ray dashboard and agent"), ("runtime_env", "Ray runtime-env agent"),
                       ("monitor.py", "Ray monitor"), ("mlflow", "MLflow server"), ("pytest", "pytest")):
        if part in cmd:
            return name
    return f"other: {comm}"


def snapshot() -> dict[tuple[str, str], tuple[float, str, str]]:
    """(pid, start time) -> (CPU seconds, command, comm) of every process readable now."""
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            comm, fields = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, ValueError):
            continue
        out[(pid, fields[19])] = ((int(fields[11]) + int(fields[12])) / HZ, cmd[:400], comm)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench_out/tier_cpu.json")
    p.add_argument("--interval", type=float, default=2.0)
    p.add_argument("command", nargs=argparse.REMAINDER)
    a = p.parse_args()
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not command:
        sys.exit("usage: python -m benchmarks.tier_cpu_profile [--out FILE] -- COMMAND ...")
    before = set(snapshot())
    seen: dict[tuple[str, str], tuple[float, str, str]] = {}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            for key, row in snapshot().items():
                if key not in before:
                    seen[key] = row
            done.wait(a.interval)

    sampler = threading.Thread(target=sample, daemon=True)
    t0 = time.monotonic()
    sampler.start()
    rc = subprocess.call(command)
    wall = time.monotonic() - t0
    done.set()
    sampler.join()
    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for cpu, cmd, comm in seen.values():
        totals[kind(cmd, comm)][0] += cpu
        totals[kind(cmd, comm)][1] += 1
    cpu_all = sum(t for t, _ in totals.values())
    print(f"\n{wall:.0f} s wall, {cpu_all:.0f} CPU-seconds in {len(seen)} processes "
          f"({cpu_all / (wall * os.cpu_count()):.0%} of {os.cpu_count()} cores); exit {rc}")
    for name, (cpu, n) in sorted(totals.items(), key=lambda kv: -kv[1][0]):
        if cpu >= 1:
            print(f"{cpu:8.0f} s {cpu / cpu_all:5.1%} {n:5d} processes  {name}")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"wall_s": wall, "rc": rc, "processes": [
        {"cpu_s": cpu, "kind": kind(cmd, comm), "cmd": cmd} for cpu, cmd, comm in seen.values()]}))
    sys.exit(rc)


if __name__ == "__main__":
    main()
