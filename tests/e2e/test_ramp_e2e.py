"""A real ramp against the shared CPU vLLM (tiny model, max_num_seqs 8): the knee at 8."""
from __future__ import annotations

import pytest

from app.config import ServerConfig
from app.loadgen.spec import RampSpec
from app.run.controller import LaunchTarget, RecordSpec, RunController
from app.store import RunStore
from tests.e2e.conftest import ramp_through_controller


def _knee_checks(res) -> list[str]:
    by = {st.level: st for st in res.steps}
    problems = []
    if not by[8].output_tps > 3 * by[1].output_tps:
        problems.append(f"throughput at 8 ({by[8].output_tps:.0f}) not > 3 × at 1 ({by[1].output_tps:.0f})")
    if not by[16].ttft_p99 > 2 * by[8].ttft_p99:
        problems.append(f"TTFT p99 at 16 ({by[16].ttft_p99:.3f} s) not > 2 × at 8 ({by[8].ttft_p99:.3f} s)")
    if res.knee is None or res.knee.level != 8:
        problems.append(f"knee {res.knee}")
    return problems


def test_ramp_finds_knee_at_max_num_seqs(vllm_server, measured_ramp):
    """Throughput at 8 > 3 × at 1, TTFT p99 at 16 > 2 × at 8, the knee at 8, no failures.

    The shared server runs the in-process executor (see ``tiny_server_config``): with the
    CPU build's default Worker process, EngineCore and Worker busy-wait on 2 cores and
    starved the API server, so TTFT p99 at 8 read 1.2–1.5 s and the knee was lost. A p99
    over a 10 s step still rests on a handful of requests, so the ramp is measured once
    more when the first measurement misses; the second one must meet every criterion.
    The first measurement is the session's ``measured_ramp`` (tests/e2e/conftest.py), which
    the calibration test fits on too.
    """
    assert vllm_server.config.max_num_seqs == 8
    store, results = measured_ramp
    first = _knee_checks(results[0])
    if first:
        print("first measurement missed: " + "; ".join(first) + " — measuring again")
        results.append(ramp_through_controller(vllm_server.url, store))
        second = _knee_checks(results[-1])
        assert not second, (f"knee criteria missed twice: first: {'; '.join(first)}; "
                            f"second: {'; '.join(second)}")


def test_one_rate_level_reports_achieved_vs_offered(vllm_server, tmp_path):
    """Open loop against the real CPU build (issue 20, item 5): one request-rate level of
    2 req/s (gamma gaps, burstiness 2), through the run controller and into the run store:
    the client sends what it draws, the level's achieved rate is near the offered one,
    and the stored level keeps the open-loop figures."""
    store = RunStore(tmp_path / "runs.db")
    url = vllm_server.url
    spec = RampSpec(url=url, model="tiny", mode="rate", levels=[2.0], burstiness=2.0, step_seconds=15,
                    warmup_seconds=1, prompt_tokens=16, output_tokens=16, request_timeout=60)
    ctl = RunController(store=store)
    try:
        ctl.launch(LaunchTarget("attach", ServerConfig(model="tiny"), attach_url=url, attach_model="tiny",
                                telemetry=False))
        res = ctl.ramp(spec, record=RecordSpec(name="e2e rate"), timeout=120)
    finally:
        ctl.stop()
    st = res.steps[0]
    print(f"\nrate 2 req/s on the CPU build: sent {st.achieved_rps:.2f}/s ({st.n_measured} of {st.n_scheduled} drawn), "
          f"completed {st.rps:.2f}/s, TTFT p50 {st.ttft_p50 * 1e3:.0f} ms, short: {st.rate_short}")
    assert res.status == "done", res.stop_reason
    assert st.offered_rps == 2.0 and st.n_measured == st.n_scheduled and st.failures == {}
    assert st.achieved_rps == pytest.approx(2.0, rel=0.35)
    assert st.rate_short in (None, "draw"), st.rate_note
    (lv,) = store.levels(res.run_id)
    assert lv["mode"] == "rate" and lv["achieved_rps"] == st.achieved_rps and lv["n_scheduled"] == st.n_scheduled
