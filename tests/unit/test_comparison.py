"""Compare and run history on a real SQLite run store, and the profiles/runs/compare CLI."""
from __future__ import annotations

import csv
import io
import json
import xml.etree.ElementTree as ET

import pytest

from app import history
from app.cli import main
from app.comparison import compare, compare_runs, load_series
from app.settings import Pricing
from app.telemetry.derived import LevelEnergy, level_energy, power_series
from app.store import RunStore


def _level(idx, level, tps, ttft, t0):
    return {"idx": idx, "level": level, "mode": "concurrency", "t_start": t0, "t_end": t0 + 10,
            "window_start": t0, "window_end": t0 + 10, "window_s": 10.0, "n_measured": 20, "n_ok": 20,
            "output_tps": tps, "rps": tps / 100, "ttft_p99": ttft, "tpot_p99": 0.02, "failure_rate": 0.0,
            "slo_broken": []}


def _run(store, name, tp, tps_by_level, watts_per_gpu):
    rid = store.create_run(name, "vllm", config={"profile": {"name": name, "server": {
        "model": "m", "tensor-parallel-size": tp}}})
    samples = []
    for i, (lv, tps) in enumerate(tps_by_level):
        t0 = 20.0 * i
        store.add_level(rid, _level(i, lv, tps, 0.05 * lv, t0))
        for g in range(tp):
            samples += [(t0 + k, f"gpu{g}", "power_w", watts_per_gpu + (10 if k % 2 else -10)) for k in range(1, 10)]
            samples.append((t0 + 5, f"gpu{g}", "temp_gpu_c", 60.0))
        samples.append((t0 + 5, "host", "power_w", 999.0))  # not a GPU: left out
    store.add_samples(rid, samples)
    store.add_requests(rid, [{"level_idx": 0, "level": 1, "t_start": 1.0, "ttft": 0.05, "e2e": 1.0,
                              "prompt_tokens": 10, "output_tokens": 3, "tokens_source": "counted",
                              "status": "ok", "error": None, "chunk_offsets": [0.05, 0.5, 1.0]}])
    store.add_log_lines(rid, [(0.5, "stdout", "Application startup complete.")])
    store.finish_run(rid, "done", summary={"status": "done", "peak_output_tps": max(t for _, t in tps_by_level),
                                           "gpu_count": tp, "hardware": {"gpu": "RTX 5090", "count": tp}})
    return rid


@pytest.fixture
def store(dyno_home):
    with RunStore() as s:  # the default path under VLLM_DYNO_HOME, as the CLI uses
        yield s


@pytest.fixture
def two_runs(store):
    four = _run(store, "4x 5090", 4, [(1, 100.0), (8, 600.0), (32, 1000.0)], 300.0)
    eight = _run(store, "8x 5090", 8, [(1, 120.0), (8, 900.0), (32, 1600.0)], 250.0)
    store.flush()
    return four, eight


def test_scaling_efficiency_energy_and_cost(store, two_runs):
    four, eight = two_runs
    cmp = compare_runs(store, [eight, four], Pricing(gpu_hour=2.0, kwh=0.30))
    assert cmp.series[cmp.baseline].run_id == four  # fewest GPUs is the baseline
    rows = {(r.run_id, r.level): r for r in cmp.rows}
    r = rows[(eight, 32)]
    assert r.tps_per_gpu == pytest.approx(200.0)
    assert r.scaling_efficiency == pytest.approx((1600 / 1000) / 2)  # 0.8
    assert rows[(four, 32)].scaling_efficiency == pytest.approx(1.0)
    assert r.power_w == pytest.approx(8 * 250.0, rel=0.02)  # GPU cards only, host left out
    assert r.j_per_token == pytest.approx(r.power_w / 1600)
    assert r.cost_per_mtok_rented == pytest.approx(2.0 * 8 / (1600 * 3600) * 1e6)
    assert r.cost_per_mtok_energy == pytest.approx(0.30 * r.power_w / 1000 / (1600 * 3600) * 1e6)
    peaks = {p.run_id: p for p in cmp.peak_rows()}
    assert peaks[eight].level == 32 and peaks[eight].scaling_efficiency == pytest.approx(0.8)
    curves = cmp.curves()
    assert curves["throughput"][0][1] == [1, 8, 32] and curves["ttft"][0][2] == pytest.approx([0.05, 0.4, 1.6])


