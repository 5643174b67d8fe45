"""A tune for people: building its spec, reading its result, exporting its flags.

Qt-free; shared by ``vllm-dyno tune`` (:mod:`app.cli.tune`) and the window's Tune tab
(``widgets.tune_panel``), so both say and write the same things:

- the spec: the rig of a tune (:func:`sim_target`, :func:`local_target`), its workload
  from a profile's ramp (:func:`workload_from_ramp`) and :func:`build_spec` (a
  :class:`~app.tuner.tune.TuneSpec`, errors as one ValueError naming the field);
- the search space as check boxes: each value of each dimension, pruned (with the
  planner's reason) when every configuration with it is (:func:`value_status`);
- the result (:meth:`app.tuner.tune.Tuner.result`'s dict, ``res`` below): the
  candidates in the order shown (:func:`ordered_candidates`, :func:`candidates_table`),
  the summary (:func:`summary_text`), the recommended / runner-up / starting flags
  side by side (:func:`result_columns`), the Pareto points (:func:`pareto_points`:
  output tok/s per user vs output tok/s per GPU, as ``vllm bench sweep plot_pareto``
  draws them) and the progress of a running tune (:class:`ProgressClock`: launch k of
  ≤ n, phase, elapsed, ETA);
- the exports of a recommendation's ``server`` flags (ServerConfig field names):
  :func:`vllm_serve_command`, :func:`vllm_config_yaml` / :func:`export_config`
  (vLLM's ``--config`` file) and :func:`save_as_profile`.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from app.clock import clock_text
from app.config import VLLM_OPTIONS, ServerConfig
from app.engines import SIM_VLLM_RULES, TUNABLE, Engine
from app.fileio import write_atomic
from app.hosts.link import SshOptions
from app.hosts.spec import Host
from app.loadgen.capacity import slo_text
from app.loadgen.spec import SLO, RampSpec
from app.loadgen.workload import DEFAULT_LENGTH_SPREAD, Workload
from app.profiles.edit import profile_from_settings
from app.profiles.interop import config_command, config_yaml
from app.profiles.model import HardwareFingerprint, Profile, SimRig
from app.run.verdict import model_label
from app.settings import Pricing
from app.telemetry.derived import cost_per_mtok
from app.tuner.model import FAMILY_WORDS
from app.tuner.space import TuneSpace
from app.tuner.tune import TuneSpec, launch_search

if TYPE_CHECKING:  # the library only for the save (deferred there)
    from app.profiles import ProfileLibrary

#: what a workload is when neither the user nor a profile's ramp says (tokens; the
#: Workload's defaults, app.loadgen.workload)
DEFAULT_PROMPT_TOKENS: int = Workload.model_fields["prompt_tokens"].default
DEFAULT_OUTPUT_TOKENS: int = Workload.model_fields["output_tokens"].default
DEFAULT_SPREAD = DEFAULT_LENGTH_SPREAD


# ---------------------------------------------------------------------- the spec
def sim_target(rig: SimRig, calibrated: bool = False, hosts: list[Host] | None = None
               ) -> tuple[list[str], HardwareFingerprint, str]:
    """The simulated rig ``rig`` as a tune's ``(sim_args, hardware, vllm_version)``:
    the sim's options (``--sim-calibrated`` when ``calibrated``), the cards the planner
    sees and the vLLM rules the sim follows. ``hosts`` (two or more: a sim rig launched
    over a profile's hosts): the cards sit in those hosts, joined by the slowest link they
    name, else the sim's ``link`` — the fingerprint the launch's run records
    (:func:`app.run.hardware.rig_hardware`)."""
    # deferred: the sim's rules only for a sim tune; the rig's fingerprint only over hosts
    from app.run.hardware import rig_hardware

    rules = SIM_VLLM_RULES  # Engine.SIM.plan_version: the sim's own, whatever vLLM is installed
    args = rig.argv() + (["--sim-calibrated"] if calibrated else [])
    if hosts is not None and len(hosts) >= 2:
        hw = rig_hardware(Engine.SIM, hosts, [{} for _ in hosts],
                          info={"gpu": rig.gpu, "gpu_count": rig.count, "hosts": rig.hosts, "link": rig.link})
        return args, HardwareFingerprint(gpu=hw.gpu, count=hw.count, hosts=hw.hosts, link=hw.link), rules
    return args, HardwareFingerprint(gpu=rig.gpu, count=rig.count, hosts=rig.hosts, link=rig.link), rules


def rig_target(hosts: list[Host], ssh: SshOptions | None = None, timeout: float = 180.0
               ) -> tuple[HardwareFingerprint, str | None]:
    """The real cards of a rig of ``hosts`` as a tune's ``(hardware, vllm_version)``:
    every host's agent is opened (``ssh``) for its hello (its NVML cards, or the CPU
    build's cores and memory) and the head probed for its vLLM version — the fingerprint
    a launch's run records (:func:`app.run.hardware.rig_hardware`: "N hosts × C× CARD").
    Blocking (SSH; the agents are closed again) the first time; then cached per hosts and
    ``ssh`` for the life of the process, as :func:`local_target`'s interpreter probe is
    (the Tune tab asks again at every change of its form). Raises ValueError naming the
    host (app.hosts.link.HostError) or saying the head has no vLLM (not cached)."""
    return _rig_target(tuple(h.model_dump_json() for h in hosts), ssh, timeout)


@functools.lru_cache(maxsize=8)
def _rig_target(hosts_json: tuple[str, ...], ssh: SshOptions | None, timeout: float
                ) -> tuple[HardwareFingerprint, str | None]:
    """:func:`rig_target` of the hosts as JSON (hashable: the cache's key)."""
    # deferred: SSH and the rig's fingerprint only for a tune over hosts
    from app.hosts.link import HostError
    from app.hosts.rig import Rig
    from app.run.hardware import rig_hardware

    hosts = [Host.model_validate_json(h) for h in hosts_json]
    try:
        with Rig(hosts, ssh=ssh) as rig:
            rig.open(timeout)
            hellos = [link.hello or {} for link in rig.links]
            probe = rig.call(rig.links[0].probe(None), timeout)
    except HostError as e:
        raise ValueError(str(e)) from None
    vllm = (probe or {}).get("vllm") or {}
    if not vllm.get("version"):
        raise ValueError(f"host {hosts[0].label()}: no vLLM with its python ({hosts[0].python or 'the default'}): "
                         f"{vllm.get('error') or 'not found'}")
    return rig_hardware(Engine.VLLM, hosts, hellos, vllm_version=vllm["version"]), vllm["version"]


def local_target(python: str | None, gpus: list[int] | None) -> tuple[str, HardwareFingerprint, str | None]:
    """This machine's cards as a tune's ``(python, hardware, vllm_version)``: the
    interpreter with vLLM (``python`` or the default one), NVML's cards (``gpus``: the
    selected CUDA indices; ``CPU`` for the CPU build). Blocking (a subprocess, NVML).
    Raises ValueError naming the interpreter when it has no vLLM."""
    # deferred: the interpreter probe and NVML only for a tune of real cards
    from app.run.hardware import local_hardware
    from app.server.interpreter import inspect_interpreter, resolve_python

    py = resolve_python(python)
    try:
        interp = inspect_interpreter(py)
    except Exception as e:  # no vLLM there: say which interpreter
        raise ValueError(f"--python {py}: {e}") from None
    return py, local_hardware(gpus, interp.version, interp.is_cpu_build), interp.version


@dataclass(frozen=True)
class TuneStart:
    """What a tune starts from (the window's forms, a profile): ``engine`` an
    :class:`app.engines.Engine`, a tunable one (``sim`` or ``vllm``; a name is taken as
    its engine), ``config`` the starting flags, ``sim`` the simulated rig (engine sim),
    ``python`` the interpreter with vLLM (engine vllm; None: the default), ``ramp`` the
    profile's ramp (its lengths and SLO the defaults), ``profile`` the profile a saved
    recommendation is based on; ``hosts`` the profile's rig (two or more: every launch
    goes over them), ``ray_address`` its Ray cluster, ``ssh`` how the hosts are reached
    and ``expose`` whether the user confirmed the head's bind beyond loopback."""

    engine: Engine
    config: ServerConfig
    sim: Optional[SimRig] = None
    python: Optional[str] = None
    ramp: Optional[RampSpec] = None
    profile: Optional[Profile] = None
    hosts: tuple[Host, ...] = ()
    ray_address: Optional[str] = None
    ssh: Optional[SshOptions] = None
    expose: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "engine", Engine(self.engine))


def target_of(start: TuneStart) -> tuple[list[str], HardwareFingerprint, str | None, str | None]:
    """``(sim_args, hardware, vllm_version, python)`` of ``start``'s rig (blocking for
    engine vllm: :func:`local_target`, or over hosts :func:`rig_target`). Raises
    ValueError in words."""
    hosts = list(start.hosts) if len(start.hosts) >= 2 else None
    version: str | None
    if not start.engine.spec.tunable:
        raise ValueError(f"engine {start.engine}: a tune launches its servers ({' or '.join(TUNABLE)}), it cannot "
                         "attach")
    if start.engine.simulated:
        args, hw, version = sim_target(start.sim or SimRig(), hosts=hosts)
        return args, hw, version, None
    if hosts:
        hw, version = rig_target(hosts, start.ssh)
        return [], hw, version, start.python
    py, hw, version = local_target(start.python, start.config.gpus)
    return [], hw, version, py


def space_candidates(spec: TuneSpec) -> list[dict[str, Any]]:
    """Every configuration of ``spec``'s space with the planner's verdict, without a
    prediction (fast: the planner only) — :meth:`Candidate.as_dict` each; the same
    enumeration the tune runs. Raises ValueError naming the input."""
    return [c.as_dict() for c in spec.candidates()]


def workload_from_ramp(ramp: RampSpec | None, prompt_tokens: int | None = None, output_tokens: int | None = None,
                       fixed_lengths: bool = False, seed: int | None = None) -> tuple[int, int, float, int]:
    """``(prompt_tokens, output_tokens, length_spread, seed)`` of a tune: the given
    lengths, else the middle of the profile ramp's ranges, else 512/128 tokens; the
    spread (±, a fraction) 0 with ``fixed_lengths``, else the ramp's, else 0.25."""
    def mid(name: str, given: int | None, default: int) -> int:
        if given:
            return given
        if ramp is None:
            return default
        lo, hi = ramp.length_range(name)
        return (lo + hi) // 2

    pt = mid("prompt_tokens", prompt_tokens, DEFAULT_PROMPT_TOKENS)
    ot = mid("output_tokens", output_tokens, DEFAULT_OUTPUT_TOKENS)
    spread = 0.0 if fixed_lengths else (ramp.length_spread if ramp is not None else DEFAULT_SPREAD)
    return pt, ot, spread, seed if seed is not None else (ramp.seed if ramp is not None else 0)


def first_error(e: ValueError) -> str:
    """A pydantic ValidationError as ``field: message; …`` (any other error as is)."""
    errs = getattr(e, "errors", None)
    if callable(errs):
        return "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in errs())
    return str(e)


def scalar(tok: str) -> Any:
    """A value the user typed for a vLLM option: true/on, false/off, an int, a float,
    else the text."""
    t = tok.strip()
    if t.lower() in ("true", "on"):
        return True
    if t.lower() in ("false", "off"):
        return False
    for conv in (int, float):
        try:
            return conv(t)
        except ValueError:
            pass
    return t


def build_spec(*, engine: Engine | str, config: ServerConfig, hardware: HardwareFingerprint, slo: SLO,
               space: dict[str, Any] | None = None, **kw: Any) -> TuneSpec:
    """The :class:`TuneSpec` of a tune: ``space`` the :class:`TuneSpace` fields (None
    values: the dimension's default), every other keyword a TuneSpec field
    (``prompt_tokens``, ``objective``, ``max_launches``, ``max_minutes`` …). Raises
    ValueError naming the field (one line) for an empty SLO or a bad value."""
    if slo.is_empty():
        raise ValueError("a tune needs an SLO to judge capacities on: give --slo-ttft-p99 and/or --slo-tpot-p99 "
                         "(or --slo-e2e-p99, --slo-failure-rate)")
    try:
        sp = TuneSpace(**{k: v for k, v in (space or {}).items() if v is not None})
        return TuneSpec(engine=engine, config=config, hardware=hardware, slo=slo, space=sp,
                        **{k: v for k, v in kw.items() if v is not None})
    except ValueError as e:
        raise ValueError(first_error(e)) from None


# ---------------------------------------------------------------------- the space as check boxes
#: the dimensions shown as check boxes: (name, the ServerConfig field or "checkpoint", label)
DIMENSIONS: tuple[tuple[str, str, str], ...] = (
    ("tp", "tensor_parallel_size", "tensor_parallel_size"),
    ("pp", "pipeline_parallel_size", "pipeline_parallel_size"),
    ("dp", "data_parallel_size", "data_parallel_size"),
    ("checkpoints", "checkpoint", "checkpoint (quantization)"),
    ("kv_cache_dtype", "kv_cache_dtype", "kv_cache_dtype"),
    ("enforce_eager", "enforce_eager", "CUDA graphs"),
    ("max_num_batched_tokens", "max_num_batched_tokens", "max_num_batched_tokens"),
)


def _value(c: dict[str, Any], field: str) -> Any:
    if field == "checkpoint":
        return c.get("checkpoint") or c["server"].get("model")
    v = c["server"].get(field)
    if field in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size") and v is None:
        return 1
    return v


def value_label(field: str, v: Any) -> str:
    """A dimension's value as shown: CUDA graphs ``on``/``off`` (``enforce_eager`` is
    their opposite), the rest as vLLM writes it."""
    if field == "enforce_eager":
        return "off (eager)" if v else "on"
    return str(v)


def value_status(candidates: list[dict[str, Any]]) -> dict[str, dict[Any, Optional[str]]]:
    """Per dimension (:data:`DIMENSIONS`' field) and value present among ``candidates``
    (``res["candidates"]`` or :meth:`Candidate.as_dict`), None when some configuration
    with that value can start, else why not: the planner's reason most of them share
    (``weights_do_not_fit: …``), with how many were pruned. A dimension whose values
    are all alike (the CPU build's kv_cache_dtype) still lists its one value."""
    out: dict[str, dict[Any, Optional[str]]] = {}
    for _, field, _ in DIMENSIONS:
        groups: dict[Any, list[dict]] = {}
        for c in candidates:
            groups.setdefault(_value(c, field), []).append(c)
        st: dict[Any, Optional[str]] = {}
        for v, cs in groups.items():
            if v is None:
                continue
            if any(c.get("pruned_because") is None for c in cs):
                st[v] = None
                continue
            reasons: dict[str, int] = {}
            for c in cs:
                reasons[c["pruned_because"]] = reasons.get(c["pruned_because"], 0) + 1
            top = max(reasons.items(), key=lambda x: x[1])[0]
            st[v] = top if len(cs) == 1 else f"all {len(cs)} configurations pruned — {top}"
        out[field] = dict(sorted(st.items(), key=lambda x: (str(type(x[0])), x[0])))
    return out


# ---------------------------------------------------------------------- the candidates
def _users(x: Any) -> str:
    return "—" if x is None else f"{x:g}"


def _fmt(x: float | None, digits: int = 0) -> str:
    return "—" if x is None else f"{x:,.{digits}f}"


def ordered_candidates(res: dict[str, Any]) -> list[dict[str, Any]]:
    """The candidates as shown: measured first (best first), then the predicted (best
    first, the screened-only after), then the pruned."""
    rows = res["candidates"]
    runnable = [c for c in rows if c["pruned_because"] is None]
    runnable.sort(key=lambda c: (c["measured_users"] is None, c["predicted_users"] is None,
                                 -(c["measured_users"] or c["predicted_users"] or c.get("screen_users") or 0)))
    return runnable + [c for c in rows if c["pruned_because"] is not None]


def predicted_text(c: dict[str, Any]) -> str:
    """A candidate's predicted users (``≈N``: screened only, the engine did not run)."""
    if c["predicted_users"] is not None:
        return _users(c["predicted_users"])
    return f"≈{c['screen_users']:g}" if c.get("screen_users") is not None else "—"


def measured_text(c: dict[str, Any]) -> str:
    """A candidate's measured users with the search's interval, why its launch failed,
    or ``—``."""
    if c.get("failed"):
        return "failed: " + c["failed"][:60]
    if c["measured_users"] is None:
        return "—"
    return f"{c['measured_users']:g} ({_users(c.get('measured_low'))}–{_users(c.get('measured_high'))})"


def candidates_table(res: dict[str, Any], limit: int = 25) -> str:
    """Candidates as text: measured first (best first), then the predicted, then the pruned."""
    rows = ordered_candidates(res)
    runnable = [c for c in rows if c["pruned_because"] is None]
    pruned = [c for c in rows if c["pruned_because"] is not None]
    out = [f"{'configuration':58} {'predicted':>9} {'measured (interval)':>22}   (≈: screened only)"]
    for c in runnable[:limit]:
        out.append(f"{c['key'][:58]:58} {predicted_text(c):>9} {measured_text(c)[:40]:>22}")
    if len(runnable) > limit:
        out.append(f"… {len(runnable) - limit} more predicted below these")
    reasons: dict[str, int] = {}
    for c in pruned:
        reasons[c["pruned_because"].split(":")[0]] = reasons.get(c["pruned_because"].split(":")[0], 0) + 1
    if pruned:
        out.append(f"pruned by the planner: {len(pruned)} ("
                   + ", ".join(f"{k} ×{n}" for k, n in sorted(reasons.items(), key=lambda x: -x[1])) + ")")
        for c in pruned[:3]:
            out.append(f"  {c['key']}: {c['pruned_because'][:150]}")
    return "\n".join(out)


def flags_text(server: dict[str, Any]) -> str:
    """``name=value …`` of the flags a configuration sets (model, name and host left out)."""
    return " ".join(f"{k}={v}" for k, v in (server or {}).items() if k not in ("model", "served_model_name", "host"))


#: the flags a tune varies, in the order :func:`flags_brief` lists them
TUNED_FLAGS = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "quantization",
               "kv_cache_dtype", "enforce_eager", "max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization")


