"""RampSpec validation, StepStats definitions, knee detection, export."""
from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
from pydantic import ValidationError

from app.loadgen.export import requests_csv, steps_csv, to_json, write_json
from app.loadgen.generator import RampResult
from app.loadgen.prompts import RequestFactory
from app.loadgen.records import RequestRecord
from app.loadgen.spec import SLO, RampSpec, parse_length
from app.loadgen.stats import StepStats, compute_step_stats, find_knee


# ---- spec -----------------------------------------------------------------------------

def test_geometric_levels():
    assert RampSpec(max_level=16).levels == [1, 2, 4, 8, 16]
    assert RampSpec(max_level=12).levels == [1, 2, 4, 8, 12]
    assert RampSpec(max_level=1).levels == [1]


@pytest.mark.parametrize("kw,match", [
    ({}, "no levels"),
    ({"levels": []}, "empty"),
    ({"levels": [0, 1]}, "whole number ≥ 1"),
    ({"levels": [1.5]}, "whole number"),
    ({"levels": [1], "step_seconds": -1}, "greater than 0"),
    ({"levels": [1], "warmup_seconds": -0.5}, "greater than or equal to 0"),
    ({"levels": [1], "mode": "rate", "levels_": None}, None),
    ({"levels": [0.0], "mode": "rate"}, "rate > 0"),
    ({"levels": [1], "step_seconds": None}, "needs an end"),
    ({"levels": [1], "prompt_tokens": 0}, "at least 1"),
    ({"levels": [1], "output_tokens": (10, 5)}, "low ≤ high"),
    ({"levels": [1], "url": "localhost:8000"}, "base URL"),
    ({"levels": [1], "slo": {"ttft_p99": -1}}, "greater than 0"),
    ({"levels": [1], "max_failure_rate": 2}, "less than or equal to 1"),
    ({"levels": [1], "prompts_file": "/nonexistent.jsonl"}, "no such file"),
])
def test_invalid_specs(kw, match):
    if match is None:
        return
    with pytest.raises(ValidationError, match=match):
        RampSpec(**kw)


def test_spec_roundtrip_and_url_normalised(tmp_path):
    s = RampSpec(levels=[1, 2], url="http://h:1/v1/", slo=SLO(ttft_p99=0.5), output_tokens=(10, 20))
    assert s.url == "http://h:1"
    assert RampSpec.model_validate(json.loads(s.model_dump_json())) == s
    assert parse_length("256-1024") == (256, 1024) and parse_length("7") == 7
    with pytest.raises(ValueError, match="range like"):
        parse_length("lots")


def test_prompts_file(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "hello there"}\n\n{"messages": [{"role": "user", "content": "hi"}]}\n')
    s = RampSpec(levels=[1], prompts_file=f, endpoint="/v1/chat/completions", model="m")
    fac = RequestFactory(s, "m")
    b1, b2 = json.loads(fac.next()[0]), json.loads(fac.next()[0])  # sampled: each once a pass, seeded order
    assert sorted([b1["messages"], b2["messages"]], key=str) == [[{"role": "user", "content": "hello there"}],
                                                                [{"role": "user", "content": "hi"}]]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"text": 1}\n')
    with pytest.raises(ValidationError, match="line 2"):
        RampSpec(levels=[1], prompts_file=bad)


def test_request_body():
    s = RampSpec(levels=[1], prompt_tokens=(5, 9), output_tokens=7, seed=3, length_spread=0)
    body, est, mx = RequestFactory(s, "tiny").next()
    b = json.loads(body)
    assert b["model"] == "tiny" and b["stream"] and b["ignore_eos"] and b["max_tokens"] == 7 == mx
    assert b["stream_options"] == {"include_usage": True}
    assert 5 <= len(b["prompt"].split()) == est <= 9
    assert s.shape == "prompt 5–9, output 7 tokens (uniform, seed 3)"


