"""Issue 19, item 8: a run as one self-contained HTML report, rendered by a real headless
Chromium (Debian's package, installed by scripts/setup-system.sh): it renders offline,
holds no script and no external reference, and the numbers it shows are the run
store's. The run is a real one: the simulated rig through the run controller, with
telemetry, into a real SQLite store; the report comes from `vllm-dyno runs export ID
--format html`."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import pytest

from app.config import ServerConfig
from app.loadgen.spec import SLO, RampSpec
from app.run.controller import LaunchTarget, RecordSpec, RunController
from app.store import RunStore

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
RIG = ["--sim-gpu", "RTX 4090", "--sim-gpu-count", "2", "--sim-time-scale", "10", "--sim-seed", "1"]
CFG = ServerConfig(model="Qwen/Qwen2.5-7B-Instruct", served_model_name="q7", tensor_parallel_size=2, max_num_seqs=16,
                   max_model_len=4096, env={"NCCL_P2P_DISABLE": "1"})


def _chromium(*args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed: scripts/setup-system.sh installs it (make system)")
        pytest.skip("chromium is not installed (make system installs it)")
    profile = tempfile.mkdtemp(prefix="chromium-")  # a new empty profile: nothing of the user's is read
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--user-data-dir=" + profile]
    try:
        return subprocess.run([CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=timeout)
    finally:
        shutil.rmtree(profile, ignore_errors=True)


class _Table(HTMLParser):
    """The rows of the table with id ``levels`` as lists of cell texts."""

    def __init__(self, table_id: str) -> None:
        super().__init__()
        self.id, self.inside, self.rows, self.cell = table_id, False, [], None

    def handle_starttag(self, tag, attrs):
        if tag == "table" and dict(attrs).get("id") == self.id:
            self.inside = True
        elif self.inside and tag == "tr":
            self.rows.append([])
        elif self.inside and tag in ("td", "th"):
            self.cell = ""

    def handle_endtag(self, tag):
        if tag == "table" and self.inside:
            self.inside = False
        elif self.inside and tag in ("td", "th") and self.cell is not None:
            self.rows[-1].append(self.cell.strip())
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell += data


@pytest.fixture
def recorded(tmp_path, dyno_home):
    with RunStore() as store:  # the default store under VLLM_DYNO_HOME, as the CLI reads it
        ctl = RunController(store=store)
        try:
            assert ctl.launch(LaunchTarget("sim", CFG, sim_args=RIG)) == []
            assert ctl.wait_ready(60), ctl.failure_text
            out = ctl.ramp(RampSpec(url=ctl.url, model="q7", levels=[1, 2, 4], step_seconds=10, warmup_seconds=1,
                                    prompt_tokens=64, output_tokens=32, slo=SLO(ttft_p99=2.0)),
                           record=RecordSpec(name="report <test> & run"), timeout=120)
            assert out.status == "done" and out.run_id is not None, out.stop_reason
        finally:
            ctl.close()
        store.flush()
        return out.run_id, store.levels(out.run_id), store.get_run(out.run_id)


def test_the_report_renders_offline_in_chromium_with_the_stores_numbers(recorded, tmp_path):
    rid, levels, run = recorded
    html_path = tmp_path / "run.html"
    r = subprocess.run([sys.executable, "-m", "app.cli", "runs", "export", str(rid), "--format", "html", "-o",
                        str(html_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    text = html_path.read_text()
    # self-contained: no script, no stylesheet or image fetched from anywhere
    assert "<script" not in text.lower() and not re.search(r"""(src|href)\s*=\s*["']?(https?:|//|file:)""", text)
    assert "report &lt;test&gt; &amp; run" in text  # the run's name is escaped, not markup
    dom = _chromium("--dump-dom", html_path.as_uri())
    assert dom.returncode == 0 and "<h1>" in dom.stdout, dom.stderr[-2000:]
    page = dom.stdout
    assert "Run #%d" % rid in page
    sentence = run["summary"]["verdict"]["sentence"]
    assert sentence.split(" — ")[0].replace("&", "&amp;") in page  # the verdict
    assert "vllm serve Qwen/Qwen2.5-7B-Instruct" in page and "--tensor-parallel-size 2" in page
    assert "tensor-parallel-size: 2" in page and "max-num-seqs: 16" in page  # the --config YAML
    assert "NCCL_P2P_DISABLE=1" in page and "2× RTX 4090" in page
    t = _Table("levels")
    t.feed(page)
    head, body = t.rows[0], t.rows[1:]
    # the columns of the metric vocabulary (app.metrics), by their headers: issue 38 added "rejected"
    assert head[:3] == ["level", "requests", "failures"] and "rejected" in head and len(body) == len(levels) == 3
    i_tps = head.index("out tok/s")
    i_ttft = next(i for i, h in enumerate(head) if "TTFT" in h and "p99" in h)
    for row, lv in zip(body, sorted(levels, key=lambda d: d["idx"])):
        assert float(row[0]) == lv["level"]
        assert int(row[1]) == lv["n_measured"]
        assert float(row[i_tps].replace(",", "")) == pytest.approx(lv["output_tps"], abs=0.051)
        assert float(row[i_ttft].replace(",", "")) == pytest.approx(lv["ttft_p99"] * 1000, abs=0.51)
        assert row[-1] in ("met", "") or row[-1].startswith("broken")
    srv = _Table("server")  # client vs server, from the sim's /metrics over each level's window
    srv.feed(page)
    assert srv.rows[0][:2] == ["Level", "Cache reset"] and len(srv.rows) == 1 + len(levels)
    assert all("‡" in r[5] for r in srv.rows[1:]) and "Level 4</b>: TTFT:" in page
    tel = _Table("telemetry")
    tel.feed(page)
    assert any(r[0] == "power" for r in tel.rows[1:]), tel.rows  # the rig's cards were sampled
    assert page.count("<svg") == 1 and "<polyline" in page  # the curves, as vector graphics
    shot = tmp_path / "report.png"
    s = _chromium("--screenshot=" + str(shot), "--window-size=1200,1800", "--hide-scrollbars", html_path.as_uri())
    assert s.returncode == 0 and shot.stat().st_size > 20_000, s.stderr[-2000:]


