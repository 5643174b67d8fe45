"""One profile, two front ends, one run controller: ``vllm-dyno run`` (ProfileRun) and the
window (Launch → Run ramp) against the same simulated rig store the same run — the
same rows, keys and settings, the same summary, the same safety limit — field by field,
times and measured figures aside (the figures are compared loosely: both measure the
same seeded sim)."""
from __future__ import annotations

import pytest

from app.profiles import ProfileLibrary, parse_profile
from app.run.profile_run import ProfileRun
from app.store import RunStore
from tests.plugins.qt import pump

PROFILE = """\
schema_version: 1
name: frontends
engine: sim
sim: {gpu: RTX 4090, count: 2, time_scale: 10, seed: 1}
server:
  model: Qwen/Qwen2.5-7B-Instruct
  served-model-name: q7
  tensor-parallel-size: 2
  max-num-seqs: 16
  max-model-len: 4096
ramp: {levels: [1, 4], step_seconds: 15, warmup_seconds: 2, prompt_tokens: 128, output_tokens: 32,
       slo: {ttft_p99: 5.0}}
hardware: {gpu: RTX 4090, count: 2}
"""

#: fields of a stored level that are the level's identity, not a measurement
LEVEL_IDENTITY = ("idx", "level", "mode", "stop_reason", "steady")
#: summary keys whose values must be equal (the rest are measured or times)
SUMMARY_EQUAL = ("status", "gpu_count", "time_scale", "model")


def _stored(store: RunStore, run_id: int) -> dict:
    run = store.get_run(run_id)
    return {"run": run, "levels": store.levels(run_id), "requests": store.requests(run_id),
            "sample_names": {(src.rstrip("0123456789"), name) for _, src, name, _ in store.samples(run_id)},
            "log": store.log_lines(run_id)}


def _spec_without_url(spec: dict) -> dict:
    return {k: v for k, v in spec.items() if k not in ("url",)}


def test_headless_and_window_store_the_same_run(main_window, qtbot, tmp_path):
    prof = parse_profile(PROFILE)
    # headless
    with RunStore(tmp_path / "headless.sqlite") as hs:
        res = ProfileRun(prof, store=hs, startup_timeout=120, grace=5).run()
        assert res.status == "done", res.reason
        head = _stored(hs, res.run_id)
    # the window, on the same profile
    ProfileLibrary().save(prof)
    w = main_window
    w.sim_time_scale = 10.0
    assert w.load_profile("frontends", quiet=True)
    pump(qtbot, lambda: w.plan is not None and not w.planner.busy and not w.planner._timer.isActive(), 30,
         "the profile is planned")
    w.act_launch.trigger()
    pump(qtbot, lambda: w.controller.state in ("ready", "failed"), 60, "the sim becomes ready")
    assert w.controller.state == "ready"
    recorded: list[int] = []
    w.controller.run_recorded.connect(recorded.append)
    w.act_ramp.trigger()
    pump(qtbot, lambda: bool(recorded), 120, "the window's ramp is recorded")
    gui = _stored(w.run_store(), recorded[0])

    a, b = head["run"], gui["run"]
    assert (a["name"], a["engine"], a["status"]) == (b["name"], b["engine"], b["status"]) == ("frontends", "sim", "done")
    # the same settings: the launch config (the form may spell defaults out) and argv
    assert a["config"]["profile"]["name"] == b["config"]["profile"]["name"]
    assert a["config"]["server"] == b["config"]["server"] | {"port": a["config"]["server"]["port"]}
    assert len(a["config"]["argv"]) == len(b["config"]["argv"])
    # the same ramp, safety limit applied the same way
    assert _spec_without_url(a["spec"]) == _spec_without_url(b["spec"])
    assert a["plan"]["verdict"] == b["plan"]["verdict"]
    assert a["capacity"]["kv_cache_tokens"] == b["capacity"]["kv_cache_tokens"]
    sa, sb = a["summary"], b["summary"]
    assert sorted(sa) == sorted(sb)
    assert {k: sa[k] for k in SUMMARY_EQUAL} == {k: sb[k] for k in SUMMARY_EQUAL}
    assert (sa["hardware"]["gpu"], sa["hardware"]["count"]) == (sb["hardware"]["gpu"], sb["hardware"]["count"])
    assert sa["peak_level"] == sb["peak_level"]
    assert sorted(sa["results"]) == sorted(sb["results"])
    # levels: written once each, in rig seconds, the same columns
    assert [tuple(d[k] for k in LEVEL_IDENTITY) for d in head["levels"]] == \
        [tuple(d[k] for k in LEVEL_IDENTITY) for d in gui["levels"]]
    for la, lb in zip(head["levels"], gui["levels"]):
        assert sorted(la) == sorted(lb)
        assert la["output_tps"] == pytest.approx(lb["output_tps"], rel=0.3)
        assert la["window_s"] == pytest.approx(lb["window_s"], rel=0.1)  # rig seconds in both
    assert head["requests"] and gui["requests"]
    assert sorted(head["requests"][0]) == sorted(gui["requests"][0])
    assert head["sample_names"] == gui["sample_names"]
    assert head["log"] and gui["log"]
    w.act_stop.trigger()
    pump(qtbot, lambda: w.controller.state == "stopped", 60, "the server stops")
