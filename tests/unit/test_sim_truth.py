"""A simulated rig's truth (issue 35, item 1; app.profiles.truth, docs/sim-truth.md): the
format's refusals (each with its place, what is wrong and the fix), hostile files, rule
matching, the engine's per-step hook changing step times only where a rule's
conditions hold, the KV share, the ways a truth travels (a file on the CLI, a profile's
inline mapping, the sim server's argv) and the offline rig under a truth."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from app.config import ServerConfig
from app.engine.steptime import AdjustedStepTimeModel, StepTimeModel
from app.planner.plan import Workload
from app.profiles.truth import (TruthError, facts_of, holds, load_truth, parse_truth, truth_argument)
from app.tuner.offline import OfflineRig
from app.tuner.space import TuneSpace
from tests.unit.test_sim_rig_options import rig_plan
from tests.unit.test_tuner import spec_of

ROOT = Path(__file__).resolve().parents[2]
QWEN7 = "Qwen/Qwen2.5-7B-Instruct"
W = Workload.of(256, 128, (8,), length_spread=0.0)


def plan7(**kw):
    return rig_plan(ServerConfig(model=QWEN7, max_model_len=2048, **kw), workload=W)


# ---------------------------------------------------------------------- refusals
#: a truth's mapping → (the place the refusal names, words of its reason and fix)
REFUSALS = {
    "unknown top key": ({"nam": "x"}, "nam", "unknown key 'nam': use one of name, terms, rules"),
    "unknown term": ({"terms": {"eta_men": 0.9}}, "terms.eta_men", "unknown term 'eta_men': use one of eta_mem"),
    "unknown term in scale": ({"rules": [{"scale": {"alpha": 2}}]}, "rules[0].scale.alpha",
                              "unknown term 'alpha': use one of eta_mem"),
    "unknown condition": ({"rules": [{"when": {"gpus": "RTX 4090"}, "add_step_s": 0.001}]}, "rules[0].when.gpus",
                          "unknown condition 'gpus': use one of gpu, tensor_parallel_size"),
    "unknown rule key": ({"rules": [{"scal": {"eta_mem": 1}}]}, "rules[0].scal",
                         "unknown rule key 'scal': use one of when, scale, add_step_s"),
    "unknown range key": ({"rules": [{"when": {"decode_batch": {"from": 4}}, "add_step_s": 0.001}]},
                          "rules[0].when.decode_batch.from", "unknown range key 'from': use one of min, max"),
    "no action": ({"rules": [{"when": {"tensor_parallel_size": 2}}]}, "rules[0]",
                  "a rule without an action: give one or more of scale, add_step_s"),
    "unknown gpu": ({"rules": [{"when": {"gpu": "RTX 9999"}, "add_step_s": 0.001}]}, "rules[0].when.gpu",
                    "'RTX 9999' is not in the catalog"),
    "zero factor": ({"terms": {"eta_mem": 0}}, "terms.eta_mem", "0 is out of range: give a factor between 0.001"),
    "text factor": ({"terms": {"eta_mem": "fast"}}, "terms.eta_mem", "'fast' is not a number: give a factor"),
    "bool factor": ({"terms": {"eta_mem": True}}, "terms.eta_mem", "True is not a number"),
    "negative seconds": ({"rules": [{"add_step_s": -0.1}]}, "rules[0].add_step_s",
                         "-0.1 is out of range: give seconds between 0 and 10"),
    "kv grows": ({"rules": [{"kv_tokens_scale": 1.5}]}, "rules[0].kv_tokens_scale",
                 "cannot outgrow the memory planned for it; give a factor ≤ 1"),
    "kv per step": ({"rules": [{"when": {"decode_batch": {"min": 8}}, "kv_tokens_scale": 0.5}]}, "rules[0]",
                    "kv_tokens_scale is fixed for a configuration, and the rule has a step condition (decode_batch)"),
    "request time per step": ({"rules": [{"when": {"prefill_tokens": {"min": 8}}, "scale": {"t_request_s": 2}}]},
                              "rules[0]", "scale.t_request_s is fixed for a configuration"),
    "range on a name": ({"rules": [{"when": {"quantization": {"min": 1}}, "add_step_s": 0.001}]},
                        "rules[0].when.quantization", "a range where quantization takes names"),
    "empty range": ({"rules": [{"when": {"decode_batch": {}}, "add_step_s": 0.001}]}, "rules[0].when.decode_batch",
                    "an empty range: give min, max or both"),
    "min above max": ({"rules": [{"when": {"decode_batch": {"min": 9, "max": 3}}, "add_step_s": 0.001}]},
                      "rules[0].when.decode_batch", "min 9 is above max 3: swap them"),
    "empty list": ({"rules": [{"when": {"gpu": []}, "add_step_s": 0.001}]}, "rules[0].when.gpu",
                   "an empty list matches nothing"),
    "not a bool": ({"rules": [{"when": {"enforce_eager": "yes"}, "add_step_s": 0.001}]},
                   "rules[0].when.enforce_eager", "'yes' is not true or false"),
    "not a number": ({"rules": [{"when": {"tensor_parallel_size": "four"}, "add_step_s": 0.001}]},
                     "rules[0].when.tensor_parallel_size", "'four' is not a number: give a whole number"),
    "rules not a list": ({"rules": {"when": {}}}, "rules", "a dict where a list belongs: give a list of rules"),
    "rule not a mapping": ({"rules": ["fast"]}, "rules[0]", "a str where a mapping belongs"),
    "too many rules": ({"rules": [{"add_step_s": 0.001}] * 65}, "rules", "65 rules: give at most 64"),
    "name too long": ({"name": "x" * 300}, "name", "give a name of 1–200 characters"),
    "not a mapping": (["name"], "", "a list where a mapping belongs: give a truth: name, terms, rules"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_every_refusal_names_the_place_the_reason_and_the_fix(case):
    data, where, words = REFUSALS[case]
    with pytest.raises(TruthError) as e:
        parse_truth(data)
    assert e.value.where == where, str(e.value)
    assert words in e.value.reason, str(e.value)
    assert str(e.value) == (f"{where}: {e.value.reason}" if where else e.value.reason)


HOSTILE = {
    "duplicate key": ("name: a\nname: b\n", "name", "duplicate key 'name'"),
    "anchors": ("name: x\nterms: &t {eta_mem: 0.9}\nrules: [{scale: *t}]\n", "terms", "anchors (&name)"),
    "deep": ("name: x\nrules: " + "[" * 100 + "]" * 100 + "\n", "rules", "nested deeper than"),
    "huge int": ("name: x\nterms: {eta_mem: " + "9" * 5000 + "}\n", "terms.eta_mem", "an integer of 5,000"),
    "a tag": ("name: !!python/object:os.system x\n", "", "YAML tag not allowed"),
    "not UTF-8": (b"name: \xff\xfe\n", "", "not UTF-8"),
    "broken": ("name: [x\n", "", "broken YAML"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_truth_file_is_refused_with_its_name_key_and_reason(case, tmp_path):
    text, key, words = HOSTILE[case]
    f = tmp_path / "truth.yaml"
    f.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(TruthError) as e:
        load_truth(f)
    assert str(f) in str(e.value) and words in str(e.value)
    if key:
        assert f"{f}: {key}" in str(e.value)


def test_a_file_too_large_or_missing_is_refused_before_it_is_read(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("name: x\n" + "# pad\n" * 400_000)
    with pytest.raises(TruthError, match="is larger than"):
        load_truth(big)
    with pytest.raises(TruthError, match="cannot be read"):
        load_truth(tmp_path / "none.yaml")
    with pytest.raises(TruthError, match=r"^rules\[0\]\.scal: unknown rule key") as e:
        truth_argument('{"rules": [{"scal": {}}]}')
    assert e.value.where == "rules[0].scal"
    with pytest.raises(TruthError, match="not JSON"):
        truth_argument("{rules")


@pytest.mark.parametrize("path", sorted((ROOT / "resources" / "truths").glob("*.yaml")), ids=lambda p: p.stem)
def test_the_example_truths_load(path):
    t = load_truth(path)
    assert t.name and t.rules


# ---------------------------------------------------------------------- matching
def test_a_scalar_is_equal_a_list_any_of_a_range_both_ends_included():
    t = parse_truth({"rules": [{"when": {"tensor_parallel_size": 4, "gpu": ["RTX 4090", "H100 SXM"],
                                         "decode_batch": {"min": 8, "max": 16}, "quantization": None},
                                "add_step_s": 0.001}]})
    w = t.rules[0]["when"]
    assert holds(w["tensor_parallel_size"], 4) and not holds(w["tensor_parallel_size"], 2)
    assert holds(w["gpu"], "RTX 4090") and holds(w["gpu"], "H100 SXM") and not holds(w["gpu"], "RTX 3090")
    assert [holds(w["decode_batch"], b) for b in (7, 8, 16, 17)] == [False, True, True, False]
    assert holds(w["quantization"], None) and not holds(w["quantization"], "awq")
    assert not holds({"min": 1, "max": math.inf}, None)


def test_gpu_names_match_by_catalog_name_and_names_case_insensitively():
    t = parse_truth({"rules": [{"when": {"gpu": "geforce rtx 4090", "kv_cache_dtype": "FP8"}, "add_step_s": 0}]})
    assert t.rules[0]["when"]["gpu"] == {"any": ["RTX 4090"]}
    assert t.rules[0]["when"]["kv_cache_dtype"] == {"any": ["fp8"]}


def test_the_configuration_facts_are_the_effective_values():
    f = facts_of(plan7())
    assert f == {"gpu": "RTX 4090", "tensor_parallel_size": 1, "pipeline_parallel_size": 1, "data_parallel_size": 1,
                 "quantization": None, "kv_cache_dtype": "auto", "enforce_eager": False,
                 "max_num_seqs": f["max_num_seqs"], "max_num_batched_tokens": f["max_num_batched_tokens"],
                 "enable_prefix_caching": True}
    assert f["max_num_seqs"] > 0 and f["max_num_batched_tokens"] > 0  # vLLM's defaults when not given


# ---------------------------------------------------------------------- the engine hook
def test_without_a_truth_or_a_rule_that_holds_the_model_has_no_hook():
    p = plan7()
    assert type(p.perf) is StepTimeModel
    q = parse_truth({"rules": [{"when": {"tensor_parallel_size": 2, "decode_batch": {"min": 1}},
                                "add_step_s": 0.5}]}).apply(p)
    assert type(q.perf) is StepTimeModel  # TP 1: the rule cannot hold on this configuration
    assert q.perf.step_time(8, 8 * 400, 0) == p.perf.step_time(8, 8 * 400, 0)


def test_a_step_rule_changes_only_the_steps_it_names():
    p = plan7()
    t = parse_truth({"rules": [{"when": {"decode_batch": {"min": 8}}, "add_step_s": 0.01},
                               {"when": {"prefill_tokens": {"min": 1024}}, "add_prefill_token_s": 1e-6},
                               {"when": {"context_tokens": {"min": 1000}, "decode_batch": {"min": 1}},
                                "scale": {"eta_mem": 0.5}}]})
    q = t.apply(p)
    assert isinstance(q.perf, AdjustedStepTimeModel)
    a, b = p.perf, q.perf
    assert b.step_time(4, 4 * 400, 0) == a.step_time(4, 4 * 400, 0)          # no rule holds
    assert b.step_time(8, 8 * 400, 0) == pytest.approx(a.step_time(8, 8 * 400, 0) + 0.01)
    assert b.step_time(0, 0, 512, 512 * 256) == a.step_time(0, 0, 512, 512 * 256)
    assert b.step_time(0, 0, 2048, 2048 * 1024) == pytest.approx(a.step_time(0, 0, 2048, 2048 * 1024) + 2048e-6)
    slow = b.step_time(4, 4 * 2000, 0)                                          # long contexts: η_mem halved
    assert slow > a.step_time(4, 4 * 2000, 0) * 1.5
    assert a.params == p.perf.params and b.params == a.params                   # the config's parameters as before


def test_terms_and_configuration_rules_fold_into_the_parameters():
    p = plan7()
    t = parse_truth({"terms": {"t_cpu_s": 2.0}, "rules": [{"when": {"gpu": "RTX 4090"}, "scale": {"eta_mem": 0.5}},
                                                          {"when": {"gpu": "H100 SXM"}, "scale": {"eta_mem": 3}},
                                                          {"when": {"enforce_eager": False}, "scale": {"eta_mem": 4}}]})
    q = t.apply(p)
    assert type(q.perf) is StepTimeModel
    assert q.perf.params.t_cpu_s == pytest.approx(2 * p.perf.params.t_cpu_s)
    assert q.perf.params.eta_mem == 1.0  # 0.5 × 4 = 2×: an efficiency stays at most 1
    assert "truth" in q.perf.params.source


def test_pipeline_bubbles_add_to_the_latency_and_the_interval():
    p = rig_plan(ServerConfig(model=QWEN7, max_model_len=2048, pipeline_parallel_size=2), count=2, workload=W)
    q = load_truth(ROOT / "resources/truths/pipeline-bubbles.yaml").apply(p)
    (l0, i0), (l1, i1) = p.perf.pipeline_step_time(8, 3200, 0), q.perf.pipeline_step_time(8, 3200, 0)
    assert l1 == pytest.approx(l0 + 0.0015) and i1 == pytest.approx(i0 + 0.0015)
    assert q.perf.with_params(q.perf.params).__class__ is StepTimeModel


def test_kv_tokens_scale_shrinks_the_engine_kv_cache():
    p = plan7()
    q = parse_truth({"rules": [{"when": {"gpu": "RTX 4090"}, "kv_tokens_scale": 0.5}]}).apply(p)
    assert q.engine_limits().num_blocks == pytest.approx(p.engine_limits().num_blocks / 2, abs=1)
    assert q.kv_cache_tokens == p.kv_cache_tokens  # the plan's memory as planned; the engine gets its share


# ---------------------------------------------------------------------- how a truth travels
TRUTH = {"name": "slow at 8", "rules": [{"when": {"decode_batch": {"min": 8}}, "add_step_s": 0.01}]}


def test_a_profile_carries_its_truth_inline_never_as_a_path():
    from app.profiles.io import ProfileError, parse_profile
    from app.sim.server import build_parser as sim_parser

    text = "name: t\nengine: sim\nserver: {model: m}\nsim: {gpu: RTX 4090, count: 1, truth: %s}\n"
    prof = parse_profile(text % json.dumps(TRUTH))
    argv = prof.sim.argv()
    assert argv[argv.index("--sim-truth") + 1] == json.dumps(TRUTH, separators=(",", ":"))
    a = sim_parser().parse_known_args(["--model", "m", *argv])[0]
    assert truth_argument(a.sim_truth).rules[0]["add_step_s"] == 0.01
    with pytest.raises(ProfileError, match="never a path"):
        parse_profile(text % "truths/slow.yaml")
    with pytest.raises(ProfileError, match=r"rules\[0\]\.when\.gpus: unknown condition 'gpus'"):
        parse_profile(text % json.dumps({"rules": [{"when": {"gpus": "x"}, "add_step_s": 0.1}]}))


def test_the_cli_reads_a_truth_file_for_serve_tune_and_predict(tmp_path, capsys):
    from app.cli import build_parser
    from app.cli.common import sim_args_from

    f = tmp_path / "t.yaml"
    f.write_text("name: slow at 8\nrules:\n  - when: {decode_batch: {min: 8}}\n    add_step_s: 0.01\n")
    a = build_parser().parse_args(["serve", "--model", "m", "--engine", "sim", "--sim-truth", str(f)])
    assert sim_args_from(a) == ["--sim-truth", json.dumps(TRUTH, separators=(",", ":"))]
    a = build_parser().parse_args(["predict", "--model", "m", "--gpu", "RTX 4090", "--sim-truth", str(f)])
    assert a.sim_truth.name == "slow at 8"
    assert build_parser().parse_args(["tune", "--model", "m", "--engine", "sim", "--sim-truth", str(f)]).sim_truth
    f.write_text("name: x\nrules: [{when: {gpus: x}, add_step_s: 0.1}]\n")
    for argv in (["serve", "--model", "m", "--engine", "sim"], ["predict", "--model", "m"]):
        with pytest.raises(SystemExit) as e:
            build_parser().parse_args([*argv, "--sim-truth", str(f)])
        err = capsys.readouterr().err
        assert e.value.code == 2 and f"{f}: rules[0].when.gpus: unknown condition 'gpus'" in err, err


def test_the_sim_server_refuses_a_bad_truth_before_it_starts(capsys):
    from app.sim.server import main as sim_main

    assert sim_main(["--model", QWEN7, "--sim-truth", '{"terms": {"eta": 2}}']) == 2
    assert "--sim-truth terms.eta: unknown term 'eta'" in capsys.readouterr().err


# ---------------------------------------------------------------------- the offline rig
def test_the_offline_rig_measures_under_the_truth():
    """The offline rig takes a truth and answers with a measurement: slower where the
    rule holds (TP 8 of the demo's 70B AWQ on 4090s), the same where it does not."""
    space = TuneSpace(tp=[4, 8], pp=[1], dp=[1, 2], kv_cache_dtype=["auto"], enforce_eager=[False],
                      max_num_batched_tokens=[2048])
    spec = spec_of(space)
    truth = parse_truth({"rules": [{"when": {"tensor_parallel_size": 8}, "scale": {"allreduce_alpha_s": 4.0}}]})
    plain, under = OfflineRig(spec, 0), OfflineRig(spec, 0, truth)
    tp8 = spec.config
    tp4 = tp8.model_copy(update={"tensor_parallel_size": 4, "data_parallel_size": 2})
    a8, b8 = plain.search(tp8)[0], under.search(tp8)[0]
    a4, b4 = plain.search(tp4)[0], under.search(tp4)[0]
    assert b8.capacity.output_tps < 0.95 * a8.capacity.output_tps
    assert b4.capacity.output_tps == a4.capacity.output_tps


# ---------------------------------------------------------------------- tune --grid --offline (item 3)
# the whole grid under a truth (a CLI run, means of searches): tests/integration/test_tuner_truth.py


def test_offline_needs_the_sim(dyno_home, capsys):
    from app.cli import main

    sim = ["tune", "--model", QWEN7, "--engine", "sim", "--sim-gpu", "RTX 4090", "--sim-gpu-count", "1",
           "--slo-tpot-p99", "0.1"]
    assert main([*sim, "--grid"]) == 2
    assert "--grid measures every candidate on the offline rig: add --offline" in capsys.readouterr().err