def test_missing_figures_are_none_not_errors(store, two_runs):
    four, eight = two_runs
    rid = store.create_run("no power", "attach")
    store.add_level(rid, _level(0, 8, 300.0, 0.1, 0.0))
    store.finish_run(rid, "done")
    cmp = compare_runs(store, [four, rid])
    r = [x for x in cmp.rows if x.run_id == rid][0]
    assert r.gpus == 1 and r.power_w is None and r.j_per_token is None
    assert r.cost_per_mtok_rented is None and r.cost_per_mtok_energy is None
    assert r.scaling_efficiency == pytest.approx(1.0)  # one card: it is the baseline now
    r4 = [x for x in cmp.rows if x.run_id == four and x.level == 8][0]
    assert r4.scaling_efficiency == pytest.approx((600 / 300) / (4 / 1))
    assert [x for x in cmp.rows if x.run_id == four and x.level == 1][0].scaling_efficiency is None
    with pytest.raises(ValueError, match="two or more"):
        compare(load_series(store, [four]))
    with pytest.raises(history.RunNotFound, match="no run 999"):
        compare_runs(store, [four, 999])
    with pytest.raises(ValueError, match="price"):
        Pricing(gpu_hour=-1)


def test_level_energy_is_one_definition_for_wall_and_rig_time():
    """Power = ∫ Σ P dt ÷ window; J/token = power × rig window ÷ tokens (= P ÷ tok/s)."""
    t = [float(x) for x in range(11)]
    samples = [(x, "gpu0", "power_w", 100.0) for x in t] + [(x, "gpu1", "power_w", 50.0) for x in t]
    samples += [(3.0, "gpu1", "power_w", None), (5.0, "host", "power_w", 9999.0)]
    power = power_series(samples)
    assert sorted(power) == ["gpu0", "gpu1"]
    e = level_energy(power, 2.0, 6.0, 600.0)
    assert e.power_w == pytest.approx(150.0) and e.j_per_token == pytest.approx(150.0 * 4 / 600)
    # a sim twice as fast as the wall clock: the rig window [4, 12] is the wall window [2, 6]
    e2 = level_energy(power, 4.0, 12.0, 600.0, time_scale=2.0)
    assert e2.power_w == pytest.approx(150.0) and e2.j_per_token == pytest.approx(2 * e.j_per_token)
    assert level_energy(power, 20.0, 30.0, 10.0) == LevelEnergy(None, None)
    assert level_energy(power, 2.0, 6.0, 0.0).j_per_token is None


def test_csv_and_svg_export(store, two_runs):
    cmp = compare_runs(store, list(two_runs), Pricing(gpu_hour=1.0))
    rows = list(csv.DictReader(io.StringIO(cmp.to_csv())))
    assert len(rows) == 6 and rows[0]["scaling_efficiency"] != ""
    svg = ET.fromstring(cmp.to_svg())
    assert svg.tag.endswith("svg") and len(svg.findall("{http://www.w3.org/2000/svg}polyline")) == 4


def test_history_list_show_export_delete(store, two_runs):
    four, eight = two_runs
    rows = history.list_runs(store)
    assert [r.id for r in rows] == [eight, four] and rows[0].gpu_count == 8
    j = history.export_json(store, four)
    assert j["levels"][2]["output_tps"] == 1000.0 and j["requests"][0]["chunk_offsets"] == [0.05, 0.5, 1.0]
    assert j["server_log"][0][2] == "Application startup complete." and j["samples"]
    json.dumps(j)  # JSON-ready
    lv = list(csv.DictReader(io.StringIO(history.levels_csv(store, four))))
    assert [float(r["level"]) for r in lv] == [1, 8, 32]
    rq = list(csv.DictReader(io.StringIO(history.requests_csv(store, four))))
    assert rq[0]["n_chunks"] == "3"
    p = history.profile_from_run(store, eight, "8x measured")
    assert p.results.peak_output_tps == 1600.0 and p.results.best_level == 32
    assert p.hardware.count == 8 and p.server["tensor-parallel-size"] == 8
    assert history.best_run(store, "8x 5090") == eight
    history.delete_run(store, four)
    assert store.get_run(four) is None and store.samples(four) == []
    with pytest.raises(history.RunNotFound):
        history.delete_run(store, four)


