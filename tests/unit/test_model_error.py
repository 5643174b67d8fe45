"""The model's measured error, shipped and stated (issue 34, item 5): the table is a function
of its points, its lookups fall back from the card to its class and say what the library
does not cover, and the Plan, the what-if, the tuner and ``predict`` print it. The
points themselves are recomputed from the library in tests/integration/test_model_error.py."""
from __future__ import annotations

import json
import math

import pytest

from app.config import ServerConfig
from app.planner.model_error import (ALL, CPU, GDDR, HBM, MIN_POINTS, ErrorTable, PointError, build_table,
                                     card_class, load_table, offered_concurrency, quant_family, regime_of,
                                     statement)
from app.planner.models import quant_format, resolve_model
from app.tuner.space import checkpoint_label


def test_the_shipped_table_is_its_points_grouped():
    """The cells and coverage of app/planner/data/model_error.json are exactly
    :func:`build_table` of its own ``point_errors`` (hand edits of a cell fail here)."""
    t = load_table()
    assert t.points == len(t.point_errors) >= 100 and t.sets >= 10
    again = ErrorTable.from_json(build_table(t.point_errors, t.library))
    assert again.cells == t.cells
    assert again.coverage == t.coverage
    assert t.library.startswith("benchmarks/data/realgpu: ")


@pytest.mark.parametrize("name, cls", [("H100 SXM", HBM), ("A100 80GB PCIe", HBM), ("RTX 4090", GDDR),
                                       ("RTX 5090", GDDR), ("DGX Spark GB10", GDDR), ("CPU", CPU),
                                       ("Some Future Card", GDDR)])
def test_card_classes(name, cls):
    assert card_class(name) == cls


@pytest.mark.parametrize("c, label", [(1, "1–8"), (8, "1–8"), (8.5, "9–64"), (64, "9–64"), (65, "65+"), (900, "65+")])
def test_regimes(c, label):
    assert regime_of(c) == label


@pytest.mark.parametrize("q, fam", [(None, "none"), ("awq_marlin", "awq"), ("AWQ", "awq"), ("gptq_marlin", "gptq"),
                                    ("fp8", "fp8"), ("compressed-tensors", "compressed-tensors")])
def test_quantization_families(q, fam):
    assert quant_family(q) == fam


def test_offered_concurrency_as_vllm_bench_serve_sends():
    assert offered_concurrency(16, "inf", 1000) == 16
    assert offered_concurrency(2000, math.inf, 100) == 100  # the cap never exceeds the prompts
    assert offered_concurrency(None, "inf", 500) == 500  # everything at once
    assert offered_concurrency(None, 4.0, 1000, None, 2500.0) == pytest.approx(10.0)  # Little: 4/s × 2.5 s
    assert offered_concurrency(None, 4.0, 1000, 3.0, 2000.0) == pytest.approx(6.0)  # the measured rate first
    assert offered_concurrency(64, "inf", 1000, data_parallel_size=4) == 16  # per engine
    assert offered_concurrency(None, 0.01, 10, None, 10.0) == 1.0  # at least one


def _pt(gpu, c, err, world=1, q=None, role="fit", set_id="s1"):
    return PointError(gpu, c, world, q, role, set_id, {"tput": err, "ttft": 2 * err, "tpot": -err})


def _table(points) -> ErrorTable:
    return ErrorTable.from_json(json.loads(json.dumps(build_table(points, "test"))))


def test_the_cards_own_cell_at_its_load_first():
    t = _table([_pt("RTX 4090", 4, 10), _pt("RTX 4090", 6, -20, set_id="s2"), _pt("RTX 4090", 2, 30),
                _pt("RTX 4090", 100, 50), _pt("RTX 3090", 4, 5)])
    s = statement("RTX 4090", 4, table=t)
    assert s.own_card and s.cell.scope == "RTX 4090" and s.cell.regime == "1–8" and s.covered
    assert s.cell.points == 3 and s.cell.sets == 2
    assert s.cell.median_abs == {"tput": 20.0, "ttft": 40.0, "tpot": 20.0}
    assert s.text == ("model error vs published runs (median |error|): output tok/s ±20 %, TTFT ±40 %, TPOT ±20 % — "
                      "on RTX 4090 at 1–8 concurrent requests, 3 runs in 2 sets")