def test_single_lengths_vary_by_default_and_fixed_keeps_them():
    """Issue 17 item 2: a single number is a ±25 % uniform range by default (closed-loop
    users must not march in lockstep), seeded; length_spread 0 keeps it fixed."""
    s = RampSpec(levels=[1], prompt_tokens=512, output_tokens=128, seed=5)
    assert s.length_range("prompt_tokens") == (384, 640) and s.length_range("output_tokens") == (96, 160)
    assert s.shape == "prompt 384–640, output 96–160 tokens (uniform, seed 5)"
    f = RequestFactory(s, "m")
    draws = [f.next() for _ in range(400)]
    outs = [mx for _, _, mx in draws]
    ins = [est for _, est, _ in draws]
    assert min(outs) >= 96 and max(outs) <= 160 and len(set(outs)) > 40
    assert min(ins) >= 384 and max(ins) <= 640 and abs(np.mean(outs) - 128) < 4
    again = RequestFactory(s, "m")
    assert [again.next()[2] for _ in range(400)] == outs  # the same seed, the same requests
    fixed = RampSpec(levels=[1], prompt_tokens=512, output_tokens=128, length_spread=0)
    assert {RequestFactory(fixed, "m").next()[2] for _ in range(20)} == {128}
    assert fixed.shape == "prompt 512, output 128 tokens (fixed)"
    assert RampSpec(levels=[1], output_tokens=2).length_range("output_tokens") == (2, 2)  # rounding keeps ≥ 1


# ---- stats ----------------------------------------------------------------------------

def rec(t, ttft=0.1, n=5, gap=0.02, status="ok", usage_tokens=None, idx=0, level=1):
    offs = (ttft + gap * np.arange(n)).astype(np.float32) if ttft is not None else np.zeros(0, np.float32)
    e2e = float(offs[-1]) if n else 0.05
    return RequestRecord(level_idx=idx, level=level, t_start=t, ttft=ttft, e2e=e2e, prompt_tokens=10,
                         output_tokens=usage_tokens or n, status=status, chunk_offsets=offs)


def test_step_stats_definitions():
    rs = [rec(10.0 + i * 0.25) for i in range(40)]  # 10 … 19.75
    rs.append(rec(9.0))  # warm-up: not measured
    rs.append(rec(12.0, status="http_400", ttft=None, n=0))
    rs.append(rec(13.0, status="timeout", ttft=None, n=0))
    st = compute_step_stats(rs, idx=0, level=4, mode="concurrency", t_start=9.0, t_end=21.0,
                            window_start=10.0, window_end=20.0, slo=SLO(ttft_p99=0.05))
    assert st.n_measured == 42 and st.n_ok == 40
    assert st.failures == {"http_400": 1, "timeout": 1} and st.failure_rate == pytest.approx(2 / 42)
    assert st.ttft_p50 == pytest.approx(0.1, abs=1e-6)
    assert st.itl_p50 == pytest.approx(0.02, abs=1e-6)
    # TPOT = (e2e − ttft) / (n − 1) = 0.08 / 4
    assert st.tpot_p50 == pytest.approx(0.02, abs=1e-6)
    assert st.e2e_p99 == pytest.approx(0.18, abs=1e-6)
    # output tokens arriving in [10, 20]: the warm-up request's (9.1 … 9.18) are outside
    assert st.output_tps == pytest.approx(40 * 5 / 10, rel=1e-6)
    assert st.rps == pytest.approx(40 / 10)
    assert st.goodput_rps == 0.0 and st.slo_broken and "ttft_p99" in st.slo_broken[0]


def test_ttft_undefined_is_left_out_and_usage_weights_chunks():
    rs = [rec(1.0, ttft=None, n=0), rec(1.0, ttft=0.2, n=2, gap=0.1, usage_tokens=8)]
    st = compute_step_stats(rs, idx=0, level=1, mode="concurrency", t_start=0, t_end=2,
                            window_start=0.0, window_end=2.0)
    assert st.ttft_p50 == pytest.approx(0.2) and st.n_ok == 2
    assert st.output_tps == pytest.approx(8 / 2)  # 2 chunks carrying 8 tokens
    assert st.tpot_p50 == pytest.approx(0.1 / 7)


def step(level, tps, ttft):
    return StepStats(idx=0, level=level, t_start=0, t_end=1, window_start=0, window_end=1, window_s=1,
                     n_ok=10, n_measured=10, output_tps=tps, ttft_p99=ttft)


