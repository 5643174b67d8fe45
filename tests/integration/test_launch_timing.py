"""The process-starting half of tests/unit/test_launch_timing.py (the tier rule: tests/plugins/tiers.py)."""
from __future__ import annotations
import pytest
from app.run.controller import LaunchTarget, RunController
from app.server.logparse import PHASE_KEYS
from app.store import RunStore
from tests.unit.test_launch_timing import CFG, Phases, RIG


def test_a_second_launch_of_the_same_configuration_knows_how_long_it_takes(tmp_path):
    with RunStore(tmp_path / "runs.sqlite") as store:
        ev = Phases()
        ctl = RunController(store=store, listener=ev)
        try:
            for n in range(2):
                assert ctl.launch(LaunchTarget("sim", CFG, sim_args=RIG, telemetry=False)) == []
                assert ctl.wait_ready(60), ctl.failure_text
                assert ctl.stop() == []
                if n == 0:
                    first = list(ev.seen)
                    ev.seen.clear()
        finally:
            ctl.close()
        # the sim prints vLLM's lines: every phase, in order, each announced once
        assert [p.phase for p in first] == list(PHASE_KEYS), [p.phase for p in first]
        assert all(p.remaining_s is None for p in first)  # nothing to go by yet
        rows = store.launches(ctl.launch_key)
        assert len(rows) == 2 and all(0 < r["ready_s"] < 30 for r in rows)
        assert set(rows[1]["phases"]) == set(PHASE_KEYS)
        assert list(rows[1]["phases"].values()) == sorted(rows[1]["phases"].values())
        second = ev.seen
        assert [p.phase for p in second] == list(PHASE_KEYS)
        assert all(p.expected_total_s == pytest.approx(rows[1]["ready_s"]) for p in second)
        w = next(p for p in second if p.phase == "weights")
        assert w.remaining_s is not None and 0 < w.remaining_s <= w.expected_total_s
        assert "left (last launches:" in w.text()
