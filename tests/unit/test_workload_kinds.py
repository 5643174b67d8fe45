"""The one workload model (issue 33, item 2): every kind of app.loadgen.workload has a
prediction, command-line options on the commands that take it and a form row; RampSpec,
TuneSpec and the planner's Workload carry it unchanged; a new kind is one class."""
from __future__ import annotations

import argparse
import inspect
import json
from typing import ClassVar, Optional

import pytest
from pydantic import Field

from app.loadgen import workload as wl
from app.loadgen.spec import RampSpec
from app.loadgen.workload import (KINDS, CliOption, FormRow, Prediction, Workload, WorkloadKind, cli_options,
                                  fields_from_args, form_rows, kind_problems)


def _parsers() -> dict[str, argparse.ArgumentParser]:
    from app.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {c: sub.choices[c] for c in sorted(wl.COMMANDS)}


def _flags(p: argparse.ArgumentParser) -> set[str]:
    return {s for a in p._actions for s in a.option_strings}


def test_every_kind_has_a_prediction_an_option_and_a_form_row():
    assert kind_problems() == []


def test_every_kind_class_is_a_part_of_the_workload():
    """A kind declared in the module but left out of Workload's bases reaches no spec."""
    declared = {c for _, c in inspect.getmembers(wl, inspect.isclass)
                if issubclass(c, WorkloadKind) and c not in (WorkloadKind, Workload)}
    assert declared - set(KINDS) == set(), "kinds declared but not in Workload's bases"


def test_each_commands_parser_has_every_option_its_kinds_declare():
    """ramp, run, plan and tune (app/cli) take the options generated from the kinds, the
    request-rate ones only where the command runs request rates."""
    parsers = _parsers()
    missing = [f"{c} {o.flag}" for c, p in parsers.items() for o in cli_options(c) if o.flag not in _flags(p)]
    assert missing == []
    assert "--burstiness" not in _flags(parsers["plan"]) and "--max-concurrency" not in _flags(parsers["tune"])


def test_the_specs_are_the_workload_and_the_planner_holds_it_unchanged():
    from app.planner.plan import Workload as PlanWorkload
    from app.tuner.tune import TuneSpec

    assert issubclass(RampSpec, Workload) and issubclass(TuneSpec, Workload)
    spec = RampSpec(levels=[1, 2], prompt_tokens=(100, 300), output_tokens=64, seed=7, length_spread=0.1,
                    multi_turn={"turns": 3, "think_s": 1.0}, shared_prefix={"tokens": 256, "fraction": 0.5})
    w = PlanWorkload.from_ramp(spec)
    assert w.requests == spec.as_workload()  # every field, no hand conversion
    assert w.ramp_spec([1, 2]).as_workload() == spec.as_workload()
    # a request-rate ramp is planned as its closed loop: the arrival fields back at their defaults
    rate = RampSpec(mode="rate", levels=[2.0], burstiness=0.5, max_concurrency=8, prompt_tokens=700)
    r = PlanWorkload.from_ramp(rate).requests
    assert (r.burstiness, r.max_concurrency, r.prompt_tokens) == (1.0, None, 700)


def test_the_spec_json_keys_stay_flat_and_an_old_stored_spec_loads():
    """The store's spec JSON and ramp --json's ``spec`` keep their keys (issue 33 item 1): a
    spec stored before the workload model (its JSON as written by 846014a) loads and
    writes the same keys back."""
    old = {"url": "http://127.0.0.1:8000", "endpoint": "/v1/completions", "model": None, "mode": "concurrency",
           "levels": [1.0, 2.0], "max_level": None, "max_concurrency": None, "burstiness": 1.0, "step_seconds": 20.0,
           "requests_per_level": None, "warmup_seconds": 0.0, "prompt_tokens": [256, 768], "output_tokens": 128,
           "length_spread": 0.25, "prompts_file": None, "prompts_format": None, "prompts_column": None,
           "output_cap": None, "ignore_eos": True, "temperature": 0.0, "request_timeout": 300.0,
           "max_failure_rate": 0.2, "min_requests_for_abort": 5,
           "slo": {"ttft_p99": None, "tpot_p99": None, "e2e_p99": None, "failure_rate": None},
           "max_total_seconds": None, "knee_gain": 0.15, "knee_ttft_ratio": 1.5, "seed": 3, "search": None,
           "multi_turn": {"turns": 4.0, "think_s": 0.5}, "shared_prefix": None, "settle": None}
    s = RampSpec.model_validate(old)
    assert s.prompt_tokens == (256, 768) and s.multi_turn.turns == 4 and s.seed == 3
    # keys are only added, at their defaults: issue 38's admission control (the rejection bound, the retry wait)
    assert json.loads(s.model_dump_json()) == {**old, "slo": {**old["slo"], "rejection_rate": None, "ttfa_p99": None},
                                               "rejected_wait_s": 1.0}


