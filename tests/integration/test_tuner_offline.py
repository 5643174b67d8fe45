"""Whole tunes on a hidden true rig (app.tuner.offline: the perturbed sim's engine without
HTTP, issue 18): the pick against the best of the space, the budget, the state in the run
store, the resume after an interruption, a thermal stop, a tune over hosts. Each runs the
tuner's whole loop — its launches' capacity searches and its re-predictions of every
candidate on the step-level engine — which is this tier's kind of test (the sim's engine)
and 50 CPU s together; the tuner's arithmetic (space, pruning, fit) stays in
tests/unit/test_tuner.py, whose helpers these use. One file, so that one xdist worker runs
them and shares the engine's ramp cache (app/planner/predict.py)."""
from __future__ import annotations

import pytest

from app.config import ServerConfig
from app.store import RunStore
from app.tuner.offline import OfflineRig
from app.tuner.report import summary_text
from app.tuner.space import TuneSpace, enumerate_candidates, recommended_max_num_seqs
from app.tuner.tune import Measurement, TuneAborted, Tuner, TuneSpec
from tests.unit.test_tuner import SMALL, rig_spec, spec_of


def best_of_space(spec: TuneSpec, truth: OfflineRig) -> tuple[str, float]:
    cands = enumerate_candidates(spec.config, truth.cards, spec.space, spec.workload(), spec.vllm_version)
    caps = {}
    for c in cands:
        if c.pruned_because is None:
            pred, _ = truth.search(c.config)
            caps[c.key] = pred.capacity.users
    best = max(caps, key=caps.get)
    return best, caps[best], caps


@pytest.mark.long(30)  # seconds on 2 cores: opens an xdist chunk (tests/plugins/order.py)
def test_a_tune_on_a_hidden_true_rig(tmp_path):
    """Seed 103's true rig is slower than the planner thinks; the tuner measures, fits,
    re-ranks and confirms within 4 launches, and its pick serves ≥ 0.9 of the best
    configuration of the space (each judged by one capacity search on the true rig). The
    state is in the run store, the JSON has every field the issue asks for."""
    spec = spec_of(SMALL)
    truth = OfflineRig(spec, 103)
    with RunStore(tmp_path / "runs.sqlite") as store:
        t = Tuner(spec, store=store, rig=truth)
        st = t.run()
        res = t.result()
        row = store.get_tune(t.tune_id)
    assert row["status"] == "done" and row["state"]["phase"] == "done"
    assert 1 <= res["launches"] == truth.launches <= 4
    assert res["launches"] == len(st.launches) and st.launches[-1].purpose == "confirm"
    rec = res["recommendation"]
    assert rec["verified"] and rec["users"] >= 1 and rec["output_tps"] > 0 and rec["sentence"]
    assert all(v is not None for v in rec["server"].values())
    best = next(c for c in st.candidates if c.key == rec["key"])  # max_num_seqs per engine, from its share
    capped = recommended_max_num_seqs(best.measured_users / rec["server"]["data_parallel_size"], 512)
    confirm = next(x for x in st.launches if x.purpose == "confirm")
    if rec["server"]["max_num_seqs"] != capped:
        # the capped max_num_seqs served fewer users on the confirming launch (data parallel replicas
        # loaded unevenly past their share): the flags stay as measured, and the sentence says why
        assert rec["server"]["max_num_seqs"] == 512 and confirm.users < best.measured_users
        assert f"with max_num_seqs {capped} instead of 512 the confirming launch measured" in rec["sentence"]
        assert "max_num_seqs stays 512" in rec["sentence"]
    assert isinstance(rec["server"]["enforce_eager"], bool)
    best_key, best_users, caps = best_of_space(spec, truth)
    assert caps[rec["key"]] >= 0.9 * best_users, (rec["key"], caps[rec["key"]], best_key, best_users)
    assert res["rig_seconds"] > 0 and res["stop_reason"]
    for c in res["candidates"]:
        assert set(c) >= {"server", "predicted_users", "measured_users", "pruned_because"}
    measured = [c for c in res["candidates"] if c["measured_users"] is not None]
    assert len(measured) == res["launches"] - 1  # the confirming launch measures a measured one again
    assert res["baseline"]["server"]["tensor_parallel_size"] == 8 and res["runner_up"] is not None
    # how far the model behind the predictions is from published runs on these cards (issue 34 item 5)
    err = res["model_error"]
    assert err["gpu"] == "RTX 4090" and err["text"].startswith("model error ") and err["points"] >= 3
    assert f"predictions above (before fitting to these launches): {err['text']}" in summary_text(res)
    # how sure (issue 35 item 2): the families measured, the residual, each untried value and why
    conf = res["confidence"]
    layouts = conf["families"]["layout"]
    launched = {x["key"].split(" · ")[0] for x in res["launch_log"] if x["purpose"] == "measure"}
    assert set(layouts["measured"]) == launched and rec["key"].split(" · ")[0] in launched
    assert {u["value"] for u in layouts["untried"]} == {c["key"].split(" · ")[0] for c in res["candidates"]} - launched
    assert all(u["why"] for u in layouts["untried"])
    assert any(u["why"].startswith("the planner: weights_do_not_fit") for u in layouts["untried"])  # TP1 × DP8
    assert conf["measured"] == len(measured) and conf["residual"] >= 0.1
    text = summary_text(res)
    assert f"how sure: {conf['measured']} of {conf['startable']} startable configurations measured" in text
    assert "layouts (TP × PP × DP): measured " in text and "TP1 PP1 DP8: the planner: weights_do_not_fit" in text


