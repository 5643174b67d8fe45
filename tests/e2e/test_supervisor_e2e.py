"""Real vLLM (CPU build, tiny model): launch, capacity facts, a completion, stops, faults.

Launch budget: the shared `vllm_server` fixture (tests/conftest.py), the CLI serve with no
other flag then Ctrl-C (1, issue 16), and two launches that fail within seconds (an option
vLLM rejects, a context longer than the model allows). An owner SIGKILLed while vLLM runs
is the kill matrix's app-SIGKILL cell on the real build (tests/e2e/test_kill_matrix_e2e.py)
and, while loading, its cells against the sim (tests/integration/test_kill_matrix.py).
"""
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest

from app.server.procs import group_members
from app.server.supervisor import ServerState, Supervisor
from tests.conftest import ROOT, tiny_server_config



def test_shared_server_capacity_and_completion(vllm_server):
    f = vllm_server.parser.facts
    # 1 GiB of KV space / 1,024 B per token, in whole 16-token blocks
    assert f.kv_cache_tokens == 1_048_576 and f.kv_cache_device == "CPU"
    assert f.max_concurrency is not None and f.max_concurrency_tokens_per_request == 2048
    assert f.max_concurrency == pytest.approx(1_048_576 / 2048, rel=1e-3)
    assert f.version == "0.32.0" and f.ready
    states = [c.state for c in vllm_server.history]
    assert states[:3] == [ServerState.STARTING, ServerState.LOADING, ServerState.READY]
    body = json.dumps({"model": "tiny", "prompt": "The quick brown fox", "max_tokens": 8,
                       "ignore_eos": True}).encode()
    req = urllib.request.Request(vllm_server.url + "/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        out = json.load(r)
    assert out["usage"]["completion_tokens"] == 8
    assert len(group_members(vllm_server.pgid)) >= 2  # API server + engine core (+ reaper)


def test_the_cpu_builds_launch_passes_through_its_phases_in_order(vllm_server):
    """Issue 19, item 3: the phases the CPU build's log (vLLM 0.32.0) shows — it prints no
    "Model loading took" and captures no CUDA graphs; its "Warming up model for the
    compilation" (the compile) comes before its KV cache is sized."""
    ph = vllm_server.launch_phases()
    assert "graphs" not in ph, ph
    need = ["engine", "weights", "profile", "kv_cache", "api", "ready"]
    assert set(need) <= set(ph), ph
    times = [ph[k] for k in need]
    assert times == sorted(times) and times[-1] > 0, ph
    ready_at = next(c.t for c in vllm_server.history if c.state == ServerState.READY)
    assert ph["ready"] <= ready_at - vllm_server.started_t + 1.0


def _failed_launch(tiny_model, vllm_python, **kw):
    sup = Supervisor(tiny_server_config(tiny_model, **kw), python=vllm_python, startup_timeout=300)
    sup.start()
    assert not sup.wait_ready(320)
    assert sup.wait_done(30)
    assert sup.state == ServerState.FAILED
    assert sup.stop() == [] and group_members(sup.pgid) == []
    return sup.failure


@pytest.mark.launches
def test_option_vllm_rejects_fails_with_vllm_message(tiny_model, vllm_python):
    fail = _failed_launch(tiny_model, vllm_python, extra_args=["--swap-space", "4"])
    assert "unrecognized arguments: --swap-space" in fail.reason, fail.reason
    assert "during startup" in fail.reason and fail.log_tail


@pytest.mark.launches
def test_vllm_exiting_during_startup_fails_with_log_tail(tiny_model, vllm_python):
    # the tiny model allows 2048 tokens of context; vLLM refuses a longer max_model_len
    fail = _failed_launch(tiny_model, vllm_python, max_model_len=100_000)
    assert "exited with code" in fail.reason and "during startup" in fail.reason
    assert any("max_model_len" in l or "max_position_embeddings" in l for l in fail.log_tail), fail.log_tail[-10:]


@pytest.mark.launches
def test_cli_serve_with_no_other_flag_starts_on_the_cpu_build_then_ctrl_c(tiny_model):
    """Issue 16 item 1: `vllm-dyno serve --model build/tiny-llama` and nothing else, on a
    machine without a GPU: the CPU build's defaults are chosen and printed before the
    launch (a KV cache size instead of 0.92 of the NUMA node, the in-process executor), the
    launch's phases are printed as vLLM logs them, and the server reaches ready with that
    KV cache. Ctrl-C then stops it: exit 0 and no process of its group left (the reaper,
    a child of the CLI, leads the group)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_ENABLE_V1_MULTIPROCESSING")}
    cmd = [sys.executable, "-m", "app.cli", "serve", "--model", "build/tiny-llama"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env)
    out: list[str] = []
    pgid = None
    deadline = time.monotonic() + 600
    try:
        for line in p.stdout:
            out.append(line)
            if "maximum concurrency" in line or "failed:" in line:
                break
            assert time.monotonic() < deadline, "".join(out)
        text = "".join(out)
        assert "state: ready" in text, text[-4000:]
        assert "launch: loading weights" in text and "launch: starting the API server" in text, text
        chosen = text.index("CPU build of vLLM — chosen for what you did not set")
        assert chosen < text.index("state: loading")
        assert "--distributed-executor-backend uni" in text and "VLLM_ENABLE_V1_MULTIPROCESSING=0" in text
        n = int(re.search(r"VLLM_CPU_KVCACHE_SPACE=(\d+)", text).group(1))
        # the KV cache vLLM made is the size chosen: n GiB / 1,024 B per token
        assert f"CPU KV cache size: {n * 2**30 // 1024:,} tokens" in text, text[-2000:]
        kids = psutil.Process(p.pid).children()
        pgid = os.getpgid(kids[0].pid)
        assert len(group_members(pgid)) >= 2
        p.send_signal(signal.SIGINT)  # Ctrl-C
        rest, _ = p.communicate(timeout=60)
        assert p.returncode == 0, text + rest
        assert "no process of the server group is left" in rest and group_members(pgid) == []
    finally:
        if p.poll() is None:
            p.kill()
        if pgid and group_members(pgid):
            os.killpg(pgid, signal.SIGKILL)