def test_too_few_points_at_the_load_take_the_card_over_every_load_then_the_class():
    pts = [_pt("RTX 4090", 4, 10), _pt("RTX 4090", 6, 20), _pt("RTX 4090", 2, 30), _pt("RTX 4090", 100, 50)]
    t = _table(pts)
    s = statement("RTX 4090", 200, table=t)  # 1 point at 65+: the card over every load (4 points)
    assert s.own_card and s.cell.regime is None and s.cell.points == len(pts)
    assert "at any load (few runs at 65+)" in s.text
    s = statement("RTX 3090", 4, table=t)  # no run on the card: its class at the load
    assert not s.own_card and s.cell.scope == GDDR and s.cell.regime == "1–8"
    assert f"on {GDDR} (no {MIN_POINTS}+ published runs on RTX 3090 itself)" in s.text


def test_a_class_without_runs_has_no_statement():
    t = _table([_pt("RTX 4090", 4, 10)] * 3)
    s = statement("H100 SXM", 4, table=t)
    assert s.cell is None and not s.covered
    assert s.text == f"model error unknown here: the library of published runs has no run on H100 SXM or its class ({HBM})"
    assert s.as_dict()["points"] == 0 and s.as_dict()["median_abs_error_pct"] is None
    assert ALL in {c.scope for c in t.cells.values()}  # every card is in the table, not a fallback


def test_more_cards_or_another_quantization_than_the_library_has_are_outside_it():
    t = _table([_pt("RTX 4090", 4, 10, world=2, q="awq_marlin")] * 3)
    s = statement("RTX 4090", 4, world=8, quantization="gptq", table=t)
    assert s.cell is not None and not s.covered
    assert s.outside == ("8 cards (the most in a published run of the class: 2)",
                         "quantization gptq (published runs of the class: awq)")
    assert "; outside what the library covers: 8 cards" in s.text
    assert statement("RTX 4090", 4, world=2, quantization="awq", table=t).covered


def test_a_broken_table_names_its_file_and_the_fix(tmp_path):
    bad = tmp_path / "model_error.json"
    bad.write_text('{"cells": 3}', encoding="utf-8")
    with pytest.raises(ValueError, match=r"model_error\.json: not the model's error table .*--write-error-table"):
        load_table(str(bad))


def test_the_plan_states_its_error(monkeypatch):
    """`vllm-dyno plan`'s text has the model-error line for GPU cards (the shipped table),
    none for the CPU build."""
    from app.config import ServerConfig
    from app.planner.gpus import lookup_gpu
    from app.planner.models import resolve_model
    from app.planner.plan import Workload, plan
    from app.planner.render import model_error_text, render_plan

    cfg = ServerConfig(model="Qwen/Qwen2.5-7B-Instruct", max_model_len=4096)
    p = plan(cfg, [lookup_gpu("RTX 4090")], resolve_model(cfg.model), workload=Workload(), use_calibration=False)
    text = model_error_text(p)
    assert text.startswith("model error vs published runs (median |error|): output tok/s ±") and "RTX 4090" in text
    assert f"  {text}" in render_plan(p).splitlines()


@pytest.mark.parametrize("q, fmt", [(None, None), ("awq_marlin", "awq"), ("gptq_marlin", "gptq"),
                                    ("gptq_marlin_24", "gptq_24"), ("awq", "awq"), ("fp8", "fp8")])
def test_one_quantization_format_for_tuner_keys_model_and_table(q, fmt):
    """app.planner.models.quant_format is the one place a Marlin kernel variant becomes its
    checkpoint format: the tuner's checkpoint label (stored in tunes' candidate keys) and the
    error table's family read it, so a stored tune's key does not move."""
    assert quant_format(q) == fmt
    if q is not None:
        model = resolve_model("meta-llama/Llama-3.1-8B-Instruct")
        assert checkpoint_label(ServerConfig(model="m", quantization=q), model) == fmt
        assert quant_family(q) == (fmt.split("_")[0] if fmt.startswith(("awq", "gptq")) else fmt)