def test_every_telemetry_row_names_a_series_its_producer_declares():
    """A row asking for a series no producer writes would be silently empty in every
    report (it was: ``mem_used_gib``, ``kv_cache_usage_pct``)."""
    from app.report import TELEMETRY
    from app.telemetry.names import PRODUCERS

    bad = [(r.what, r.producer, r.series) for r in TELEMETRY
           if r.producer not in PRODUCERS or r.series not in PRODUCERS[r.producer]]
    assert bad == [], f"report rows naming series no producer writes: {bad}"
    assert {r.what for r in TELEMETRY} >= {"memory used", "KV cache usage"}


def test_every_telemetry_row_of_a_sim_run_shows_the_stores_mean(recorded, dyno_home):
    """The report of a sim run has every telemetry row — memory used (GiB) and KV cache
    usage (%) among them — and each row's mean is the stored series' mean, converted,
    within 1 %; every series the run stored is one its producer declares."""
    from app.report import TELEMETRY, run_report
    from app.telemetry.names import PRODUCERS, producer_of

    rid = recorded[0]
    with RunStore() as store:
        samples = store.samples(rid)
        page = run_report(store, rid)
    undeclared = {(src, name) for _, src, name, _ in samples
                  if name not in PRODUCERS.get(producer_of(src) or "", {})}
    assert undeclared == set(), f"stored series no producer declares: {sorted(undeclared)}"
    t = _Table("telemetry")
    t.feed(page)
    assert t.rows[0] == ["series", "source", "samples", "mean", "max"]
    shown = {(r[0], r[1]): r for r in t.rows[1:]}
    assert {r.what for r in TELEMETRY} == {what for what, _ in shown}, shown.keys()
    for row in TELEMETRY:
        sources = [src for what, src in shown if what == row.what]
        assert sources and all(producer_of(src) == row.producer for src in sources), (row, sources)
        for src in sources:
            vals = [v for _, s_, name, v in samples if s_ == src and name == row.series and v is not None]
            cells = shown[(row.what, src)]
            assert int(cells[2]) == len(vals) > 0
            mean = sum(vals) / len(vals) * row.scale
            number, unit = cells[3].rsplit(" ", 1) if row.unit else (cells[3], "")
            assert unit == row.unit
            assert float(number) == pytest.approx(mean, rel=0.01, abs=1e-9), (row.what, src, cells, mean)
    memory = [float(r[3].split()[0]) for (what, _), r in shown.items() if what == "memory used"]
    assert all(1.0 < m < 24.0 for m in memory), memory  # GiB of a 24 GiB card, not bytes
    kv = [float(r[4].split()[0]) for (what, _), r in shown.items() if what == "KV cache usage"]
    assert kv and all(0.0 < m <= 100.0 for m in kv), kv  # a percentage, not a fraction


