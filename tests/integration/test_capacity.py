"""The process-starting half of tests/unit/test_capacity.py (the tier rule: tests/plugins/tiers.py)."""
from __future__ import annotations
import json
import math
import subprocess
import sys
from app.loadgen.spec import SLO, CapacitySearch, RampSpec
from tests.unit.test_capacity import DEMO, DEMO_RIG


def test_find_capacity_on_the_simulated_rig(tmp_path):
    """`vllm-dyno ramp --find-capacity` against the simulated 8× RTX 4090 with Llama-3-70B
    AWQ (the demo; 20× time): the capacity's level met the SLO, the next probed level
    broke it, ≥ 100 requests behind every p99 judged."""
    from app.run.controller import LaunchTarget, RunController

    ctl = RunController()
    try:
        assert ctl.launch(LaunchTarget("sim", DEMO, sim_args=DEMO_RIG, telemetry=False)) == []
        assert ctl.wait_ready(60), ctl.failure_text
        out = tmp_path / "cap.json"
        r = subprocess.run([sys.executable, "-m", "app.cli", "ramp", "--url", ctl.url, "--find-capacity",
                            "--start", "4", "--slo-ttft-p99", "2", "--slo-tpot-p99", "0.1",
                            "--prompt-tokens", "512", "--output-tokens", "128", "--json", str(out), "--no-store"],
                           capture_output=True, text=True, timeout=600)
    finally:
        ctl.stop()
        ctl.close()
    assert r.returncode == 0, r.stdout + r.stderr
    cap = json.loads(out.read_text())["capacity"]
    levels = cap["levels"]
    met = [lv for lv in levels if lv["met"]]
    broke = [lv for lv in levels if not lv["met"]]
    assert cap["users"] == max(lv["users"] for lv in met) and cap["users"] >= 4
    print(r.stdout[-2500:])
    nxt = min(lv["users"] for lv in broke if lv["users"] > cap["users"])
    # bisected to the resolution, rounded up to whole users (app.loadgen.capacity.resolved)
    assert nxt - cap["users"] <= max(1, math.ceil(0.1 * cap["users"] - 1e-9))
    # every level judged on its request floor, or stopped once its verdict was decided
    assert all(not lv["few_requests"] for lv in levels), [(lv["users"], lv["requests"]) for lv in levels]
    assert cap["ttft_p99"] <= 2.0 and cap["tpot_p99"] <= 0.1 and cap["limited_by"]
    assert cap["users_low"] <= cap["users"] <= cap["users_high"]
    verdict = json.loads(out.read_text())["verdict"]
    assert verdict["users"] == cap["users"] and verdict["sentence"] in r.stdout
    assert verdict["sentence"].startswith(f"8× RTX 4090 (sim) serves {cap['users']:g} concurrent users")
    for key in ("users", "users_low", "users_high", "output_tps", "ttft_p99", "tpot_p99", "requests", "limited_by",
                "sentence", "levels"):
        assert key in cap
    # every probed level carries the server's own figures over its window (issue 20, item 6)
    steps = json.loads(out.read_text())["steps"]
    assert steps and all(s["server"] and s["server"]["ttft_count"] > 0 for s in steps)
    assert "the server's own figures (/metrics):" in r.stdout


def test_cli_refuses_a_search_without_an_slo():
    r = subprocess.run([sys.executable, "-m", "app.cli", "ramp", "--find-capacity"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "needs an SLO" in r.stderr and "--slo-ttft-p99" in r.stderr
    r = subprocess.run([sys.executable, "-m", "app.cli", "ramp", "--levels", "1,2", "--repeat", "3"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--find-capacity" in r.stderr


def test_a_search_level_measures_once_each_user_has_finished_a_request():
    """The first requests of a closed-loop level go out together; a search level's
    window opens only when each of its users has finished one (the start-up burst is
    warm-up), and the requests judged are those sent after."""
    from app.loadgen.generator import run_ramp
    from tests.loadgen_server import Script, ScriptedServer

    with ScriptedServer(Script(ttft=0.3, itl=0.01)) as srv:
        spec = RampSpec(url=srv.url, model="scripted", levels=[4], step_seconds=2.0, prompt_tokens=8,
                        output_tokens=10, length_spread=0, settle=True)
        res = run_ramp(spec, timeout=60)
    st = res.steps[0]
    first = sorted(res.records, key=lambda r: r.t_start)[:4]  # the burst: sent together at the level's start
    assert max(r.t_start for r in first) - min(r.t_start for r in first) < 0.1
    assert st.window_start >= min(r.t_end for r in first) - 1e-6  # not before a user finished its first request
    assert st.window_start >= sorted(r.t_end for r in res.records)[3] - 0.05  # …and all four had
    assert st.n_measured == sum(1 for r in res.records if r.t_start >= st.window_start) > 0
    assert all(r.t_start < st.window_start for r in first)
    assert spec.settles and not RampSpec(levels=[1]).settles
    assert RampSpec(search=CapacitySearch(), slo=SLO(ttft_p99=1)).settles
