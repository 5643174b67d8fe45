"""The hosts of a rig (issue 21): the profile's ``hosts:`` block, the agent's line protocol
and clock-offset arithmetic, and the agent itself as a local process (``localhost``: the
same agent and protocol as over SSH, without SSH; the SSH path is tests/test_multinode.py)."""
from __future__ import annotations

import asyncio
import math
import os
import sys
import time
import urllib.request

import psutil
import pytest

from app import __version__
from app.config import ServerConfig
from app.hosts.link import AgentLink, HostError
from app.hosts.protocol import (ClockSample, ProtocolError, best_offset, clock_sample, decode, encode,
                                samples_from_wire, samples_to_wire)
from app.hosts.spec import Host, hosts_from, parse_destination
from app.profiles.io import ProfileError, parse_profile
from app.telemetry.series import Sample

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---- the hosts block ---------------------------------------------------------------------

@pytest.mark.parametrize("text, parsed", [
    ("dyno@10.0.0.11", ("dyno", "10.0.0.11", None)),
    ("dyno@10.0.0.11:2222", ("dyno", "10.0.0.11", 2222)),
    ("gpu-box.lan", (None, "gpu-box.lan", None)),
    ("root@[fd00::7]:22", ("root", "fd00::7", 22)),
    ("fd00::7", (None, "fd00::7", None)),
    ("localhost", (None, "localhost", None)),
])
def test_destinations(text, parsed):
    assert parse_destination(text) == parsed


@pytest.mark.parametrize("text, says", [
    ("", "empty"), ("u@h:0", "not 1–65535"), ("u@h:ssh", "not 1–65535"), ("-oProxyCommand=x", "user@host"),
    ("u@bad_host!", "neither a host name"), ("u@h h", "user@host"), ("bad user@h", "user@host"),
    ("u@[fd00::1", "brackets"),
])
def test_bad_destinations_say_the_form(text, says):
    with pytest.raises(ValueError) as e:
        parse_destination(text)
    assert says in str(e.value)


def test_profile_hosts_block_round_trip():
    p = parse_profile("name: two hosts\nserver: {model: m}\nhosts:\n  - ssh: dyno@10.0.0.11\n    gpus: [0, 1]\n"
                      "    python: /opt/vllm/bin/python\n  - dyno@10.0.0.12:2222\n")
    assert [h.ssh for h in p.hosts] == ["dyno@10.0.0.11", "dyno@10.0.0.12:2222"]
    assert p.hosts[0].gpu_indices() == [0, 1] and p.hosts[1].port == 2222 and p.hosts[0].port == 22
    assert p.hosts[0].reach == "10.0.0.11" and not p.hosts[0].is_local
    assert p.to_data()["hosts"] == [{"ssh": "dyno@10.0.0.11", "python": "/opt/vllm/bin/python", "gpus": [0, 1]},
                                    {"ssh": "dyno@10.0.0.12:2222"}]
    assert parse_profile("name: one host\nserver: {model: m}\n").hosts == []  # nothing changes for one host
    assert "hosts" not in parse_profile("name: one host\nserver: {model: m}\n").to_data()


@pytest.mark.parametrize("key", ["password", "passphrase", "private_key", "key", "ssh_pass", "token"])
def test_a_password_in_a_host_is_refused_naming_it(key):
    with pytest.raises(ProfileError) as e:
        parse_profile(f"name: p\nserver: {{model: m}}\nhosts:\n  - ssh: u@h1\n    {key}: hunter2\n")
    assert e.value.key == f"hosts[0].{key}" and "ssh-add" in str(e.value)
    assert "hunter2" not in str(e.value)


def test_hosts_errors_name_the_entry():
    with pytest.raises(ValueError, match=r"hosts\[1\].ssh: SSH destination 'u@h:99999'"):
        hosts_from(["a@h1", "u@h:99999"])
    with pytest.raises(ValueError, match=r"hosts\[1\]: b@h1:22 is the same machine as hosts\[0\]"):
        hosts_from(["a@h1", "b@h1:22"])
    with pytest.raises(ValueError, match=r"hosts\[0\].gpus"):
        hosts_from([{"ssh": "a@h1", "gpus": 0}])


def test_agent_command_is_quoted_for_the_remote_shell():
    assert Host(ssh="u@h").agent_command() == "vllm-dyno agent"
    assert Host(ssh="u@h", dyno="'/opt/my dyno/bin/vllm-dyno'").agent_command() == "'/opt/my dyno/bin/vllm-dyno' agent"
    assert Host().is_local and Host().reach == "127.0.0.1"


# ---- the protocol -----------------------------------------------------------------------

def test_lines_and_samples_round_trip():
    msg = {"op": "samples", "samples": samples_to_wire([Sample(1.5, "gpu0", "power_w", 300.0),
                                                        Sample(2.0, "host", "cpu_pct", math.nan)])}
    line = encode(msg)
    assert line.endswith(b"\n") and line.count(b"\n") == 1 and b"NaN" not in line
    back = samples_from_wire(decode(line)["samples"], shift=-1.0)
    assert back[0] == Sample(0.5, "gpu0", "power_w", 300.0) and math.isnan(back[1].value)
    for bad in (b"not json", b"[1, 2]", b'{"no": "op"}'):
        with pytest.raises(ProtocolError):
            decode(bad)
    with pytest.raises(ProtocolError):
        samples_from_wire([[1.0, "x"]])


