"""Issue 37's smaller texts (item 8), each where it is decided: the History tab's tok/s
column says it is the figure at the SLO; session time reads as a clock, never "ks"; a
failure that names its cause is not followed by "No known cause found in the log"."""
from __future__ import annotations

import pytest

from app import history
from app.clock import CLOCK_STEPS, clock_text, clock_ticks
from app.planner.diagnose import undiagnosed_note
from app.server.supervisor import EXIT_REASONS


def _row(tps, users):
    return history.RunRow(id=1, created=0.0, name="r", engine="sim", status="done", peak_output_tps=tps,
                          peak_level=8.0, gpu_count=8, users_at_slo=users)


def test_the_history_tok_s_column_is_labelled_for_what_it_is():
    heads = [h for h, _ in history.RUN_COLUMNS]
    assert "Peak out tok/s" not in heads and "Out tok/s at SLO" in heads
    tip = dict(history.RUN_COLUMNS)["Out tok/s at SLO"]
    assert "met the SLO" in tip
    assert history.peak_text(_row(1234.4, 19.0)) == "1,234"
    assert history.peak_text(_row(1234.4, 0.0)) == "1,234 (SLO not met)"  # no level met it: the best of all
    assert history.peak_text(_row(1234.4, None)) == "1,234"  # no SLO: the best level's
    assert history.peak_text(_row(None, None)) == "–"


@pytest.mark.parametrize("s, text", [(0, "0:00"), (59.6, "1:00"), (1020, "17:00"), (1234, "20:34"),
                                     (3600, "1:00:00"), (3723, "1:02:03"), (-5, "0:00")])
def test_session_time_reads_as_a_clock(s, text):
    assert clock_text(s) == text and "k" not in clock_text(s)


def test_clock_ticks_are_clock_steps_whatever_the_span():
    for lo, hi in ((0, 30), (0, 1020), (950, 1300), (0, 3 * 3600), (12.5, 13.0)):
        step, values = clock_ticks(lo, hi, 8)
        assert step in CLOCK_STEPS and values and len(values) <= 9, (lo, hi, step, values)
        assert all(lo <= v <= hi and v % step == 0 for v in values), (lo, hi, values)
    assert clock_ticks(0, 1020, 8)[0] == 300  # 17 minutes: every 5 min (0:00 … 15:00), not 1 ks
    assert [clock_text(v) for v in clock_ticks(0, 1020, 8)[1]] == ["0:00", "5:00", "10:00", "15:00"]


def test_no_known_cause_only_where_the_log_would_have_said_it():
    for opening in EXIT_REASONS:
        assert undiagnosed_note(f"{opening} 1 during startup", None).startswith("No known cause found in the log")
    exact = ("model directory /models/llama not found: give an existing directory or a Hugging Face id\n"
             "(the form's Model field)")
    assert undiagnosed_note(exact, None) == "(the form's Model field)"  # its further lines, no "no known cause"
    assert undiagnosed_note("host 10.0.0.2 was lost: connection reset", None) == ""
    assert undiagnosed_note("the server was ended by signal 15 (SIGTERM) during startup, not by vLLM Dyno",
                            None) == ""
    assert undiagnosed_note("the server exited with code 1 during startup", object()) == ""  # a diagnosis