def flags_brief(server: dict[str, Any]) -> str:
    """The flags a tune varies, as ``name value`` pairs joined by `` · `` (vLLM's
    option names; ``enforce_eager`` False left out: CUDA graphs on is vLLM's default)."""
    out = []
    for k in TUNED_FLAGS:
        v = (server or {}).get(k)
        if v is None or (k == "enforce_eager" and v is False):
            continue
        out.append(f"{k} {str(v).lower() if isinstance(v, bool) else v}")
    return " · ".join(out)


def card_flags(entry: dict[str, Any]) -> str:
    """A result column's flags in one short line: its candidate's label (``TP4 PP1 DP2 ·
    awq · kv auto · graphs · mnbt 2048``) with the flags the label leaves out
    (``max_num_seqs``, ``gpu_memory_utilization``); the starting flags by name
    (:func:`flags_brief`)."""
    server = entry.get("server") or {}
    key = entry.get("key")
    if not key or key == "starting flags":
        return flags_brief(server)
    extra = [f"{k} {server[k]}" for k in ("max_num_seqs", "gpu_memory_utilization") if server.get(k) is not None]
    return " · ".join([key, *extra])


def result_columns(res: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``[(title, entry)]`` of the result side by side: recommended, runner-up, starting
    flags (those present). Each entry: ``server``, ``users`` (at the SLO), ``users_low``/
    ``users_high``, ``output_tps`` (output tok/s there), ``measured``, ``sentence`` or
    ``error`` (see :meth:`app.tuner.tune.Tuner.result`)."""
    cols = [("Recommended", res.get("recommendation")), ("Runner-up", res.get("runner_up")),
            ("Starting flags", res.get("baseline"))]
    return [(t, e) for t, e in cols if e]


def entry_figures(entry: dict[str, Any], cards: int, pricing: Pricing | None = None) -> list[tuple[str, str]]:
    """The verdict's figures of one column: users at the SLO (with the interval), output
    tok/s, J/token and — when Settings give a price — $/M output tokens (each ``—`` when
    unknown); last ``("", "measured[, confirmed]" | "predicted")``."""
    tps, j = entry.get("output_tps"), entry.get("j_per_token")
    rented, energy = cost_per_mtok(tps, cards, j, pricing or Pricing())
    cost = None if rented is None and energy is None else (rented or 0.0) + (energy or 0.0)
    cur = (pricing or Pricing()).currency
    iv = "" if entry.get("users_low") is None else f" ({_users(entry.get('users_low'))}–{_users(entry.get('users_high'))})"
    priced = pricing is not None and (pricing.gpu_hour is not None or pricing.kwh is not None)
    return [("users at SLO", _users(entry.get("users")) + iv), ("output tok/s", _fmt(tps)),
            ("J/token", _fmt(j, 2)),
            *([(f"{cur}/M tokens", "—" if cost is None else f"{cost:.3g}")] if priced else []),
            ("", "measured" + (", confirmed" if entry.get("verified") else "") if entry.get("measured")
             else "predicted")]


def summary_text(res: dict[str, Any]) -> str:
    """The result in words: the tune's cost, the three columns, the recommendation's sentence."""
    out = []
    rec = res.get("recommendation")
    slo = ", ".join(f"{k} ≤ {v:g}" for k, v in res["slo"].items())
    out.append(f"tune {res['tune_id']}: {res['launches']} launch{'es' if res['launches'] != 1 else ''}, "
               f"{res['rig_seconds'] / 60:.1f} rig min, {res['wall_seconds'] / 60:.1f} wall min; objective "
               f"{res['objective']}; SLO {slo}; stopped: {res['stop_reason']}")
    out.append("")
    out.append(f"{'':16} {'users':>7} {'interval':>11} {'out tok/s':>10}  flags")
    for name, e in result_columns(res):
        tag = "" if e.get("measured") else " (predicted)"
        iv = f"{_users(e.get('users_low'))}–{_users(e.get('users_high'))}"
        out.append(f"{name.lower():16} {_users(e.get('users')):>7} {iv:>11} {_fmt(e.get('output_tps')):>10}  "
                   f"{flags_text(e.get('server') or {})}{tag}")
        if e.get("error"):
            out.append(f"{'':16} {e['error'][:200]}")
    if rec:
        out.append("")
        out.append(("✔ " if rec.get("verified") else "(not confirmed) ") + (rec.get("sentence") or ""))
        if not rec.get("measured", True):
            out.append("(predicted only)")
    else:
        out.append(no_recommendation_text())
    err = res.get("model_error")
    if err:
        out.append(f"predictions above (before fitting to these launches): {err['text']}")
    out += confidence_lines(res.get("confidence"))
    return "\n".join(out)


def confidence_lines(conf: dict[str, Any] | None) -> list[str]:
    """How sure the tune is, in words (the tune JSON's ``confidence``): the families
    measured, the model's residual between them, what was not tried and why."""
    if not conf:
        return []
    out = [f"how sure: {conf['measured']} of {conf['startable']} startable configurations measured; the model's "
           f"residual between measured families ±{conf['residual_pct']:g} %"]
    for d, f in conf["families"].items():
        name = FAMILY_WORDS.get(d, d)
        line = f"  {name}: measured {', '.join(f['measured']) or 'none'}"
        if f["untried"]:
            line += f"; not tried: {len(f['untried'])}"
        out.append(line)
        for u in f["untried"][:6]:
            out.append(f"    {u['value']}: {u['why']}")
        if len(f["untried"]) > 6:
            out.append(f"    … and {len(f['untried']) - 6} more")
    return out


def no_recommendation_text() -> str:
    return "no configuration met the SLO: loosen it, or give more cards or a smaller checkpoint"


# ---------------------------------------------------------------------- the Pareto plot
@dataclass(frozen=True)
class ParetoPoint:
    """One point of the Pareto plot: ``key`` the configuration, ``users`` the
    concurrency, ``per_user`` output tok/s per user (x), ``per_gpu`` output tok/s per
    GPU (y); ``measured`` (a level of its capacity search) or predicted (at its
    predicted users); ``slo_met`` (at or below the capacity the search found)."""

    key: str
    users: float
    per_user: float
    per_gpu: float
    measured: bool
    slo_met: bool


def pareto_points(res: dict[str, Any]) -> list[ParetoPoint]:
    """Every level each measured candidate's search ran, and each unmeasured runnable
    candidate at its predicted users (output tok/s ÷ users, ÷ cards)."""
    out: list[ParetoPoint] = []
    for c in res["candidates"]:
        if c["pruned_because"] is not None:
            continue
        cards = max(1, int(c.get("cards") or 1))
        if c["measured_users"] is not None and c.get("levels"):
            for lv in c["levels"]:
                n, tps = float(lv["concurrency"]), float(lv["output_tps"])
                if n > 0 and tps > 0:
                    out.append(ParetoPoint(c["key"], n, tps / n, tps / cards, True, n <= c["measured_users"]))
        elif c["measured_users"] is None and c.get("predicted_users") and c.get("predicted_tps"):
            n, tps = float(c["predicted_users"]), float(c["predicted_tps"])
            out.append(ParetoPoint(c["key"], n, tps / n, tps / cards, False, True))
    return out


def pareto_front(points: list[ParetoPoint]) -> list[ParetoPoint]:
    """The measured points at the SLO that no other one beats on both axes, by
    output tok/s per user (the line ``plot_pareto`` draws)."""
    pts = sorted((p for p in points if p.measured and p.slo_met), key=lambda p: (-p.per_user, -p.per_gpu))
    front: list[ParetoPoint] = []
    best_y = -math.inf
    for p in pts:
        if p.per_gpu > best_y:
            front.append(p)
            best_y = p.per_gpu
    return sorted(front, key=lambda p: p.per_user)


def slo_per_user_floor(res: dict[str, Any]) -> float | None:
    """The SLO's boundary on the x axis: output tok/s per user ≥ 1 ÷ TPOT p99 bound
    (a stream slower than that breaks the TPOT bound); None without a TPOT bound."""
    tpot = (res.get("slo") or {}).get("tpot_p99")
    return 1.0 / tpot if tpot else None


def recommended_point(res: dict[str, Any]) -> ParetoPoint | None:
    """The recommendation at its users at the SLO (None without one)."""
    rec = res.get("recommendation")
    if not rec or not rec.get("users") or not rec.get("output_tps"):
        return None
    cards = next((c.get("cards") for c in res["candidates"] if c["key"] == rec.get("key")), None) or 1
    n, tps = float(rec["users"]), float(rec["output_tps"])
    return ParetoPoint(rec.get("key", ""), n, tps / n, tps / max(1, int(cards)), bool(rec.get("measured")), True)


# ---------------------------------------------------------------------- progress
class ProgressClock:
    """The progress line of a running tune: fed each ``res`` as it comes
    (:meth:`update`, with the wall time ``now`` in s), it says "launch k of ≤ n", the
    phase, the elapsed wall time and an ETA — an upper bound: the remaining launches at
    the mean wall time of those done (the tune may converge sooner), within
    ``max_minutes``; unknown before a launch has finished."""

    def __init__(self, max_launches: int, max_minutes: float | None, started: float) -> None:
        self.max_launches = max_launches
        self.max_minutes = max_minutes
        self.started = started
        self.res: dict[str, Any] | None = None
        self.message = "preparing: the planner prunes and predicts"
        self._launch_started: float | None = None
        self._running_n: int | None = None

    def update(self, res: dict[str, Any], message: str, now: float) -> None:
        self.res, self.message = res, message
        log = res.get("launch_log") or []
        run = next((x for x in reversed(log) if x["status"] == "running"), None)
        if run is not None and run["n"] != self._running_n:
            self._running_n, self._launch_started = run["n"], now
        elif run is None:
            self._running_n = self._launch_started = None

    def launch(self) -> int:
        return len((self.res or {}).get("launch_log") or [])

    def eta(self, now: float) -> float | None:
        log = [x for x in (self.res or {}).get("launch_log") or [] if x["status"] != "running"]
        if not log:
            return None
        mean = sum(x["wall_seconds"] for x in log) / len(log)
        left = max(0, self.max_launches - len(log))
        cur = (now - self._launch_started) if self._launch_started is not None else 0.0
        eta = max(0.0, mean * left - min(cur, mean))
        if self.max_minutes is not None:
            eta = min(eta, max(0.0, self.max_minutes * 60 - (now - self.started)) + mean)
        return eta

    def text(self, now: float) -> str:
        """``launch 1 of ≤ 4 · measuring TP4 … · elapsed 1:05 · ETA ≤ 3:20``."""
        k = self.launch()
        phase = {"measure": "measuring", "confirm": "confirming", "done": "done"}.get(
            (self.res or {}).get("phase", ""), "preparing")
        run = next((x for x in reversed((self.res or {}).get("launch_log") or []) if x["status"] == "running"), None)
        what = f"{phase} {run['key']}" if run is not None else phase
        eta = self.eta(now)
        parts = [f"launch {k} of ≤ {self.max_launches}" if k else f"no launch yet (≤ {self.max_launches})", what,
                 f"elapsed {clock_text(now - self.started)}",
                 "ETA after the first launch" if eta is None else f"ETA ≤ {clock_text(eta)}"]
        return " · ".join(parts)


# ---------------------------------------------------------------------- exports
def vllm_serve_command(server: dict[str, Any], version: str | None = None) -> str:
    """The recommendation as one ``vllm serve`` line of the options vLLM ``version``
    accepts (app.profiles.interop.config_command: no sim or Dyno option, no local host)."""
    return config_command(ServerConfig(**server), version)


def vllm_config_yaml(server: dict[str, Any], version: str | None = None) -> str:
    """The recommendation as vLLM's ``--config`` YAML (app.profiles.interop.config_yaml)."""
    return config_yaml(ServerConfig(**server), version)


def export_config(path: str, server: dict[str, Any], version: str | None = None) -> None:
    """Write :func:`vllm_config_yaml` to ``path`` atomically (OSError when it cannot)."""
    write_atomic(path, vllm_config_yaml(server, version))


def tune_ramp_fields(spec: TuneSpec) -> dict[str, Any]:
    """What a tune (a :class:`app.tuner.tune.TuneSpec`) judged its candidates on, as
    RampSpec fields: the SLO and the request shape."""
    return {"slo": spec.slo.model_dump(exclude_none=True), "prompt_tokens": spec.prompt_tokens,
            "output_tokens": spec.output_tokens, "length_spread": spec.length_spread}


def recommended_config(entry: dict[str, Any], spec: TuneSpec) -> ServerConfig:
    """The whole configuration of a result entry (the recommendation, the runner-up) as
    the tune launched it: its ``config`` (the model, every vLLM option, the extra options,
    the environment and the cards); an entry stored before the tune kept it: the tune's
    starting configuration with the entry's ``server`` options in place of its own."""
    if entry.get("config"):
        return ServerConfig.model_validate(entry["config"])
    base = spec.config.model_dump()
    base.update({k: None for k in base if k in VLLM_OPTIONS and k != "host"})
    base.update(entry.get("server") or {})
    return ServerConfig.model_validate(base)


def tuned_name(res: dict[str, Any], spec: TuneSpec) -> str:
    """A profile name from a tune's result: ``Meta-Llama-3.1-70B-Instruct-AWQ-INT4 · 4×
    RTX 4090 (sim) · TP2 PP1 DP2 · tuned 27 users`` (the model, the rig, the split of the
    recommended candidate's key; at most 120 characters, the profile's limit; the
    description has every flag)."""
    rec = res.get("recommendation") or {}
    cfg = recommended_config(rec, spec)
    rig = f"{spec.hardware.count}× {spec.hardware.gpu}" + (" (sim)" if spec.engine.simulated else "")
    users = rec.get("users")
    tail = f"tuned {users:g} users" if isinstance(users, (int, float)) else "tuned"
    split = str(rec.get("key") or "").split(" · ", 1)[0]
    name = " · ".join(p for p in (model_label(cfg.model).rsplit("/", 1)[-1], rig, split, tail) if p)
    return name[:120]


def tuned_description(res: dict[str, Any], spec: TuneSpec) -> str:
    """A profile description from a tune's result: what was measured, on what, judged how,
    whether a second launch confirmed it, and the tune it came from."""
    rec = res.get("recommendation") or {}
    rig = f"{spec.hardware.count}× {spec.hardware.gpu}" + (" (simulated)" if spec.engine.simulated else "")
    users, lo, hi = rec.get("users"), rec.get("users_low"), rec.get("users_high")
    what = "no users measured" if users is None else f"{users:g} users at the SLO" + (
        f" ({lo:g}–{hi:g})" if lo is not None and hi is not None and (lo != users or hi != users) else "")
    tps = rec.get("output_tps")
    out = [f"Tuned for {slo_text(spec.slo.model_dump(exclude_none=True))} on {rig}: {what}"
           + (f", {tps:.0f} output tok/s" if tps else "") + ".",
           f"Flags: {flags_text(rec.get('server') or {})}.",
           "Confirmed by a second launch." if rec.get("verified") else "Not confirmed by a second launch.",
           f"Tune {res.get('tune_id')}: {res.get('launches')} launches, objective {res.get('objective')}."]
    return " ".join(out)


def tuned_profile(res: dict[str, Any], spec: TuneSpec, *, engine: Engine | str | None = None,
                  sim: SimRig | None = None, base: Profile | None = None, name: str | None = None) -> Profile:
    """The tune's recommendation as a profile that re-creates what was measured: every
    option of the configuration the tune launched (:func:`recommended_config`: extra
    options such as the sim's hidden rig, the environment, the cards it used — the first
    TP × PP × DP of a longer list; none when it named none), the simulated rig the tune ran on (``sim``, else
    ``base``'s, with the tune's card count), ``base``'s ramp with what the tune judged on
    (:func:`tune_ramp_fields`) and ``base``'s hosts; a name (:func:`tuned_name`, unless
    given) and a description (:func:`tuned_description`) from the result — not ``base``'s,
    nor its results. Raises ValueError without a recommendation (pydantic's names the
    field of a bad value)."""
    rec = res.get("recommendation")
    if not rec:
        raise ValueError("no recommendation to save yet")
    eng = Engine(engine or spec.engine)
    cfg = recommended_config(rec, spec)
    gpus = cfg.gpus[:cfg.world_size] if cfg.gpus is not None else None
    rig = sim or (base.sim if base is not None else None)
    if eng.simulated:
        rig = (rig or SimRig()).model_copy(update={"gpu": spec.hardware.gpu, "count": spec.hardware.count})
    ramp = {**(base.ramp.model_dump(exclude_none=True) if base is not None else {}), **tune_ramp_fields(spec)}
    prof = profile_from_settings(name or tuned_name(res, spec), engine=eng, server=cfg.to_vllm_config(),
                                 env=dict(cfg.env), gpus=gpus,
                                 sim=rig.model_dump(exclude_none=True) if eng.simulated and rig else None,
                                 ramp=ramp, hosts=list(base.hosts) if base is not None else None,
                                 ray_address=base.ray_address if base is not None else None)
    return prof.updated(description=tuned_description(res, spec))


def save_as_profile(res: dict[str, Any], spec: TuneSpec, *, engine: Engine | str | None = None,
                    sim: SimRig | None = None, base: Profile | None = None, name: str | None = None,
                    library: ProfileLibrary | None = None) -> str:
    """Save :func:`tuned_profile` in the user's library; returns the file's path. Raises
    ValueError (no recommendation, a bad name) or OSError (the disk)."""
    # deferred: only the save needs the library
    from app.profiles import ProfileLibrary

    prof = tuned_profile(res, spec, engine=engine, sim=sim, base=base, name=name)
    return str((library or ProfileLibrary()).save(prof))


def verify_ramp(res: dict[str, Any], spec: TuneSpec) -> RampSpec:
    """The capacity search that verifies a recommendation (the Tune tab's "Verify (find
    capacity)"): the very search the tune ran on each launch
    (:func:`app.tuner.tune.launch_search`: its workload, SLO, floor of requests per level
    and resolution) from the users the tune measured; ``url``/``model`` are the launch's."""
    rec = res.get("recommendation") or {}
    return launch_search(spec, spec.workload(), rec.get("users") or 1.0)
