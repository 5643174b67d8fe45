"""The shipped error table (app/planner/data/model_error.json) against a recomputation from
the library of published GPU runs (issue 34, item 5): every point predicted again as
``benchmarks/real_gpu_fidelity.py --write-error-table`` does, on two worker processes.
A change of the engine, the planner or the library that moves any point fails here, with
the command that writes the table again."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from app.planner.model_error import PointError, load_table

ROOT = Path(__file__).resolve().parents[2]
FIX = "rerun: .venv/bin/python benchmarks/real_gpu_fidelity.py --no-sensitivity --write-error-table"


def _fidelity():
    spec = importlib.util.spec_from_file_location("real_gpu_fidelity", ROOT / "benchmarks" / "real_gpu_fidelity.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _key(p: PointError) -> tuple:
    return (p.set_id, p.gpu, p.world, p.quantization, p.role)


@pytest.mark.long(60)  # seconds on 2 cores: opens an xdist chunk (tests/plugins/order.py)
def test_the_shipped_table_is_the_library_predicted_again():
    fid = _fidelity()
    folder = ROOT / "benchmarks" / "data" / "realgpu"
    shipped = load_table()
    assert shipped.library == fid.library_digest(folder), f"the library changed since the table was written: {FIX}"
    sets = fid.load_sets(folder)
    runner = fid.Runner(2)
    base, todo = {}, {}
    for rs in sets:
        keys, t = fid.set_jobs(rs)
        base[rs.id] = keys
        todo.update(t)
    runner.run(todo)
    again = fid.error_points([fid.assemble(rs, base[rs.id], runner) for rs in sets])
    assert len(again) == len(shipped.point_errors), FIX
    for new, old in zip(again, shipped.point_errors):
        assert _key(new) == _key(old), (new, old, FIX)
        assert new.concurrency == pytest.approx(old.concurrency, rel=1e-6, abs=0.01), (new, old, FIX)
        assert set(new.errors) == set(old.errors), (new, old, FIX)
        for f, e in new.errors.items():
            assert e == pytest.approx(old.errors[f], abs=0.05), (new.set_id, f, e, old.errors[f], FIX)
