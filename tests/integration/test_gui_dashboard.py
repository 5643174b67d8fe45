"""The live dashboard's axes: one shared time axis that follows the data in steps and
leaves a user's zoom alone; telemetry y ranges that change only when the data leave
them. Real widgets, offscreen, fed through the same SeriesBank / ClientSeries the app uses."""
from __future__ import annotations

import pytest

from app.telemetry.series import Sample, SeriesBank
from app.loadgen.live import ClientSeries


@pytest.fixture
def dash(gui_guard, qtbot):
    from widgets.dashboard import Dashboard

    bank, client, now = SeriesBank(), ClientSeries(), [0.0]
    d = Dashboard(lambda: bank, lambda: client, lambda: now[0])
    qtbot.addWidget(d)
    d.resize(1200, 700)
    d.show()

    def feed(t: float, temp: float = 60.0) -> None:
        now[0] = t
        bank([Sample(t, f"gpu{g}", "temp_gpu_c", temp + g) for g in range(2)]
             + [Sample(t, f"gpu{g}", "power_w", 300.0) for g in range(2)]
             + [Sample(t, "metrics", "running", 4.0)])
        d.refresh(force=True)

    d.feed = feed
    yield d
    d.stop()


def _x(d):
    return d.plots["throughput"].vb.viewRange()[0]


def test_time_axis_follows_in_steps_and_keeps_a_users_zoom(dash):
    t = 5.0
    while t < 40.0:
        dash.feed(t)
        t += 0.25
    x0, x1 = _x(dash)
    assert x0 == pytest.approx(5.0) and 39.75 <= x1 <= 45.0
    # all six plots share the axis (pyqtgraph's x-link aligns them on screen: a plot
    # without a right-hand axis is wider and shows a little more to the right)
    for p in dash.plots.values():
        lo, hi = p.vb.viewRange()[0]
        assert lo == pytest.approx(x0) and hi >= x1 - 1e-6
    # a small advance stays inside the current step: the axis does not move (no re-render)
    dash.feed(40.0)
    assert _x(dash) == pytest.approx([x0, x1])
    # past the right edge it moves on
    dash.feed(x1 + 0.5)
    assert _x(dash)[1] > x1
    # a user's zoom is kept while data keep coming ...
    dash.plots["temp"].vb.setXRange(10.0, 20.0, padding=0)
    for k in range(8):
        dash.feed(x1 + 1.0 + k)
    assert _x(dash) == pytest.approx([10.0, 20.0])
    # ... until the auto-range button gives the axis back
    dash.plots["throughput"].vb.enableAutoRange(axis="x")
    dash.feed(x1 + 10.0)
    assert _x(dash)[0] == pytest.approx(5.0) and _x(dash)[1] >= x1 + 10.0


def test_a_running_ramp_holds_the_time_axis_on_its_planned_span(dash):
    from app.loadgen.spec import RampSpec

    spec = RampSpec(url="http://127.0.0.1:1", levels=[1, 2, 4], step_seconds=20, warmup_seconds=5)
    assert spec.planned_seconds == pytest.approx(75.0)
    assert RampSpec(url="http://127.0.0.1:1", levels=[1, 2], step_seconds=20,
                    max_total_seconds=30).planned_seconds == pytest.approx(30.0)
    assert RampSpec(url="http://127.0.0.1:1", levels=[1], step_seconds=None,
                    requests_per_level=10).planned_seconds is None
    dash.feed(5.0)
    dash.expect_until(5.0 + spec.planned_seconds)
    dash.feed(5.25)
    x0, x1 = _x(dash)
    assert x0 == pytest.approx(5.0) and 80.0 <= x1 <= 90.0
    moves = 0
    t = 5.5
    while t < 80.0:  # the whole ramp: the axis never moves
        dash.feed(t)
        moves += _x(dash) != pytest.approx([x0, x1])
        t += 0.5
    assert moves == 0
    dash.feed(x1 + 1.0)  # the drain runs past the plan: the axis follows again
    assert _x(dash)[1] > x1
    dash.expect_until(None)  # over: back to [first sample, now] in steps
    dash.feed(x1 + 1.5)
    assert x1 + 1.5 <= _x(dash)[1] <= x1 + 15.0


def test_throughput_range_holds_while_the_data_stay_inside_it(dash):
    client = dash.client_fn()
    from app.loadgen.records import RequestRecord
    import numpy as np

    def tokens(t0: float, n_chunks: int) -> None:
        offs = np.linspace(0.01, 1.9, n_chunks).astype(np.float32)
        client.add([RequestRecord(0, 1.0, t0, ttft=0.01, e2e=1.95, output_tokens=n_chunks, chunk_offsets=offs)])

    for b in range(10):
        tokens(2.0 * b, 1000 + 10 * (b % 3))  # ≈ 500 tok/s with jitter
    dash.feed(22.0)
    vb = dash.plots["throughput"].vb
    y = vb.viewRange()[1]
    assert y[0] == 0.0 and y[1] >= 510.0
    tokens(20.0, 1010)
    dash.feed(24.5)
    assert vb.viewRange()[1] == pytest.approx(y)
    tokens(22.0, 5000)  # 2500 tok/s: the range grows to hold it
    dash.feed(26.5)
    assert vb.viewRange()[1][1] >= 2500.0


