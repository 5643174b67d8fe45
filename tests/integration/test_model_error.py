"""The shipped error table (app/planner/data/model_error.json) against a recomputation from
the library of published GPU runs (issue 34, item 5): points predicted again as
``benchmarks/real_gpu_fidelity.py --write-error-table`` does, on two worker processes.
A change of the engine, the planner or the library that moves them fails here, with the
command that writes the table again. The library's digest is checked whole; of its points,
the :data:`PER_SET` cheapest of every set are predicted again (42 of 142: ~25 CPU s instead
of ~100 — every set, so every card, model and kind of workload, and any change of the
engine moves some of them; the unit test checks that the cells are the points grouped)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from app.planner.model_error import PointError, load_table

ROOT = Path(__file__).resolve().parents[2]
PER_SET = 2
FIX = "rerun: .venv/bin/python benchmarks/real_gpu_fidelity.py --no-sensitivity --write-error-table"


def _fidelity():
    spec = importlib.util.spec_from_file_location("real_gpu_fidelity", ROOT / "benchmarks" / "real_gpu_fidelity.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def _key(p: PointError) -> tuple:
    return (p.set_id, p.gpu, p.world, p.quantization, p.role)


@pytest.mark.long(30)  # seconds on 2 cores: opens an xdist chunk (tests/plugins/order.py)
def test_the_shipped_table_is_the_library_predicted_again():
    fid = _fidelity()
    folder = ROOT / "benchmarks" / "data" / "realgpu"
    shipped = load_table()
    assert shipped.library == fid.library_digest(folder), f"the library changed since the table was written: {FIX}"
    sets = fid.load_sets(folder)
    assert sum(len(rs.points) for rs in sets) == len(shipped.point_errors), FIX
    # the shipped points in the library's order (error_points writes them so): set → label → point
    old, i = {}, 0
    for rs in sets:
        for p in rs.points:
            old[(rs.id, p.label)] = shipped.point_errors[i]
            i += 1
    runner = fid.Runner(2)
    subsets, todo = [], {}
    for rs in sets:
        keys, jobs = fid.set_jobs(rs)
        cheap = sorted(rs.points, key=lambda p: fid._cost(jobs[keys[p.label]]))[:PER_SET]
        subsets.append((rs.model_copy(update={"points": cheap, "comparisons": []}), keys))
        todo.update({keys[p.label]: jobs[keys[p.label]] for p in cheap})
    runner.run(todo)
    checked = 0
    for sub, keys in subsets:
        again = fid.error_points([fid.assemble(sub, keys, runner)])
        for p, new in zip(sub.points, again):
            was = old[(sub.id, p.label)]
            assert _key(new) == _key(was), (new, was, FIX)
            assert new.concurrency == pytest.approx(was.concurrency, rel=1e-6, abs=0.01), (new, was, FIX)
            assert set(new.errors) == set(was.errors), (new, was, FIX)
            for f, e in new.errors.items():
                assert e == pytest.approx(was.errors[f], abs=0.05), (sub.id, p.label, f, e, was.errors[f], FIX)
            checked += 1
    assert checked >= len(sets)
