"""The agent path's overhead against local telemetry (issue 21, "Done when").

One host's telemetry (the host sampler: CPU, memory; the cards too where NVML works)
reaches the session three ways; each runs ``--seconds`` at ``--interval`` s and prints,
side by side:

- **local**: :class:`app.telemetry.host_sampler.HostSampler` in the app's own process
  (how a one-host rig is sampled);
- **agent (pipe)**: ``vllm-dyno agent`` started as a local child (``Host()``, no SSH):
  the same sampler in the agent, its samples as JSON lines over the pipe
  (:class:`app.hosts.link.AgentLink`), put on the session clock by the measured offset;
- **agent (SSH)**: the agent on a "host" of the network-namespace test bed
  (tests/netns.py: a veth pair, an SSH server in the namespace) reached through asyncssh
  — how a remote host is sampled. Needs root (``ip netns``); skipped with the reason
  otherwise.

Figures per path: sampling rounds received per second (against 1/interval), the delay
from a round's stamp to its arrival in the app (session-clock s: median and max), the
CPU time the app's process spent per round (its own threads: sampler or asyncio reader,
the JSON decoding), the agent's CPU per round (where there is one), and bytes received
per round (the JSON lines, measured at the link). Ratios to the local path are printed
in one table.

Usage: ``.venv/bin/python benchmarks/agent_telemetry.py [--seconds 20] [--interval 0.1]``
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.clock import SessionClock  # noqa: E402
from app.hosts.link import AgentLink, SshOptions  # noqa: E402
from app.hosts.spec import Host  # noqa: E402
from app.telemetry.host_sampler import HostSampler  # noqa: E402
from app.telemetry.series import Sample  # noqa: E402


def cpu_s(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


class Tally:
    """Rounds received: their count, each round's delay (arrival − newest stamp, session s)."""

    def __init__(self, clock: SessionClock) -> None:
        self.clock = clock
        self.rounds = 0
        self.delays: list[float] = []

    def __call__(self, batch: list[Sample]) -> None:
        if batch:
            self.rounds += 1
            self.delays.append(self.clock.now() - max(s.t for s in batch))


def local(seconds: float, interval: float) -> dict:
    clock = SessionClock()
    me = psutil.Process()
    tally = Tally(clock)
    s = HostSampler(interval=interval, clock=clock)
    s.subscribe(tally)
    c0 = cpu_s(me)
    s.start()
    time.sleep(seconds)
    s.stop()
    return {"path": "local", "rounds": tally.rounds, "seconds": seconds, "delays": tally.delays,
            "app_cpu": cpu_s(me) - c0, "agent_cpu": None, "bytes": None}


async def through_agent(host: Host, ssh: SshOptions | None, seconds: float, interval: float, name: str) -> dict:
    clock = SessionClock()
    me = psutil.Process()
    link = await AgentLink.open(host, clock=clock, ssh=ssh)
    try:
        agent = psutil.Process(link.hello["pid"])  # one kernel on the bed too: its pid is visible here
        tally = Tally(clock)
        link.subscribe(tally)
        b0 = link.bytes_received
        c0, a0 = cpu_s(me), cpu_s(agent)
        await link.watch(interval=interval, gpu_interval=interval)
        await asyncio.sleep(seconds)
        c1, a1, b1 = cpu_s(me), cpu_s(agent), link.bytes_received
        off = link.offset.describe()
    finally:
        await link.close()
    return {"path": name, "rounds": tally.rounds, "seconds": seconds, "delays": tally.delays,
            "app_cpu": c1 - c0, "agent_cpu": a1 - a0, "bytes": b1 - b0, "offset": off}


def over_ssh(seconds: float, interval: float) -> dict | str:
    from tests import netns
    why = netns.unavailable()
    if why:
        return f"agent (SSH): skipped — {why}"
    bed = netns.Bed.make(1)
    try:
        h = bed.hosts[0]
        opts = SshOptions(known_hosts=str(bed.known_hosts), client_keys=(str(bed.client_key),), use_agent=False,
                          connect_timeout=10.0, config=())
        host = Host(ssh=h.destination, dyno=f"{sys.executable} -m app.cli")
        return asyncio.run(through_agent(host, opts, seconds, interval, "agent (SSH)"))
    finally:
        bed.close()


def row(r: dict, base: dict) -> str:
    n = max(1, r["rounds"])
    d = sorted(r["delays"]) or [float("nan")]
    app_ms = r["app_cpu"] / n * 1e3
    ratio = app_ms / max(1e-9, base["app_cpu"] / max(1, base["rounds"]) * 1e3)
    agent = "—" if r["agent_cpu"] is None else f"{r['agent_cpu'] / n * 1e3:8.2f}"
    by = "—" if r["bytes"] is None else f"{r['bytes'] / n:7.0f}"
    return (f"{r['path']:<13} {r['rounds'] / r['seconds']:9.2f} {statistics.median(d) * 1e3:10.2f} {d[-1] * 1e3:9.2f} "
            f"{app_ms:11.3f} {ratio:8.2f}× {agent:>9} {by:>9}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--interval", type=float, default=0.1)
    a = ap.parse_args()
    rows = [local(a.seconds, a.interval),
            asyncio.run(through_agent(Host(), None, a.seconds, a.interval, "agent (pipe)"))]
    ssh = over_ssh(a.seconds, a.interval)
    notes = []
    if isinstance(ssh, str):
        notes.append(ssh)
    else:
        rows.append(ssh)
    print(f"one host's telemetry for {a.seconds:g} s at {a.interval:g} s ({1 / a.interval:g} rounds/s asked)")
    print(f"{'path':<13} {'rounds/s':>9} {'delay p50':>10} {'delay max':>9} {'app ms/rnd':>11} {'vs local':>9} "
          f"{'agent ms':>9} {'bytes/rnd':>9}")
    for r in rows:
        print(row(r, rows[0]))
    for r in rows:
        if r.get("offset"):
            print(f"  {r['path']}: {r['offset']}")
    for n in notes:
        print(n)


if __name__ == "__main__":
    main()
