"""Reasoning metrics, the client's half (issue 38, item 2): TTFA — time to first answer
token, after the ``delta.reasoning`` chunks vLLM 0.32 streams first
(vllm/entrypoints/generate/base/protocol.py:359 ``DeltaMessage.reasoning``; older versions
``reasoning_content``) — and reasoning tokens, per level, in every view the vocabulary gives
them; rig time scales them as TTFT. The stream parsing: tests/integration/test_reasoning.py."""
from __future__ import annotations

import numpy as np
import pytest

from app.loadgen.records import RequestRecord
from app.loadgen.stats import compute_step_stats, records_to_rig, to_rig_time
from app.metrics import BY_NAME, CSV, REPORT, RESULTS, STORE


def _rec(i: int, ttft: float, ttfa: float | None, reasoning: int) -> RequestRecord:
    return RequestRecord(level_idx=0, level=4, t_start=1.0 + i * 0.01, ttft=ttft, ttfa=ttfa, e2e=2.0,
                         output_tokens=100, reasoning_tokens=reasoning,
                         chunk_offsets=np.linspace(ttft, 2.0, 100).astype(np.float32))


def test_a_level_reports_ttfa_and_reasoning_tokens_apart_from_ttft():
    recs = [_rec(i, 0.1, 0.1 + 0.01 * i, 40 + i) for i in range(11)]
    st = compute_step_stats(recs, idx=0, level=4, mode="concurrency", t_start=0, t_end=5, window_start=0,
                            window_end=5)
    assert st.ttft_p50 == pytest.approx(0.1) and st.ttfa_p50 == pytest.approx(0.15)
    assert st.ttfa_p99 == pytest.approx(np.percentile([0.1 + 0.01 * i for i in range(11)], 99))
    assert st.reasoning_tokens_mean == pytest.approx(45.0)
    rig = to_rig_time(st, 10.0)  # a sim 10× faster: TTFA in rig seconds as TTFT, tokens unchanged
    assert rig.ttfa_p50 == pytest.approx(1.5) and rig.reasoning_tokens_mean == pytest.approx(45.0)
    assert records_to_rig(recs, 10.0)[3].ttfa == pytest.approx(1.3) and records_to_rig(recs, 10.0)[3].reasoning_tokens == 43
    # a model that does not reason: TTFA is TTFT, no reasoning tokens; no answer at all: no TTFA
    plain = compute_step_stats([_rec(i, 0.2, 0.2, 0) for i in range(5)] + [_rec(9, 0.2, None, 100)], idx=0, level=4,
                               mode="concurrency", t_start=0, t_end=5, window_start=0, window_end=5)
    assert plain.ttfa_p50 == plain.ttft_p50 and plain.reasoning_tokens_mean == pytest.approx(100 / 6)


def test_the_reasoning_figures_are_declared_once_for_the_views():
    for name in ("ttfa_p50", "ttfa_p99", "reasoning_tokens_mean"):
        assert {RESULTS, CSV, STORE} <= BY_NAME[name].views, name
    assert REPORT in BY_NAME["ttfa_p99"].views and BY_NAME["ttfa_p99"].tail
    assert RequestRecord.from_tuple(_rec(0, 0.1, 0.3, 7).to_tuple()).ttfa == pytest.approx(0.3)


def test_the_slo_can_bound_ttfa():
    """--slo-ttfa-p99 breaks a level whose answers come late even when its first tokens
    (the reasoning) come early; goodput and the bootstrap judge the same bound; rig
    seconds → the sim's wall seconds as the other bounds."""
    from app.loadgen.capacity import level_met, met_probability
    from app.loadgen.spec import SLO, slo_to_wall
    from app.loadgen.stats import meets_slo

    recs = [_rec(i, 0.1, 1.0 + 0.01 * i, 300) for i in range(20)]
    slo = SLO(ttft_p99=0.5, ttfa_p99=0.8)
    st = compute_step_stats(recs, idx=0, level=4, mode="concurrency", t_start=0, t_end=5, window_start=0,
                            window_end=5, slo=slo)
    assert [m.split(" ")[0] for m in st.slo_broken] == ["ttfa_p99"] and not level_met(st, slo)
    assert st.goodput_rps == 0 and not meets_slo(recs[0], slo) and meets_slo(recs[0], SLO(ttfa_p99=1.5))
    assert met_probability(recs, slo) == 0.0 and met_probability(recs, SLO(ttfa_p99=2.0)) == 1.0
    assert slo_to_wall(slo, 10.0).ttfa_p99 == pytest.approx(0.08) and not SLO(ttfa_p99=1).is_empty()
