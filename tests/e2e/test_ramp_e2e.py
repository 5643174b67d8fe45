"""A real ramp against the shared CPU vLLM (tiny model, max_num_seqs 8): the knee at 8."""
from __future__ import annotations

import pytest

from app.loadgen.generator import run_ramp
from app.loadgen.spec import RampSpec
from app.store import RunStore


@pytest.mark.e2e
def test_ramp_finds_knee_at_max_num_seqs(vllm_server):
    assert vllm_server.config.max_num_seqs == 8
    spec = RampSpec(url=vllm_server.url, model="tiny", levels=[1, 2, 4, 8, 16], step_seconds=10,
                    warmup_seconds=2, prompt_tokens=16, output_tokens=64, request_timeout=60)
    with RunStore() as store:
        rid = store.create_run("e2e ramp", "vllm", spec=spec)
        res = run_ramp(spec, timeout=240, store=store, run_id=rid)
        for st in res.steps:
            print(f"level {st.level:g}: {st.output_tps:.0f} tok/s, TTFT p99 {st.ttft_p99 * 1e3:.0f} ms, "
                  f"TPOT p50 {st.tpot_p50 * 1e3:.1f} ms, n={st.n_measured}")
        assert res.status == "done", res.stop_reason
        by = {st.level: st for st in res.steps}
        assert all(st.failures == {} and st.n_ok > 0 for st in res.steps)
        assert all(r.tokens_source == "server_usage" and r.output_tokens == 64 for r in res.records)
        assert by[8].output_tps > 3 * by[1].output_tps
        assert by[16].ttft_p99 > 2 * by[8].ttft_p99
        assert res.knee is not None and res.knee.level == 8, res.knee
        assert len(store.levels(rid)) == 5 and len(store.requests(rid)) == len(res.records)
