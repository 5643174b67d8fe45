"""Fixtures of the e2e tier that more than one module reads (tests/conftest.py has the
shared real servers)."""
from __future__ import annotations

import pytest

from app.config import ServerConfig
from app.loadgen.spec import RampSpec
from app.run.controller import LaunchTarget, RecordSpec, RunController
from app.store import RunStore

#: the measured ramp's lengths, exact (no spread). 256 output tokens (64 before
#: 2026-12-08): at 8 users on max_num_seqs 8 a slot stands empty from a request's end until
#: the same user's next one is in the batch (the client's turnaround and the prefill), and
#: 16 users fill those gaps from the queue; with 64 tokens (≈ 0.2 s a request) the gaps were
#: 10–20 % of the time, so 8 → 16 gained 6 % in one run and 17 % in another (over the knee
#: rule's 15 %/doubling: no knee). At 256 (≈ 0.8 s a request) they are a few per cent.
KNEE_PROMPT, KNEE_OUTPUT = 16, 256


def ramp_through_controller(url: str, store: RunStore):
    """One recorded ramp 1, 2, 4, 8, 16 users (10 s a level, KNEE_PROMPT in / KNEE_OUTPUT out tokens)
    through the run controller attached to ``url``; returns the RampResult after checking
    what every measurement must have (no failure, the server's usage counts, stored)."""
    spec = RampSpec(url=url, model="tiny", levels=[1, 2, 4, 8, 16], step_seconds=10,
                    warmup_seconds=2, prompt_tokens=KNEE_PROMPT, output_tokens=KNEE_OUTPUT, request_timeout=60,
                    length_spread=0)
    ctl = RunController(store=store)
    try:
        # no telemetry: the knee is measured on an otherwise idle 2-core machine
        ctl.launch(LaunchTarget("attach", ServerConfig(model="tiny"), attach_url=url, attach_model="tiny",
                                telemetry=False))
        res = ctl.ramp(spec, record=RecordSpec(name="e2e ramp"), timeout=300)
    finally:
        ctl.stop()
    rid = res.run_id
    for st in res.steps:
        def ms(x):  # a level without a successful measured request has no percentiles
            return "—" if x is None else f"{x * 1e3:.1f}"

        print(f"level {st.level:g}: {st.output_tps:.0f} tok/s, TTFT p99 {ms(st.ttft_p99)} ms, "
              f"TPOT p50 {ms(st.tpot_p50)} ms, n={st.n_measured}, failures {st.failures}")
    assert res.status == "done", res.stop_reason
    assert all(st.failures == {} and st.n_ok > 0 for st in res.steps)
    assert all(r.tokens_source == "server_usage" and r.output_tokens == KNEE_OUTPUT for r in res.records)
    assert len(store.levels(rid)) == 5 and len(store.requests(rid)) == len(res.records)
    return res


@pytest.fixture(scope="session")
def measured_ramp(vllm_server, tmp_path_factory):
    """The shared server's ramp, measured once for the session: the knee test judges it
    (and measures again when it misses), the calibration test fits on it. Returns
    ``(store, [RampResult, ...])``: a test that measures again appends its result."""
    with RunStore(tmp_path_factory.mktemp("measured-ramp") / "runs.sqlite") as store:
        yield store, [ramp_through_controller(vllm_server.url, store)]