class _StopAt:
    """A true rig whose n-th launch is cut off (the user's Ctrl-C)."""

    def __init__(self, rig: OfflineRig, n: int) -> None:
        self.rig, self.n, self.tuner = rig, n, None

    def measure(self, cfg, ramp, record, check_abort):
        if self.rig.launches + 1 == self.n:
            self.tuner.abort()
            check_abort()
        return self.rig.measure(cfg, ramp, record, check_abort)


@pytest.mark.long(25)  # seconds on 2 cores: opens an xdist chunk (tests/plugins/order.py)
def test_an_interrupted_tune_resumes_where_it_stopped(tmp_path):
    spec = spec_of(SMALL, max_launches=4)
    truth = OfflineRig(spec, 103)
    cut = _StopAt(truth, 2)
    with RunStore(tmp_path / "runs.sqlite") as store:
        t = Tuner(spec, store=store, rig=cut)
        cut.tuner = t
        with pytest.raises(TuneAborted):
            t.run()
        row = store.get_tune(t.tune_id)
        assert row["status"] == "interrupted"
        first = [c for c in row["state"]["candidates"] if c["measured_users"] is not None]
        assert len(first) == 1 and truth.launches == 1
        again = OfflineRig(spec, 103)
        r = Tuner.resume(store, t.tune_id, rig=again)
        r.run()
        res = r.result()
        assert store.get_tune(t.tune_id)["status"] == "done"
        with pytest.raises(ValueError, match="is finished"):
            Tuner.resume(store, t.tune_id, rig=again)
    assert res["launches"] <= 4 and again.launches == res["launches"] - 1  # the first is not measured again
    assert any(c["key"] == first[0]["key"] and c["measured_users"] == first[0]["measured_users"]
               for c in res["candidates"])
    assert res["recommendation"] is not None


class _HotAt:
    """A true rig whose n-th launch hits the run controller's thermal stop."""

    SENTENCE = "safety stop: GPU 3 reached 84 °C, within 3 °C of its slowdown temperature 87 °C"

    def __init__(self, rig: OfflineRig, n: int) -> None:
        self.rig, self.n = rig, n

    def measure(self, cfg, ramp, record, check_abort):
        if self.rig.launches + 1 == self.n:
            self.rig.launches += 1
            return Measurement(status="safety", error=self.SENTENCE, run_id=7, rig_seconds=30.0)
        return self.rig.measure(cfg, ramp, record, check_abort)


@pytest.mark.parametrize("hot_at", [1, 2])
def test_a_thermal_stop_ends_the_tune_in_the_controllers_words(tmp_path, hot_at):
    """A launch stopped for heat ends the tune: no further launch (no confirming one), the
    controller's sentence is the tune's stop reason and the failed launch's error; what was
    measured before stays, unconfirmed."""
    spec = spec_of(SMALL, max_launches=4)
    hot = _HotAt(OfflineRig(spec, 103), hot_at)
    with RunStore(tmp_path / "runs.sqlite") as store:
        t = Tuner(spec, store=store, rig=hot)
        t.run()
        res = t.result()
        assert store.get_tune(t.tune_id)["status"] == "done"
    assert res["stop_reason"] == res["safety_stop"] == _HotAt.SENTENCE
    assert hot.rig.launches == res["launches"] == hot_at
    assert res["launch_log"][-1]["status"] == "safety" and res["launch_log"][-1]["error"] == _HotAt.SENTENCE
    if hot_at == 1:
        assert res["recommendation"] is None
    else:
        rec = res["recommendation"]
        assert rec is not None and not rec["verified"] and _HotAt.SENTENCE in rec["sentence"]


def test_a_tune_over_hosts_on_the_hidden_true_rig_launches_only_what_the_plan_accepts(tmp_path):
    """A two-launch tune over two hosts of 4 cards on the hidden true rig (the perturbed
    sim's engine, on the rig's link): every launch is of a layout the rig's launch plan
    accepts, the recommendation is one, and the starting flags (TP 8: the group would span
    the hosts) are reported as unable to start, with the plan's reason."""
    from app.hosts.plan import launch_plan

    space = TuneSpace(tp=[8, 4, 2], kv_cache_dtype=["auto"], enforce_eager=[False], max_num_batched_tokens=[2048])
    spec = rig_spec(space, max_launches=2)
    with RunStore(tmp_path / "runs.sqlite") as store:
        t = Tuner(spec, store=store, rig=OfflineRig(spec, 103))
        t.run()
        res = t.result()
    launched = {x["key"] for x in res["launch_log"]}
    assert res["launches"] == 2 and launched
    for c in res["candidates"]:
        if c["key"] in launched:
            assert c["pruned_because"] is None
            launch_plan(list(spec.hosts), ServerConfig(**c["server"]))  # accepted: raises otherwise
    assert all(c["pruned_because"].startswith("launch_plan: ") for c in res["candidates"]
               if c["key"].startswith("TP8 "))
    rec = res["recommendation"]
    assert rec is not None and rec["server"]["tensor_parallel_size"] <= 4
    launch_plan(list(spec.hosts), ServerConfig(**rec["server"]))
    base = res["baseline"]
    assert base["users"] is None and base["error"].startswith(
        "cannot start: launch_plan: a tensor-parallel group of 8 would span hosts"), base
