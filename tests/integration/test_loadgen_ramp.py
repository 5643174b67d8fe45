"""The load generator in its own process against a real scripted streaming server."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from app.loadgen.generator import LoadGenerator, run_ramp
from app.loadgen.spec import SLO, RampSpec
from app.store import RunStore
from tests.conftest import ROOT
from tests.loadgen_server import Script, ScriptedServer


def spec(srv, **kw) -> RampSpec:
    base = dict(url=srv.url, model="scripted", levels=[1], step_seconds=1.0, prompt_tokens=8, output_tokens=10,
                length_spread=0)  # exact lengths: these tests time known token counts
    base.update(kw)
    return RampSpec(**base)


def errors_ms(res, srv, ttft, itl):
    """Client-measured TTFT/ITL minus the scripted values, ms: (TTFT median, |TTFT| p99,
    ITL median, |ITL| p99, TTFT median minus the server's own lateness, n)."""
    ok = [r for r in res.records if r.ok and r.t_start >= res.steps[0].window_start]
    t = np.array([r.ttft for r in ok]) - ttft
    i = np.concatenate([r.itl for r in ok]) - itl
    server_late = np.median([w[0] - t_in for t_in, w in srv.timings if w]) - ttft
    return (np.median(t) * 1e3, np.percentile(np.abs(t), 99) * 1e3, np.median(i) * 1e3,
            np.percentile(np.abs(i), 99) * 1e3, (np.median(t) - server_late) * 1e3, len(ok))


@pytest.mark.serial  # judges the client's timing: alone
def test_timing_accuracy_at_concurrency_1():
    """TTFT and ITL as the client measures them, against a server scripted to 100 ms / 20 ms:
    within 2 ms (medians). The TTFT bound is on the client's own share (measured minus the
    scripted server's own lateness, as in the 256-stream test); the total once read
    2.02 ms on a busy CI machine. Measured never early. A hiccup may miss once; two fail."""
    for attempt in (1, 2):
        with ScriptedServer(Script(ttft=0.1, itl=0.02)) as srv:
            res = run_ramp(spec(srv, step_seconds=3, warmup_seconds=0.5, output_tokens=20), timeout=60)
            tm, tp99, im, ip99, own, n = errors_ms(res, srv, 0.1, 0.02)
        assert res.status == "done", res.stop_reason
        print(f"\nc=1 (measurement {attempt}): {n} requests, TTFT error median {tm:.2f} ms (client's own {own:.2f}) "
              f"p99 {tp99:.2f} ms; ITL error median {im:.2f} ms p99 {ip99:.2f} ms")
        if abs(own) < 2.0 and abs(im) < 2.0:
            break
    assert tm >= 0 and abs(own) < 2.0 and abs(im) < 2.0


@pytest.mark.serial  # judges the client's timing: alone
def test_256_in_flight_and_timing_accuracy():
    """aiohttp's default pool (100) must not cap the level: exactly 256 streams at once.

    On this shared 2-core machine the scripted server itself runs late under 256
    streams; the bound (5 ms) is checked on the client's own share of the TTFT error
    (measured median minus the server's median lateness), the ITL median directly.
    """
    for attempt in (1, 2):  # a hiccup of this shared VM can miss once; two misses fail
        with ScriptedServer(Script(ttft=0.1, itl=0.1)) as srv:
            res = run_ramp(spec(srv, levels=[256], step_seconds=3, warmup_seconds=1.5, output_tokens=(5, 15)),
                           timeout=90)
            assert srv.max_in_flight == 256
            tm, tp99, im, ip99, own, n = errors_ms(res, srv, 0.1, 0.1)
        assert res.status == "done", res.stop_reason
        st = res.steps[0]
        assert st.max_in_flight == 256 and st.failures == {}
        print(f"\nc=256 (measurement {attempt}): {n} requests, TTFT error median {tm:.2f} ms (client's own "
              f"{own:.2f}) p99 {tp99:.2f} ms; ITL error median {im:.2f} ms p99 {ip99:.2f} ms")
        if abs(own) < 5.0 and abs(im) < 5.0:
            break
    assert abs(own) < 5.0 and abs(im) < 5.0


def test_closed_loop_keeps_level_and_store_gets_everything(tmp_path):
    """Through the run controller (attach mode), the only writer to the run store."""
    from app.config import ServerConfig
    from app.run.controller import LaunchTarget, RecordSpec, RunController

    store = RunStore(tmp_path / "runs.sqlite")
    with ScriptedServer(Script(ttft=0.02, itl=0.005)) as srv:
        ctl = RunController(store=store)
        ctl.launch(LaunchTarget("attach", ServerConfig(model="m"), attach_url=srv.url, telemetry=False))
        res = ctl.ramp(spec(srv, levels=[1, 2, 4], step_seconds=1.0), record=RecordSpec(name="t"), timeout=60)
        ctl.close()
    rid = res.run_id
    assert rid is not None and store.get_run(rid)["status"] == "done"
    assert res.status == "done" and [s.max_in_flight for s in res.steps] == [1, 2, 4]
    # throughput scales with the level (the scripted server has no batching limit)
    tps = [s.output_tps for s in res.steps]
    assert tps[1] > 1.6 * tps[0] and tps[2] > 1.6 * tps[1]
    assert all(r.tokens_source == "server_usage" and r.output_tokens == 10 for r in res.records)
    assert len(store.requests(rid)) == len(res.records)
    assert [lv["level"] for lv in store.levels(rid)] == [1, 2, 4]
    store.close()


def test_request_count_mode_and_chat():
    with ScriptedServer(Script(ttft=0.01, itl=0.002, role_chunk=True)) as srv:
        res = run_ramp(spec(srv, levels=[3], step_seconds=None, requests_per_level=12,
                            endpoint="/v1/chat/completions"), timeout=60)
    st = res.steps[0]
    assert res.status == "done" and st.stop_reason == "count" and st.n_measured == 12 == st.n_ok
    assert all(r.ttft >= 0.009 for r in res.records)  # the role-only chunk is not the first token


def test_rate_mode_poisson():
    with ScriptedServer(Script(ttft=0.02, itl=0.01)) as srv:
        res = run_ramp(spec(srv, mode="rate", levels=[20.0], step_seconds=4, max_concurrency=3), timeout=60)
        assert srv.max_in_flight <= 3
    st = res.steps[0]
    # 3 slots × (0.02 + 9 × 0.01 s) ≈ 27 req/s capacity > 20 req/s asked: arrivals rule
    assert res.status == "done" and 12 <= st.rps <= 28, st.rps


def test_abort_keeps_completed_records():
    with ScriptedServer(Script(ttft=0.01, itl=0.01)) as srv:
        gen = LoadGenerator(spec(srv, levels=[4], step_seconds=60)).start()
        deadline = time.monotonic() + 30
        while len(gen.result.records) < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        t = time.monotonic()
        gen.abort()
        res = gen.wait(15)
        took = time.monotonic() - t
        gen.stop()
    assert took < 5 and gen.proc.poll() is not None
    assert res.status == "aborted" and len(res.records) > 10 and all(r.ok for r in res.records)
    assert res.steps and res.steps[0].stop_reason == "aborted"


def test_http_400_counted_with_vllm_message():
    with ScriptedServer(Script(max_model_len=50)) as srv:
        res = run_ramp(spec(srv, levels=[2, 4], prompt_tokens=100), timeout=60)
    assert res.status == "failed" and len(res.steps) == 1
    st = res.steps[0]
    assert set(st.failures) == {"http_400"} and st.failure_rate == 1.0
    assert "maximum context length is 50 tokens" in res.records[0].error
    assert "failure rate" in res.stop_reason


def test_midstream_error_disconnect_and_timeout_statuses():
    with ScriptedServer(Script(error_after=2)) as srv:
        r1 = run_ramp(spec(srv, step_seconds=None, requests_per_level=2, max_failure_rate=1.0), timeout=60)
    with ScriptedServer(Script(drop_after=2, itl=0.01)) as srv:
        r2 = run_ramp(spec(srv, step_seconds=None, requests_per_level=2, max_failure_rate=1.0), timeout=60)
    with ScriptedServer(Script(hold=3.0)) as srv:
        r3 = run_ramp(spec(srv, step_seconds=None, requests_per_level=1, max_failure_rate=1.0,
                           request_timeout=0.5), timeout=60)
    assert {r.status for r in r1.records} == {"server_error"} and "EngineCore" in r1.records[0].error
    assert {r.status for r in r2.records} == {"disconnected"}
    assert {r.status for r in r3.records} == {"timeout"}
    assert r3.records[0].e2e == pytest.approx(0.5, abs=0.3)


def test_slo_stops_the_ramp():
    with ScriptedServer(Script(ttft=0.05, itl=0.005)) as srv:
        res = run_ramp(spec(srv, levels=[1, 2, 4], slo=SLO(ttft_p99=0.01)), timeout=60)
    assert res.status == "slo_broken" and len(res.steps) == 1 and "ttft_p99" in res.stop_reason
    assert res.steps[0].goodput_rps == 0 and res.steps[0].rps > 0


def test_wrong_model_is_one_clear_error_before_any_load():
    with ScriptedServer() as srv:
        res = run_ramp(spec(srv, model="llama-70b"), timeout=30)
        assert srv.n_requests == 0
    assert res.status == "error" and not res.records
    assert "'llama-70b' is not served" in res.error and "scripted" in res.error


def test_unreachable_url_fails_fast():
    t = time.monotonic()
    res = run_ramp(RampSpec(url="http://127.0.0.1:9", levels=[1]), timeout=30)
    assert time.monotonic() - t < 15
    assert res.status == "error" and "cannot reach http://127.0.0.1:9" in res.error


SERVER_PROC = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    from tests.loadgen_server import Script, ScriptedServer
    with ScriptedServer(Script(ttft=0.02, itl=0.01)) as s:
        print(s.port, flush=True)
        time.sleep(600)
""")


def test_server_killed_mid_ramp_cli_exits_nonzero(dyno_home):
    """The CLI against a server process that is SIGKILLed during the ramp: a server failure
    (its /health no longer answers), with the ramp's own stop reason."""
    srv = subprocess.Popen([sys.executable, "-c", SERVER_PROC.format(root=str(ROOT))], stdout=subprocess.PIPE, text=True)
    try:
        port = int(srv.stdout.readline())
        cli = subprocess.Popen([sys.executable, "-m", "app.cli", "ramp", "--url", f"http://127.0.0.1:{port}",
                                "--levels", "2,4,8", "--step-seconds", "4", "--prompt-tokens", "8",
                                "--output-tokens", "20"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               cwd=ROOT)
        # kill the server once the ramp has completed a few requests (polled from the run
        # store, which the CLI writes as records arrive) — not after a fixed sleep, which a
        # loaded machine can make too short
        import sqlite3

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with sqlite3.connect(dyno_home / "runs.sqlite", timeout=1) as db:
                    if db.execute("SELECT COUNT(*) FROM requests WHERE status = 'ok'").fetchone()[0] > 5:
                        break
            except sqlite3.Error:
                pass
            time.sleep(0.2)
        srv.kill()
        srv.wait(10)
        out, err = cli.communicate(timeout=60)
    finally:
        for p in (srv, locals().get("cli")):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(10)
    assert cli.returncode == 1, (out, err)
    # the failure-rate limit: the Settings' (the ramp gives none of its own)
    from app.settings import DEFAULT_MAX_FAILURE_RATE

    assert f"failure rate passed {DEFAULT_MAX_FAILURE_RATE:.0%}" in err and "disconnected" in err
    # the server is gone, not only slow: the ramp says so (issue 16, item 9)
    assert (f"ramp server_failed: the server at http://127.0.0.1:{port} was ready, then it stopped answering "
            "(/health too): it died or cannot be reached") in out
    with RunStore() as store:
        run = store.list_runs()[0]
        assert run["status"] == "server_failed"
        reqs = store.requests(run["id"])
        assert sum(r["status"] == "ok" for r in reqs) > 5  # completed records kept
        assert any(r["status"] == "disconnected" for r in reqs)


def test_a_ramp_that_never_started_leaves_no_run(dyno_home):
    """A failed pre-flight check (nothing listening) is an error to the user, not a run in
    the history."""
    import subprocess
    import sys

    from app.store import RunStore

    r = subprocess.run([sys.executable, "-m", "app.cli", "ramp", "--url", "http://127.0.0.1:9", "--levels", "1",
                        "--step-seconds", "1"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "cannot reach http://127.0.0.1:9" in r.stderr, r.stderr
    with RunStore() as store:
        assert store.list_runs() == []


def test_ramp_input_errors_name_the_option():
    import subprocess
    import sys

    from app.cli.ramp import flag_of

    assert flag_of(("step_seconds",)) == "--step-seconds"
    assert flag_of(("slo", "ttft_p99")) == "--slo-ttft-p99"
    assert flag_of(("levels", 0)) == "--levels" and flag_of(()) == "ramp"
    r = subprocess.run([sys.executable, "-m", "app.cli", "ramp", "--url", "http://127.0.0.1:9", "--levels", "1",
                        "--step-seconds", "-1", "--no-store"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "argument --step-seconds: -1: give a number of seconds > 0" in r.stderr, r.stderr


def test_a_worker_whose_ramp_ended_exits_cleanly():
    """The worker's ramp ends while the app still holds its stdin open (the app closes it
    only after the last frame and the exit): the worker exits 0. Before, its stdin-watch
    thread was blocked inside sys.stdin's BufferedReader, whose lock CPython's shutdown must
    take: "Fatal Python error: _enter_buffered_busy", SIGABRT, a core file per ramp."""
    with ScriptedServer(Script(ttft=0.01, itl=0.002)) as srv:
        gen = LoadGenerator(spec(srv, levels=[2], step_seconds=None, requests_per_level=6)).start()
        res = gen.wait(60)
        gen.stop()
    assert res.status == "done", res.error
    assert gen.proc.returncode == 0, f"the worker exited with {gen.proc.returncode}"