def test_temperature_range_changes_only_when_the_data_leave_it(dash):
    for k in range(20):
        dash.feed(1.0 + k * 0.25, temp=60.0 + 0.1 * (k % 3))  # jitter inside one range
    vb = dash.plots["temp"].vb
    y = vb.viewRange()[1]
    assert y[0] <= 60.0 and y[1] >= 61.2
    dash.feed(7.0, temp=60.3)
    assert vb.viewRange()[1] == pytest.approx(y)
    dash.feed(7.25, temp=88.0)  # a hot card: the range grows to hold it
    y2 = vb.viewRange()[1]
    assert y2[1] >= 89.0 and y2 != pytest.approx(y)


def test_curves_legend_lists_only_what_is_drawn(gui_guard, qtbot):
    """A run without a plan shows no "predicted" entry; a knee entry only with a knee."""
    from app.engine.steptime import Curve, CurvePoint
    from widgets.results import CurvesView

    v = CurvesView()
    qtbot.addWidget(v)

    def names(plot):
        return [label.text for _, label in plot.legend.items]

    assert names(v.tput_plot) == ["measured"] and names(v.lat_plot) == ["measured"]
    pts = [CurvePoint(c, c, 0, 100.0 * c, 100.0, 0.05, 0.01, 1.0) for c in (1, 2, 4)]
    v.set_prediction(Curve(pts, 4, "max_num_seqs", 4, 512, 128))
    assert names(v.tput_plot) == ["measured", "predicted (plan)"]
    v.set_prediction(None)
    assert names(v.tput_plot) == ["measured"] and "predicted (plan)" not in names(v.lat_plot)


def test_latency_range_holds_in_half_decades(dash):
    client = dash.client_fn()
    from app.loadgen.records import RequestRecord
    import numpy as np

    def req(t0: float, ttft: float) -> None:
        offs = np.linspace(ttft, ttft + 1.0, 20).astype(np.float32)
        client.add([RequestRecord(0, 1.0, t0, ttft=ttft, e2e=ttft + 1.0, output_tokens=20, chunk_offsets=offs)])

    for k in range(8):
        req(2.0 * k, 0.2 + 0.01 * (k % 3))  # TTFT ≈ 200 ms, TPOT ≈ 53 ms
    dash.feed(18.0)
    vb = dash.plots["latency"].vb
    y = vb.viewRange()[1]  # log10(ms)
    assert y[0] <= np.log10(52) and y[1] >= np.log10(220) and (y[0] * 2).is_integer() and (y[1] * 2).is_integer()
    req(16.0, 0.21)
    dash.feed(20.0)
    assert vb.viewRange()[1] == pytest.approx(y)
    req(18.0, 4.0)  # a 4 s TTFT (ends at 23 s, its window closes at 24.5 s): the range grows
    dash.feed(26.0)
    assert vb.viewRange()[1][1] >= np.log10(4000)


def test_live_throughput_is_smoothed_over_a_window_the_legend_names(dash):
    """Issue 19, item 7: bursty 2 s bins (0 ↔ 290 tok/s) and their 10 s trailing mean,
    which stays near the rate; the legend names both windows."""
    import numpy as np

    from app.loadgen.live import trailing_mean

    bins = np.array([0.0, 290.0] * 10)
    m = trailing_mean(bins, 5)
    assert m[0] == 0.0 and m[1] == 145.0  # shorter windows at the start
    assert np.all(np.abs(m[5:] - 145.0) <= 29.0)  # 116 or 174: a fifth of the swing
    assert list(trailing_mean(np.array([1.0, 2.0, 3.0]), 1)) == [1.0, 2.0, 3.0]
    assert len(trailing_mean(np.zeros(0), 5)) == 0
    names = [label.text for _, label in dash.legends["throughput"].items]
    assert "2 s bins" in names and "10 s trailing mean" in names, names  # the axis says output tok/s


def test_any_live_plot_saves_as_png_or_svg(dash, tmp_path):
    tmp_path = tmp_path / "out"
    tmp_path.mkdir()
    """Issue 19, item 8: pyqtgraph's exporters behind the plots' Export…, from code."""
    import xml.etree.ElementTree as ET

    import pytest

    for t in (5.0, 10.0, 15.0):
        dash.feed(t)
    svg = dash.export_plot("temperature" if "temperature" in dash.plots else "throughput", tmp_path / "plot.svg")
    root = ET.parse(svg).getroot()
    assert root.tag.endswith("svg") and ("<path" in svg.read_text() or "<polyline" in svg.read_text())
    png = dash.export_plot("throughput", tmp_path / "plot.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="give a .png or .svg"):
        dash.export_plot("throughput", tmp_path / "plot.jpg")
    with pytest.raises(OSError, match="cannot write"):
        dash.export_plot("throughput", tmp_path / "no-such-dir" / "plot.png")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plot.png", "plot.svg"]  # no temporary left


def test_both_columns_of_the_live_tab_show_one_time_range(dash, qtbot):
    """Issue 19, item 7: every plot, left column and right, spans the same seconds."""
    for t in (5.0, 20.0, 35.0):
        dash.feed(t)
    qtbot.wait(50)
    ranges = {k: p.vb.viewRange()[0] for k, p in dash.plots.items()}
    lo, hi = ranges["throughput"]
    assert all(abs(a - lo) < 1e-6 * max(1.0, hi) and abs(b - hi) < 1e-6 * max(1.0, hi) for a, b in ranges.values()), \
        ranges