def test_knee_from_vllm_facts_ramp():
    # the measured CPU ramp of docs/vllm-facts.md (max_num_seqs 8), TTFT growing 18× at 16
    steps = [step(1, 134, 0.053), step(2, 293, 0.055), step(4, 551, 0.06), step(8, 857, 0.07), step(16, 945, 0.949)]
    k = find_knee(steps)
    assert k.level == 8 and k.next_level == 16
    assert k.gain_per_doubling == pytest.approx(945 / 857 - 1)
    assert "knee at 8" in k.describe()


def test_a_dip_that_later_levels_climb_out_of_is_not_the_knee():
    # measured on the CPU build in CI: 1 → 2 stalled (+14 %, TTFT p99 2.2×) but 4 and 8
    # kept growing; the knee is where throughput stops for good
    steps = [step(1, 515, 0.157), step(2, 589, 0.350), step(4, 1037, 0.656), step(8, 2034, 0.658),
             step(16, 1262, 2.491)]
    k = find_knee(steps)
    assert k.level == 8 and k.next_level == 16


def test_no_knee_when_latency_does_not_grow_or_throughput_still_grows():
    assert find_knee([step(1, 100, 0.05), step(2, 105, 0.06)]) is None  # flat but TTFT steady
    assert find_knee([step(1, 100, 0.05), step(2, 190, 0.5)]) is None  # TTFT grows but so does throughput
    # per-doubling: 1 → 4 with +30 % total is < 15 % per doubling
    assert find_knee([step(1, 100, 0.05), step(4, 130, 0.5)]).level == 1


def test_export_json_csv(tmp_path):
    res = RampResult(status="done", stop_reason="all levels done", model="m",
                     steps=[step(1, 100, 0.05), step(2, 110, 0.5)], records=[rec(1.0), rec(2.0, status="timeout", ttft=None, n=0)])
    res.knee = find_knee(res.steps)
    d = to_json(res, RampSpec(levels=[1, 2]))
    assert d["summary"]["knee"]["level"] == 1 and d["summary"]["requests_by_status"] == {"ok": 1, "timeout": 1}
    write_json(tmp_path / "o.json", res)
    assert json.loads((tmp_path / "o.json").read_text())["steps"][1]["level"] == 2
    assert not list(tmp_path.glob(".*tmp"))
    rows = list(csv.DictReader(io.StringIO(steps_csv(res.steps))))
    assert rows[1]["output_tps"] == "110.0"
    rows = list(csv.DictReader(io.StringIO(requests_csv(res.records))))
    assert rows[1]["status"] == "timeout" and rows[1]["ttft"] == "" and rows[0]["n_chunks"] == "5"


def test_a_window_shorter_than_its_requests_is_a_transient_and_not_a_knee():
    """Levels 1 and 4 ran long enough; level 16's 5 s window ended before its median
    request did (prefills queued for seconds): 5 tok/s there is a start-up transient,
    flagged, explained, and not taken for a knee."""
    import numpy as np

    from app.loadgen.records import RequestRecord
    from app.loadgen.stats import compute_step_stats, find_knee

    def level(idx: int, n: int, e2e: float, ttft: float, window: float):
        recs = [RequestRecord(idx, n, 0.1 * i / n, ttft=ttft, e2e=e2e, output_tokens=64,
                              chunk_offsets=np.linspace(ttft, e2e, 64).astype(np.float32)) for i in range(n)]
        return compute_step_stats(recs, idx=idx, level=n, mode="concurrency", t_start=0, t_end=e2e,
                                  window_start=0.0, window_end=window)

    a, b = level(0, 1, 1.0, 0.1, 20.0), level(1, 4, 1.2, 0.2, 20.0)
    c = level(2, 16, 9.9, 4.1, 5.0)
    assert a.steady and b.steady and a.unsteady_reason is None
    assert not c.steady
    assert "5 s window is shorter than its median request (e2e p50 9.9 s)" in c.unsteady_reason
    assert find_knee([a, b, c]) is None
    c_ok = level(2, 16, 9.9, 4.1, 30.0)
    assert c_ok.steady