# ---------------------------------------------------------------------- CLI
def test_cli_runs_and_compare(store, two_runs, tmp_path, capsys):
    four, eight = two_runs
    store.close()
    assert main(["runs", "list"]) == 0
    out = capsys.readouterr().out
    assert "8x 5090" in out and "1600.0" in out
    assert main(["runs", "show", str(four)]) == 0
    assert "TTFT p99" in capsys.readouterr().out
    f = tmp_path / "r.json"
    assert main(["runs", "export", str(four), "--format", "json", "-o", str(f)]) == 0
    assert json.loads(f.read_text())["id"] == four
    assert main(["runs", "export", str(four), "--format", "csv"]) == 0
    assert capsys.readouterr().out.startswith("idx,level")
    c, s = tmp_path / "c.csv", tmp_path / "c.svg"
    assert main(["compare", str(four), str(eight), "--gpu-hour-price", "2", "--kwh-price", "0.3",
                 "--csv", str(c), "--svg", str(s)]) == 0
    out = capsys.readouterr().out
    assert "0.80" in out and "baseline: #" in out
    assert c.read_text().startswith("run_id,") and s.read_text().startswith("<svg")
    assert main(["compare", str(four)]) == 2
    assert "two or more" in capsys.readouterr().err
    assert main(["runs", "show", "999"]) == 2
    assert main(["profiles", "save-run", str(eight), "--name", "from run"]) == 0
    assert main(["profiles", "show", "from run"]) == 0
    assert "peak_output_tps: 1600.0" in capsys.readouterr().out
    with RunStore() as st:  # a worse run of the same profile: --which best takes the better one
        worse = _run(st, "8x 5090", 8, [(1, 50.0), (8, 300.0)], 250.0)
    assert main(["profiles", "save-run", str(worse), "--name", "best of", "--which", "best"]) == 0
    assert main(["profiles", "show", "best of"]) == 0
    out = capsys.readouterr().out
    assert "peak_output_tps: 1600.0" in out and "which: best" in out
    assert main(["runs", "delete", str(four)]) == 0


