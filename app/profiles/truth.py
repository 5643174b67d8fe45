"""A simulated rig's truth (issue 35, item 1): how the rig's cards differ from the
performance model, by configuration and by step — the hidden "true rig" that the sim
(``--sim-truth FILE``, a profile's ``sim: {truth: {…}}``), ``predict --sim-truth FILE``
and the offline rig (app.tuner.offline) step with. The format and its terms:
docs/sim-truth.md. A truth is a mapping::

    name: PCIe 4090s, awq slows at large batch
    terms: {eta_mem: 0.9}                  # factors for every configuration
    rules:                                 # each applies when all its conditions hold
      - when: {gpu: ["RTX 4090"], tensor_parallel_size: {min: 4}}
        scale: {allreduce_alpha_s: 2.5}
      - when: {quantization: [awq, awq_marlin], decode_batch: {min: 64}}
        scale: {eta_compute: 0.6}
      - when: {pipeline_parallel_size: {min: 2}}
        add_step_s: 0.0015

Conditions on the configuration (:data:`CONFIG_CONDITIONS`) are decided once per
server; conditions on the step (:data:`STEP_CONDITIONS`) every engine step, through
:class:`app.engine.steptime.AdjustedStepTimeModel` (the plain model, without a truth,
has no hook at all). A scalar means equal, a list any of, ``{min, max}`` a range (both
ends included). The tuner never imports this module (an import-linter contract,
pyproject.toml): it gets measurements only.

Files are read under the hostile-file rules (:func:`app.fileio.read_yaml`: size, depth,
aliases, duplicate keys) and validated with pydantic; every refusal names the place
(``rules[1].when.gpus``), what is wrong and the fix (:class:`TruthError`).
"""
from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from app.engine.steptime import TERMS, AdjustedStepTimeModel, PerfParams, StepTimeModel
from app.fileio import YamlError, YamlLimits, read_yaml
from app.planner.gpus import UnknownGpuError, lookup_gpu
from app.planner.plan import Plan

#: conditions on the configuration → the kind of value they take
CONFIG_CONDITIONS: dict[str, str] = {
    "gpu": "name", "tensor_parallel_size": "int", "pipeline_parallel_size": "int", "data_parallel_size": "int",
    "quantization": "name", "kv_cache_dtype": "name", "enforce_eager": "bool", "max_num_seqs": "int",
    "max_num_batched_tokens": "int", "enable_prefix_caching": "bool",
}
#: conditions on the engine step: decoding sequences, their mean context (tokens), prompt tokens
STEP_CONDITIONS: dict[str, str] = {"decode_batch": "int", "prefill_tokens": "int", "context_tokens": "int"}
CONDITIONS = {**CONFIG_CONDITIONS, **STEP_CONDITIONS}
TOP_KEYS = ("name", "terms", "rules")
ACTIONS = ("scale", "add_step_s", "add_prefill_token_s", "kv_tokens_scale")
RULE_KEYS = ("when", *ACTIONS)
#: terms that only a configuration can change (paid outside the engine step)
CONFIG_ONLY_TERMS = ("t_request_s",)
#: limits of a hand-written file: more is not a truth but an attack or a mistake
MAX_RULES, MAX_LIST, MAX_NAME = 64, 64, 200
#: factors and additions outside these are refused (a factor of 1000 is a typo)
FACTOR_RANGE = (1e-3, 1e3)
MAX_ADD_S = 10.0
_EFFICIENCIES = ("eta_mem", "eta_compute")
#: a truth file is read as a profile is: no anchors or aliases, at most 256 KiB
TRUTH_YAML_LIMITS = YamlLimits(max_bytes=256 * 1024, max_aliases=0)


class TruthError(ValueError):
    """A truth refused: ``where`` (``rules[0].scale.eta_men``, empty at the top) and
    ``reason`` (what is wrong and the fix). ``str()``: ``WHERE: REASON``."""

    def __init__(self, reason: str, where: str = "") -> None:
        self.reason, self.where = reason, where
        super().__init__(f"{where}: {reason}" if where else reason)


def _names(xs: Any) -> str:
    return ", ".join(xs)