#: a TuneSpec as the store kept it before the workload model (written by 846014a's TuneSpec)
OLD_TUNE = (
    '{"name":"","engine":"sim","config":{"model":"Llama-3-8B","served_model_name":null,"tensor_parallel_size":null,'
    '"pipeline_parallel_size":null,"data_parallel_size":null,"distributed_executor_backend":null,'
    '"disable_custom_all_reduce":null,"max_num_seqs":null,"max_num_batched_tokens":null,"max_model_len":null,'
    '"quantization":null,"dtype":null,"kv_cache_dtype":null,"gpu_memory_utilization":null,'
    '"enable_prefix_caching":null,"enforce_eager":null,"speculative_config":null,"host":"127.0.0.1","port":null,'
    '"gpus":null,"env":{},"extra_args":[]},"sim_args":[],"hardware":{"gpu":"RTX 4090","count":2,"memory_gib":null,'
    '"compute_capability":null,"driver":null,"vllm_version":null,"recorded_at":null,"hosts":null,"link":null,'
    '"cores":null},"python":null,"vllm_version":null,"prompt_tokens":300,"output_tokens":128,"length_spread":0.1,'
    '"seed":4,"multi_turn":{"turns":3.0,"think_s":0.0},"shared_prefix":null,"prompts_file":null,'
    '"prompts_format":null,"prompts_column":null,"slo":{"ttft_p99":2.0,"tpot_p99":null,"e2e_p99":null,'
    '"failure_rate":null},"objective":"users","space":{"tp":null,"pp":null,"dp":null,"checkpoints":{},'
    '"max_num_batched_tokens":null,"kv_cache_dtype":null,"enforce_eager":null,"fewer_cards":false,"vary":{}},'
    '"max_launches":4,"max_minutes":null,"requests_per_level":100,"resolution":0.05,"max_users":1024.0,'
    '"startup_timeout":900.0,"grace":null,"hosts":[],"ray_address":null}')


def test_a_stored_tune_loads_keeps_its_keys_and_its_workload():
    """A tune stored before the workload model loads (its workload the planner's, unchanged)
    and writes back every key it had — the workload model only adds keys (output_cap,
    burstiness, max_concurrency at their defaults); a tune's searches are closed-loop."""
    from app.tuner.tune import TuneSpec

    old = json.loads(OLD_TUNE)
    t = TuneSpec.model_validate_json(OLD_TUNE)
    new = json.loads(t.model_dump_json())
    # nested keys are only added, at their defaults: issue 38's admission control (three vLLM options, a bound)
    added = {"config": {"max_num_active_seqs": None, "max_num_queued_reqs": None, "max_num_queued_tokens": None},
             "slo": {"rejection_rate": None, "ttfa_p99": None}}
    assert {k: new[k] for k in old} == {k: {**v, **added[k]} if k in added else v for k, v in old.items()}
    assert set(new) - set(old) == {"output_cap", "burstiness", "max_concurrency"}
    r = t.workload().requests
    assert (r.prompt_tokens, r.length_spread, r.seed, r.multi_turn.turns) == (300, 0.1, 4, 3)
    assert t.workload().search_spec().turns_range() == (3, 3)
    with pytest.raises(ValueError, match="burstiness"):
        TuneSpec.model_validate({**old, "burstiness": 0.5})


def test_one_spread_default():
    """The ±25 % is declared once: the Workload's default, the form's Vary box, the tuner's."""
    from app.tuner.report import DEFAULT_SPREAD

    on = next(r for r in form_rows() if r.field == "length_spread").on
    assert Workload().length_spread == on == DEFAULT_SPREAD == wl.DEFAULT_LENGTH_SPREAD


# ---------------------------------------------------------------------------- a new kind is one class
class Dummy(WorkloadKind):
    """A dummy kind: a reasoning budget, say (tokens)."""

    TITLE: ClassVar[str] = "dummy"
    think_tokens: Optional[int] = Field(None, ge=1)
    CLI: ClassVar[tuple[CliOption, ...]] = (
        CliOption("--think-tokens", "dummy: reasoning tokens per request", "think_tokens", int, "N"),)
    FORM: ClassVar[tuple[FormRow, ...]] = (
        FormRow("think_tokens", "Think tokens", "text", "dummy", parse=lambda t: int(t) if t else None),)
    PREDICTION: ClassVar[Optional[Prediction]] = Prediction("dummy: drawn per user", per_user_stream=True)

    def kind_on(self) -> bool:
        return self.think_tokens is not None


class DummyWorkload(Workload, Dummy):
    pass


def test_a_new_kind_needs_one_class(monkeypatch):
    """The dummy kind above, added to the kinds (as adding it to Workload's bases does),
    reaches every command's parser, the argument reader, the form's rows and the planner's
    per-user stream — and everything it took is one class in one file."""
    monkeypatch.setattr(wl, "KINDS", KINDS + (Dummy,))
    assert kind_problems() == []
    for c, p in _parsers().items():
        assert "--think-tokens" in _flags(p), c
        a = p.parse_args([*_required(c), "--think-tokens", "300"])
        assert fields_from_args(a, c)["think_tokens"] == 300
    assert [r.field for r in form_rows("requests")][-1] == "think_tokens"
    w = DummyWorkload(think_tokens=300)
    assert w.per_user_stream() and not DummyWorkload().per_user_stream()
    assert json.loads(w.model_dump_json())["think_tokens"] == 300  # flat, as every kind's keys
    # the kind's declarations (fields, CLI, form, prediction, rules) are its class: one file
    assert {inspect.getsourcefile(c) for c in (Dummy, DummyWorkload)} == {__file__}


def test_a_kind_without_a_predictor_an_option_or_a_row_is_named(monkeypatch):
    class Bare(WorkloadKind):
        flag_only: bool = False

        def kind_on(self) -> bool:
            return self.flag_only

    problems = kind_problems((Bare,))
    for what in ("no prediction", "no command-line option", "no row of the Ramp form", "Bare.flag_only"):
        assert any(p.startswith("Bare") and what in p for p in problems), (what, problems)


def _required(command: str) -> list[str]:
    """The positional/required arguments of ``command`` for a parse that only reads options."""
    return ["demo"] if command == "run" else []