def test_cli_profiles(tmp_path, capsys, dyno_home):
    assert main(["profiles", "list"]) == 0
    out = capsys.readouterr().out
    assert "CPU tiny model" in out and "[built-in]" in out
    (dyno_home / "profiles" / "bad.yaml").write_text("name: bad\nserver: {model: m, max-num-seqs: -1}\n")
    assert main(["profiles", "list"]) == 0
    cap = capsys.readouterr()
    assert "bad.yaml: server.max-num-seqs" in cap.err and "CPU tiny model" in cap.out
    assert main(["profiles", "export", "4x RTX 5090 Llama-3-70B AWQ", "--format", "cmd"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("NCCL_P2P_DISABLE=1 CUDA_VISIBLE_DEVICES=0,1,2,3 vllm serve hugging-quants/")
    cfg = tmp_path / "c.yaml"
    assert main(["profiles", "export", "4x RTX 5090 Llama-3-70B AWQ", "--format", "yaml", "-o", str(cfg)]) == 0
    assert main(["profiles", "import", str(cfg), "--name", "from yaml"]) == 0
    assert main(["profiles", "import", line, "--name", "from cmd"]) == 0
    capsys.readouterr()
    assert main(["profiles", "export", "from yaml", "--format", "cmd"]) == 0
    assert main(["profiles", "export", "from cmd", "--format", "cmd"]) == 0
    a, b = capsys.readouterr().out.strip().splitlines()
    assert a == b == line
    assert main(["profiles", "import", str(cfg), "--name", "from yaml"]) == 2  # exists; --force replaces
    assert main(["profiles", "import", str(cfg), "--name", "from yaml", "--force"]) == 0
    assert main(["profiles", "delete", "CPU tiny model"]) == 2
    assert "built-in" in capsys.readouterr().err
    assert main(["profiles", "show", "nope"]) == 2
    assert main(["profiles", "delete", "from cmd"]) == 0


# ---------------------------------------------------------------------- issue 19, item 6
def _shaped_run(store, name, model, hw, prompt=512, output=128, server=None):
    rid = store.create_run(name, "vllm", config={"server": {"model": model, **(server or {})}},
                           spec={"prompt_tokens": prompt, "output_tokens": output, "shape": "uniform ±25 %",
                                 "endpoint": "/v1/completions", "levels": [1, 8]})
    for i, (lv, tps) in enumerate([(1, 50.0), (8, 300.0)]):
        store.add_level(rid, _level(i, lv, tps, 0.05, 20.0 * i))
    store.finish_run(rid, "done", summary={"status": "done", "gpu_count": hw["count"], "hardware": hw})
    return rid


def test_what_differs_model_rig_flags_and_shape(store):
    a = _shaped_run(store, "a", "m", {"gpu": "RTX 4090", "count": 4, "vllm_version": "0.32.0"},
                    server={"tensor_parallel_size": 4, "max_num_batched_tokens": 2048})
    b = _shaped_run(store, "b", "m", {"gpu": "RTX 4090", "count": 4, "vllm_version": "0.32.0"},
                    server={"tensor_parallel_size": 4, "max_num_batched_tokens": 8192, "kv_cache_dtype": "fp8",
                            "env": {"NCCL_P2P_DISABLE": "1"}})
    cmp = compare_runs(store, [a, b])
    assert cmp.comparable and cmp.warnings == []
    assert cmp.diff == [("flags", "max_num_batched_tokens", ["2048", "8192"]), ("flags", "kv_cache_dtype", ["—", "fp8"]),
                        ("flags", "env NCCL_P2P_DISABLE", ["—", "1"])]
    assert any(r.scaling_efficiency is not None for r in cmp.rows)


@pytest.mark.parametrize("change,why", [
    (dict(model="other"), "different models: m (#1), other (#2)"),
    (dict(prompt=1024), "different request shapes (prompt_tokens): 512 (#1), 1024 (#2)"),
    (dict(hw={"gpu": "CPU", "count": 1}), "the CPU build beside GPUs: 4× RTX 4090 (#1), 1× CPU (#2)"),
])
def test_runs_that_are_not_comparable_say_why_and_show_no_scaling(store, change, why, capsys):
    a = _shaped_run(store, "a", "m", {"gpu": "RTX 4090", "count": 4})
    kw = dict(model="m", hw={"gpu": "RTX 4090", "count": 4}) | change
    b = _shaped_run(store, "b", kw.pop("model"), kw.pop("hw"), **kw)
    store.flush()
    cmp = compare_runs(store, [a, b])
    assert not cmp.comparable and cmp.warnings == [why]
    assert all(r.scaling_efficiency is None for r in cmp.rows + cmp.peak_rows())
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert f"warning: not comparable — {why}; no scaling efficiency is shown" in out
    assert "what differs:" in out


def test_a_runs_name_says_what_differs_from_its_profile():
    from app.profiles.model import Profile, variant_name

    base = Profile(name="demo", engine="sim", server={"model": "m", "max-num-batched-tokens": 2048},
                   env={"NCCL_P2P_DISABLE": "1"})
    assert variant_name("demo", base, base) == "demo"
    assert variant_name("demo", None, base) == "demo"
    one = base.model_copy(update={"server": {"model": "m", "max-num-batched-tokens": 8192}})
    assert variant_name("demo", base, one) == "demo · max_num_batched_tokens 8192"
    many = base.model_copy(update={"server": {"model": "m", "kv-cache-dtype": "fp8", "max-num-seqs": 64},
                                   "env": {}, "ramp": base.ramp.model_copy(update={"prompt_tokens": 1024})})
    assert variant_name("demo", base, many) == ("demo · kv_cache_dtype fp8, max_num_seqs 64, "
                                                "max_num_batched_tokens default, +2 more")
