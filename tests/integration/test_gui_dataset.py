"""Issue 20 item 1 in the GUI: choosing a prompts file shows its prompt/output length
histograms under the field (the lengths the ramp will send), a bad file says why, and
the plan is re-predicted with the dataset's lengths."""
from __future__ import annotations

import json
import os

from tests.plugins.qt import pump


def test_a_prompts_file_shows_its_length_histograms(main_window, qtbot, tmp_path):
    w = main_window
    view = w.ramp.lengths_view
    assert not view.isVisible()
    w.left_tabs.setCurrentWidget(w.ramp)
    w.ramp.prompts_file.setText("builtin:chat")
    pump(qtbot, lambda: view.lengths is not None, 10, "the histograms of builtin:chat are shown")
    assert view.isVisibleTo(w.ramp) and view.lengths["entries"] == 1000
    bars = [i for i in view.plots["prompt"].getPlotItem().items if i.__class__.__name__ == "BarGraphItem"]
    assert len(bars) == 1 and sum(view.lengths["prompt"]["counts"]) == view.lengths["prompt"]["n"]
    assert "builtin:chat: 1000 entries" in view.caption.text() and "prompt: mean" in view.stats.text()
    out = os.environ.get("DATASET_SHOT")
    if out:  # a look at it: DATASET_SHOT=/tmp/x.png pytest tests/integration/test_gui_dataset.py
        w.resize(1600, 1000)
        pump(qtbot, lambda: True, 0.5, "")
        w.grab().save(out)
    # a ShareGPT file: its answers' lengths
    f = tmp_path / "sg.json"
    f.write_text(json.dumps([{"conversations": [{"from": "human", "value": "a b c"},
                                                {"from": "gpt", "value": " ".join(["x"] * n)}]} for n in (5, 50)]))
    w.ramp.prompts_file.setText(str(f))
    pump(qtbot, lambda: view.lengths is not None and view.lengths["entries"] == 2, 10, "the file's histograms")
    assert view.lengths["output"]["max"] == 50 and view.lengths["prompt"]["max"] == 3
    # a bad file: the reason, in red, no plot
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n{oops\n')
    w.ramp.prompts_file.setText(str(bad))
    pump(qtbot, lambda: "line 2: not JSON" in view.caption.text(), 10, "the bad file's line is named")
    assert view.lengths is None and not view.plots["prompt"].isVisibleTo(view)
    w.ramp.prompts_file.setText("")
    pump(qtbot, lambda: not view.isVisibleTo(w.ramp), 10, "no file: no histogram")