def _level(idx, level, tps, ttft):
    return {"idx": idx, "level": level, "mode": "concurrency", "t_start": 10.0 * idx, "t_end": 10.0 * idx + 9,
            "window_start": 10.0 * idx, "window_end": 10.0 * idx + 8, "window_s": 8.0, "n_measured": 40, "n_ok": 40,
            "output_tps": tps, "rps": tps / 100, "ttft_p99": ttft, "tpot_p99": 0.02, "failure_rate": 0.0,
            "slo_broken": []}


def test_a_comparison_report_says_what_differs_and_why_it_is_not_comparable(tmp_path, dyno_home):
    with RunStore() as store:
        ids = []
        for name, model, hw, tps in (("70B on 8 cards", "meta-llama/Llama-3.1-70B-Instruct",
                                      {"gpu": "RTX 4090", "count": 8}, (100.0, 700.0)),
                                     ("tiny on the CPU", "./build/tiny-llama", {"gpu": "CPU", "count": 1}, (300.0, 900.0))):
            rid = store.create_run(name, "vllm", config={"server": {"model": model}},
                                   spec={"prompt_tokens": 512, "output_tokens": 128})
            for i, (lv, t) in enumerate(zip((1, 8), tps)):
                store.add_level(rid, _level(i, lv, t, 0.1 * (i + 1)))
            store.finish_run(rid, "done", summary={"gpu_count": hw["count"], "hardware": hw})
            ids.append(rid)
        store.flush()
    out = tmp_path / "cmp.html"
    r = subprocess.run([sys.executable, "-m", "app.cli", "compare", *map(str, ids), "--html", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "<script" not in out.read_text().lower()
    page = _chromium("--dump-dom", out.as_uri()).stdout
    assert "Not comparable" in page and "different models" in page and "the CPU build beside GPUs" in page
    diff = _Table("diff")
    diff.feed(page)
    assert ["rig", "cards", "8× RTX 4090", "1× CPU"] in diff.rows, diff.rows
    levels = _Table("levels")
    levels.feed(page)
    assert len(levels.rows) == 5 and all(row[7] == "–" for row in levels.rows[1:])  # no scaling efficiency
    assert [row[3] for row in levels.rows[1:]] == ["100.0", "700.0", "300.0", "900.0"]


def test_a_tune_report_shows_the_recommendation_and_every_candidate(tmp_path, dyno_home):
    from app.tuner.offline import OfflineRig
    from app.tuner.tune import Tuner
    from tests.unit.test_tuner import SMALL, spec_of

    spec = spec_of(SMALL)
    with RunStore() as store:
        t = Tuner(spec, store=store, rig=OfflineRig(spec, 103))
        t.run()
        res = t.result()
    out = tmp_path / "tune.html"
    r = subprocess.run([sys.executable, "-m", "app.cli", "tune", "--show", str(t.tune_id), "--html", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    page = _chromium("--dump-dom", out.as_uri()).stdout
    rec = res["recommendation"]
    assert f"Tune {t.tune_id}" in page and "Recommended" in page and "vllm serve " in page
    assert f"{rec['users']:g} users ({rec['users_low']:g}–{rec['users_high']:g})" in page
    cands = _Table("candidates")
    cands.feed(page)
    assert len(cands.rows) - 1 == len(res["candidates"])
    assert {row[0] for row in cands.rows[1:]} == {c["key"] for c in res["candidates"]}
    measured = {c["key"]: c["measured_users"] for c in res["candidates"] if c["measured_users"] is not None}
    assert measured and all(float(row[2]) == measured[row[0]] for row in cands.rows[1:] if row[0] in measured)