def test_clock_offset_ntp_arithmetic():
    # the agent's clock is 5 s ahead; 2 ms out, 6 ms back, the agent holds it 1 ms (RFC 5905 §8)
    s = clock_sample(100.000, 105.002, 105.003, 100.009)
    assert s.delay == pytest.approx(0.008)
    assert s.offset == pytest.approx(5.0 - 0.002)  # wrong by (out − back) / 2, within delay / 2
    assert abs(s.offset - 5.0) <= s.delay / 2
    best = best_offset([s, ClockSample(200.0, 205.0005, 205.0006, 200.0011)])
    assert best.rtt_s == pytest.approx(0.001) and best.offset_s == pytest.approx(5.0, abs=best.bound_s)
    assert best.exchanges == 2 and best.rtt_median_s == pytest.approx(0.0045)
    with pytest.raises(ValueError):
        clock_sample(1.0, 2.0, 1.5, 3.0)
    with pytest.raises(ValueError):
        best_offset([])


# ---- the agent as a local process -----------------------------------------------------

def _run(coro, timeout: float = 120.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def _gone(pids: list[int], pgid: int | None) -> bool:
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    group = []
    if pgid is not None:
        for p in psutil.process_iter():
            try:
                if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                    group.append(p.pid)
            except (OSError, psutil.Error):
                pass
    return not alive and not group


def test_local_agent_hello_clock_and_telemetry():
    async def go():
        link = await AgentLink.open(Host())
        try:
            h = link.hello
            assert h["version"] == __version__ and h["protocol"] == 1 and h["pid"] != os.getpid()
            assert h["cpu"]["cores"] >= 1 and h["cpu"]["memory_total_gib"] > 0
            assert (h["cards"] == []) == (h["nvml"] is not None)  # NVML's cards, or why there are none
            off = link.offset
            assert off.exchanges == 8 and abs(off.offset_s) <= off.bound_s + 1e-4  # one kernel, one clock
            got: list[Sample] = []
            link.subscribe(got.extend)
            before = link.clock.now()
            await link.watch(interval=0.2)
            await asyncio.sleep(1.0)
            after = link.clock.now()
            names = {(s.source, s.name) for s in got}
            assert ("host", "cpu_pct") in names and ("host", "memory_available_bytes") in names
            assert all(before - 0.05 <= s.t <= after + 0.05 for s in got)  # on the session clock
        finally:
            await link.close()
        assert not psutil.pid_exists(h["pid"]) or psutil.Process(h["pid"]).status() == psutil.STATUS_ZOMBIE
    _run(go())


def test_other_version_is_refused_naming_both():
    fake = f"{sys.executable} {os.path.join(ROOT, 'tests', 'fake_agent.py')} --version 0.0.1"

    async def go():
        with pytest.raises(HostError) as e:
            await AgentLink.open(Host(dyno=fake))
        return str(e.value)
    msg = _run(go())
    assert "localhost" in msg and "vllm-dyno 0.0.1" in msg and f"vllm-dyno {__version__}" in msg


def test_agent_not_installed_says_so():
    async def go():
        with pytest.raises(HostError) as e:
            await AgentLink.open(Host(dyno=f"{sys.executable} -c 'import sys; sys.exit(3)'"))
        return str(e.value)
    msg = _run(go())
    assert "the agent did not start" in msg and "exited with 3" in msg and "hosts[].dyno" in msg


def test_local_agent_launches_the_sim_and_its_server_dies_with_the_agent():
    """The agent launches the simulated rig through the supervisor; the agent SIGKILLed
    (it cannot clean up), its reaper ends the server (issue 21 item 2, issue #2)."""
    async def go():
        link = await AgentLink.open(Host())
        states: list[dict] = []
        link.on_state(states.append)
        launched = await link.launch(ServerConfig(model="Llama-3-8B"), engine="sim",
                                     sim_args=["--sim-gpu", "RTX 4090", "--sim-gpu-count", "1"])
        ready = await link.wait_state("ready", "failed", timeout=90)
        assert ready["state"] == "ready", link.log_lines
        with urllib.request.urlopen(launched["url"] + "/v1/models", timeout=10) as r:
            assert b"Llama-3-8B" in r.read()
        assert any("Uvicorn" in text or "Application startup" in text for _, _, text in link.log_lines) or \
            link.log_lines  # its log lines came back
        pgid, server = launched["pgid"], ready["server_pid"]
        t = time.monotonic()
        os.kill(link.agent_pid, 9)
        while not _gone([link.agent_pid, server], pgid) and time.monotonic() - t < 15:
            await asyncio.sleep(0.05)
        took = time.monotonic() - t
        await link.abort()
        assert _gone([link.agent_pid, server], pgid), f"left after {took:.1f} s"
        return took
    took = _run(go())
    assert took < 10