def _number(v: Any, where: str, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise TruthError(f"{v!r} is not a number: give {what}", where)
    return float(v)


def _factor(v: Any, where: str) -> float:
    lo, hi = FACTOR_RANGE
    what = f"a factor between {lo:g} and {hi:g} (1: the model's value)"
    f = _number(v, where, what)
    if not lo <= f <= hi:
        raise TruthError(f"{v!r} is out of range: give {what}", where)
    return f


def _seconds(v: Any, where: str) -> float:
    what = f"seconds between 0 and {MAX_ADD_S:g}, e.g. 0.0015"
    s = _number(v, where, what)
    if not 0 <= s <= MAX_ADD_S:
        raise TruthError(f"{v!r} is out of range: give {what}", where)
    return s


def _mapping(v: Any, where: str, what: str) -> dict:
    if not isinstance(v, dict):
        raise TruthError(f"a {type(v).__name__} where a mapping belongs: give {what}", where)
    for k in v:
        if not isinstance(k, str):
            raise TruthError(f"key {k!r} is not a name: give {what}", where)
    return v


def _unknown(key: str, where: str, kind: str, known: tuple[str, ...] | list[str]) -> TruthError:
    return TruthError(f"unknown {kind} {key!r}: use one of {_names(known)} (docs/sim-truth.md)",
                      f"{where}.{key}" if where else key)


def _scalar(key: str, kind: str, v: Any, where: str) -> Any:
    """One value of condition ``key``: checked against its kind; a GPU by its catalog name."""
    if kind == "bool":
        if not isinstance(v, bool):
            raise TruthError(f"{v!r} is not true or false: give true or false", where)
        return v
    if kind == "int":
        return _number(v, where, "a whole number, a list of them or {min, max}")
    if v is None and key == "quantization":
        return None  # unquantized
    if not isinstance(v, str) or not v.strip():
        raise TruthError(f"{v!r} is not a name: give a name or a list of names", where)
    if key == "gpu":
        try:
            return lookup_gpu(v).name
        except UnknownGpuError as e:
            raise TruthError(str(e), where) from None
    return v.strip().lower()


def _condition(key: str, v: Any, where: str) -> dict:
    """A condition's value as ``{"any": [...]}`` or ``{"min": a, "max": b}``."""
    kind = CONDITIONS[key]
    if isinstance(v, dict):
        if kind != "int":
            raise TruthError(f"a range where {key} takes {'true or false' if kind == 'bool' else 'names'}: give "
                             "a value or a list of values", where)
        for k in v:
            if k not in ("min", "max"):
                raise _unknown(str(k), where, "range key", ("min", "max"))
        if not v:
            raise TruthError("an empty range: give min, max or both, e.g. {min: 4}", where)
        lo = _number(v["min"], f"{where}.min", "a number") if "min" in v else -math.inf
        hi = _number(v["max"], f"{where}.max", "a number") if "max" in v else math.inf
        if lo > hi:
            raise TruthError(f"min {lo:g} is above max {hi:g}: swap them", where)
        return {"min": lo, "max": hi}
    if isinstance(v, list):
        if not v:
            raise TruthError("an empty list matches nothing: give at least one value", where)
        if len(v) > MAX_LIST:
            raise TruthError(f"{len(v)} values: give at most {MAX_LIST}", where)
        return {"any": [_scalar(key, kind, x, f"{where}[{i}]") for i, x in enumerate(v)]}
    return {"any": [_scalar(key, kind, v, where)]}


def _terms(v: Any, where: str) -> dict[str, float]:
    m = _mapping(v, where, f"term: factor, terms {_names(TERMS)}")
    out = {}
    for k, f in m.items():
        if k not in TERMS:
            raise _unknown(k, where, "term", TERMS)
        out[k] = _factor(f, f"{where}.{k}")
    return out


def _rule(v: Any, where: str) -> dict:
    m = _mapping(v, where, "a rule: when, and one or more of " + _names(ACTIONS))
    for k in m:
        if k not in RULE_KEYS:
            raise _unknown(k, where, "rule key", RULE_KEYS)
    if not any(k in m for k in ACTIONS):
        raise TruthError(f"a rule without an action: give one or more of {_names(ACTIONS)}", where)
    when = _mapping(m.get("when") or {}, f"{where}.when", "conditions: " + _names(CONDITIONS))
    conds = {}
    for k, c in when.items():
        if k not in CONDITIONS:
            raise _unknown(k, f"{where}.when", "condition", tuple(CONDITIONS))
        conds[k] = _condition(k, c, f"{where}.when.{k}")
    out: dict[str, Any] = {"when": conds}
    if "scale" in m:
        out["scale"] = _terms(m["scale"], f"{where}.scale")
    for k in ("add_step_s", "add_prefill_token_s"):
        if k in m:
            out[k] = _seconds(m[k], f"{where}.{k}")
    if "kv_tokens_scale" in m:
        f = _factor(m["kv_tokens_scale"], f"{where}.kv_tokens_scale")
        if f > 1:
            raise TruthError(f"{f:g}: the KV cache cannot outgrow the memory planned for it; give a factor ≤ 1",
                             f"{where}.kv_tokens_scale")
        out["kv_tokens_scale"] = f
    step = [k for k in conds if k in STEP_CONDITIONS]
    if step:
        late = [k for k in out.get("scale", {}) if k in CONFIG_ONLY_TERMS]
        late = [f"scale.{k}" for k in late] + (["kv_tokens_scale"] if "kv_tokens_scale" in out else [])
        if late:
            raise TruthError(f"{late[0]} is fixed for a configuration, and the rule has a step condition "
                             f"({step[0]}): move it to a rule on the configuration only", where)
    return out


class Truth(BaseModel):
    """A validated truth (the module docstring): ``name``, ``terms`` (term → factor for
    every configuration), ``rules`` (each ``{"when": {condition: {"any": […]} or
    {"min", "max"}}, "scale": {term: factor}, "add_step_s", "add_prefill_token_s",
    "kv_tokens_scale"}``). Build it with :func:`parse_truth` or :func:`load_truth`."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    terms: dict[str, float]
    rules: list[dict[str, Any]]
    #: the mapping as given, for a profile's ``sim: {truth: …}`` and the sim's argv
    source: dict[str, Any]

    @model_validator(mode="before")
    @classmethod
    def _check(cls, data: Any) -> Any:
        m = _mapping(data, "", "a truth: name, terms, rules (docs/sim-truth.md)")
        for k in m:
            if k not in TOP_KEYS:
                raise _unknown(k, "", "key", TOP_KEYS)
        name = m.get("name", "unnamed truth")
        if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME:
            raise TruthError(f"{name!r:.60}: give a name of 1–{MAX_NAME} characters", "name")
        rules = m.get("rules") or []
        if not isinstance(rules, list):
            raise TruthError(f"a {type(rules).__name__} where a list belongs: give a list of rules, each "
                             "{when: {…}, scale: {…}}", "rules")
        if len(rules) > MAX_RULES:
            raise TruthError(f"{len(rules)} rules: give at most {MAX_RULES}", "rules")
        return {"name": name.strip(), "terms": _terms(m.get("terms") or {}, "terms"),
                "rules": [_rule(r, f"rules[{i}]") for i, r in enumerate(rules)], "source": m}

    def mapping(self) -> dict[str, Any]:
        """The truth as given (a profile's inline ``truth:``)."""
        return self.source

    def for_plan(self, p: Plan) -> "TruthRig":
        """The truth on the configuration of ``p``."""
        return TruthRig(self, facts_of(p))

    def apply(self, p: Plan) -> Plan:
        """``p`` stepping under the truth: its step-time model (``p.perf``) changed by
        the terms and the rules that hold for its configuration (and, per step, those
        with step conditions) and its KV cache scaled. ``p`` itself when it has no model."""
        if p.perf is None:
            return p
        rig = self.for_plan(p)
        return replace(p, perf=rig.model(p.perf), kv_tokens_scale=p.kv_tokens_scale * rig.kv_tokens_scale)


def parse_truth(data: Any) -> Truth:
    """A truth from its mapping (a file's, a profile's ``truth:``). Raises
    :class:`TruthError` naming the place, what is wrong and the fix."""
    try:
        return Truth.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        cause = err.get("ctx", {}).get("error")
        if isinstance(cause, TruthError):
            raise TruthError(cause.reason, cause.where) from None
        raise TruthError(err["msg"], ".".join(str(x) for x in err["loc"])) from None


def load_truth(path: str | Path) -> Truth:
    """The truth in the YAML file ``path``. Raises :class:`TruthError` with the file's
    name, the place and the reason (unreadable, hostile or invalid)."""
    try:
        data = read_yaml(path, TRUTH_YAML_LIMITS)
    except YamlError as e:
        raise TruthError(e.located, f"{path}" + (f": {e.key}" if e.key else "")) from None
    except OSError as e:
        raise TruthError(f"cannot be read ({e.strerror or e})", str(path)) from None
    try:
        return parse_truth(data)
    except TruthError as e:
        raise TruthError(e.reason, f"{path}: {e.where}" if e.where else str(path)) from None


def truth_argument(text: str) -> Truth:
    """The sim server's ``--sim-truth``: inline JSON (``{…}``, as a profile's launch
    writes it) or a YAML file."""
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except ValueError as e:
            raise TruthError(f"not JSON ({e})", "--sim-truth") from None
        return parse_truth(data)
    return load_truth(text)


def facts_of(p: Plan) -> dict[str, Any]:
    """The configuration of ``p`` as the conditions name it (effective values: vLLM's
    defaults where the configuration gives none)."""
    c, e = p.config, p.effective
    kv = (c.kv_cache_dtype or "auto").lower()
    return {"gpu": p.cards[0].name if p.cards else None, "tensor_parallel_size": e.tp,
            "pipeline_parallel_size": e.pp, "data_parallel_size": p.dp,
            "quantization": e.quantization.lower() if e.quantization else None, "kv_cache_dtype": kv,
            "enforce_eager": bool(e.enforce_eager), "max_num_seqs": e.max_num_seqs,
            "max_num_batched_tokens": e.max_num_batched_tokens,
            "enable_prefix_caching": c.enable_prefix_caching is not False}


def holds(cond: dict, value: Any) -> bool:
    """Whether ``value`` meets one condition (``{"any": …}`` or ``{"min", "max"}``)."""
    if "any" in cond:
        return value in cond["any"]
    return value is not None and cond["min"] <= value <= cond["max"]


def _scaled(params: PerfParams, factors: dict[str, float], label: str) -> PerfParams:
    changes = {k: getattr(params, k) * f for k, f in factors.items()}
    for k in _EFFICIENCIES:
        if k in changes:
            changes[k] = min(1.0, changes[k])
    return replace(params, **changes, source=f"{params.source}, {label}")


class TruthRig:
    """A truth on one configuration (``facts``: :func:`facts_of`): the rules whose
    configuration conditions hold, split into those that hold always and those that
    also ask about the step."""

    def __init__(self, truth: Truth, facts: dict[str, Any]) -> None:
        self.truth = truth
        static: list[dict] = []
        self.step_rules: list[dict] = []
        for r in truth.rules:
            when = r["when"]
            if all(holds(c, facts.get(k)) for k, c in when.items() if k in CONFIG_CONDITIONS):
                (self.step_rules if any(k in STEP_CONDITIONS for k in when) else static).append(r)
        self.static_rules = static
        self.kv_tokens_scale = math.prod(r.get("kv_tokens_scale", 1.0) for r in static)

    def model(self, base: StepTimeModel) -> StepTimeModel:
        """``base`` under the truth: the terms and the configuration's rules folded into its
        parameters; with step rules an :class:`AdjustedStepTimeModel` deciding them per step."""
        factors = dict(self.truth.terms)
        for r in self.static_rules:
            for k, f in r.get("scale", {}).items():
                factors[k] = factors.get(k, 1.0) * f
        params = _scaled(base.params, factors, f"truth {self.truth.name!r}") if factors else base.params
        add_s = sum(r.get("add_step_s", 0.0) for r in self.static_rules)
        per_token_s = sum(r.get("add_prefill_token_s", 0.0) for r in self.static_rules)
        plain = base.with_params(params)
        if not self.step_rules and not add_s and not per_token_s:
            return plain
        return AdjustedStepTimeModel(**{k: getattr(plain, k) for k in StepTimeModel.__dataclass_fields__},
                                     adjust=StepRules(params, add_s, per_token_s, self.step_rules))


class StepRules:
    """The per-step hook of a truth (:class:`app.engine.steptime.StepAdjust`): which step
    rules hold for a step's shape → the parameters and added seconds, cached per set of
    rules that hold (a handful per configuration)."""

    def __init__(self, params: PerfParams, add_s: float, per_token_s: float, rules: list[dict]) -> None:
        self.params, self.add_s, self.per_token_s = params, add_s, per_token_s
        self.rules = [(r, [(k, c) for k, c in r["when"].items() if k in STEP_CONDITIONS]) for r in rules]
        self._cache: dict[tuple[bool, ...], tuple[PerfParams, float, float]] = {}

    def __call__(self, decode_batch: float, context_tokens: float, prefill_tokens: float
                 ) -> tuple[PerfParams, float, float]:
        step = {"decode_batch": decode_batch, "context_tokens": context_tokens, "prefill_tokens": prefill_tokens}
        key = tuple(all(holds(c, step[k]) for k, c in conds) for _, conds in self.rules)
        hit = self._cache.get(key)
        if hit is None:
            factors: dict[str, float] = {}
            add_s, per_token_s = self.add_s, self.per_token_s
            for (r, _), on in zip(self.rules, key):
                if on:
                    for k, f in r.get("scale", {}).items():
                        factors[k] = factors.get(k, 1.0) * f
                    add_s += r.get("add_step_s", 0.0)
                    per_token_s += r.get("add_prefill_token_s", 0.0)
            params = _scaled(self.params, factors, "step rules") if factors else self.params
            hit = self._cache[key] = (params, add_s, per_token_s)
        return hit


