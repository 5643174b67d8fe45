"""What a tune gives the user, for the CLI (``vllm-dyno tune``) and the GUI's Tune tab alike.

One place for: the rig a tune runs on (:func:`tune_rig`), the text tables
(:func:`candidates_table`, :func:`summary_text`), the search space as values per
dimension with the planner's reason for each pruned value (:func:`dimension_values`),
the Pareto points (:func:`pareto_points`), and the exports of a recommendation: the
``vllm serve`` command (:func:`vllm_serve_command`), vLLM's ``--config`` YAML
(:func:`vllm_config_yaml`) and a saved profile (:func:`save_as_profile`).

``res`` everywhere is :meth:`app.tuner.tune.Tuner.result` (the JSON of ``--json``).
"""
from __future__ import annotations

import shlex
from collections import Counter
from dataclasses import dataclass
from typing import Any, Optional

import yaml

from app.config import ServerConfig
from app.profiles import ProfileLibrary
from app.profiles.model import HardwareFingerprint, Profile, SimRig
from app.tuner.space import TuneSpace

#: the dimensions of the space (:class:`app.tuner.space.TuneSpace`'s), as the Tune tab shows them
DIMENSIONS = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "checkpoint",
              "kv_cache_dtype", "cuda_graphs", "max_num_batched_tokens")
DIMENSION_TITLES = {"tensor_parallel_size": "tensor_parallel_size", "pipeline_parallel_size": "pipeline_parallel_size",
                    "data_parallel_size": "data_parallel_size", "checkpoint": "checkpoint (quantization)",
                    "kv_cache_dtype": "kv_cache_dtype", "cuda_graphs": "CUDA graphs (enforce_eager off)",
                    "max_num_batched_tokens": "max_num_batched_tokens"}


# ---------------------------------------------------------------------- the rig
def tune_rig(engine: str, cfg: ServerConfig, sim: Optional[SimRig], python: Optional[str]
             ) -> tuple[list[str], HardwareFingerprint, Optional[str], Optional[str]]:
    """The rig of a tune: ``(sim_args, hardware, vllm_version, python)``.

    ``engine`` ``sim``: the simulated rig ``sim`` (its ``argv``; the sim follows the
    newest vLLM's rules); ``vllm``: this machine's selected cards (NVML) or the CPU
    build, with the interpreter's vLLM version (``python``: the vLLM interpreter, None:
    the default one). Blocking (an interpreter probe); raises ValueError naming what is
    missing."""
    if engine == "sim":
        if sim is None or not sim.gpu or not sim.count:
            raise ValueError("a tune on the simulated rig needs its cards: the GPU and how many")
        # deferred: the sim's rules only for a sim tune
        from app.sim.model_adapter import VLLM_RULES

        return sim.argv(), HardwareFingerprint(gpu=sim.gpu, count=sim.count), VLLM_RULES, python
    if engine != "vllm":
        raise ValueError(f"engine {engine!r}: a tune launches its own servers (sim or vllm), it cannot attach")
    # deferred: the interpreter probe and NVML only for a tune of real cards
    from app.run.hardware import local_hardware
    from app.server.interpreter import inspect_interpreter, resolve_python

    python = resolve_python(python)
    try:
        interp = inspect_interpreter(python)
    except Exception as e:  # no vLLM there: say which interpreter
        raise ValueError(f"the vLLM interpreter {python}: {e}") from None
    return [], local_hardware(cfg.gpus, interp.version, interp.is_cpu_build), interp.version, python


# ---------------------------------------------------------------------- text
def fmt_users(x: Any) -> str:
    return "—" if x is None else f"{x:g}"


def _fmt(x: Any, digits: int) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def measured_text(c: dict) -> str:
    """A candidate's measurement: ``users (low–high)``, ``failed: …`` or ``—``."""
    if c.get("failed"):
        return "failed: " + c["failed"][:40]
    if c.get("measured_users") is None:
        return "—"
    return f"{c['measured_users']:g} ({fmt_users(c.get('measured_low'))}–{fmt_users(c.get('measured_high'))})"


def predicted_text(c: dict) -> str:
    """A candidate's prediction: the step engine's users, ``≈N`` screened only, or ``—``."""
    if c.get("predicted_users") is not None:
        return fmt_users(c["predicted_users"])
    return f"≈{c['screen_users']:g}" if c.get("screen_users") is not None else "—"


def ordered_candidates(res: dict) -> tuple[list[dict], list[dict]]:
    """``(runnable, pruned)``: measured first (best first), then the predicted (best first)."""
    rows = res["candidates"]
    runnable = [c for c in rows if c["pruned_because"] is None]
    runnable.sort(key=lambda c: (c["measured_users"] is None, -(c["measured_users"] or c["predicted_users"] or 0)))
    return runnable, [c for c in rows if c["pruned_because"] is not None]


def candidates_table(res: dict, limit: int = 25) -> str:
    """Candidates: measured first (best first), then the predicted, then the pruned."""
    runnable, pruned = ordered_candidates(res)
    out = [f"{'configuration':58} {'predicted':>9} {'measured (interval)':>22}   (≈: screened only)"]
    for c in runnable[:limit]:
        out.append(f"{c['key'][:58]:58} {predicted_text(c):>9} {measured_text(c):>22}")
    if len(runnable) > limit:
        out.append(f"… {len(runnable) - limit} more predicted below these")
    reasons = Counter(c["pruned_because"].split(":")[0] for c in pruned)
    if pruned:
        out.append(f"pruned by the planner: {len(pruned)} ("
                   + ", ".join(f"{k} ×{n}" for k, n in reasons.most_common()) + ")")
        for c in pruned[:3]:
            out.append(f"  {c['key']}: {c['pruned_because'][:150]}")
    return "\n".join(out)


def flags_text(server: dict | None) -> str:
    """The flags of a ``server`` mapping, without the model and the bind address."""
    return " ".join(f"{k}={v}" for k, v in (server or {}).items() if k not in ("model", "served_model_name", "host"))


def result_columns(res: dict) -> list[tuple[str, dict]]:
    """The result card's columns: recommended, runner-up, starting flags (those present)."""
    cols = [("recommended", res.get("recommendation")), ("runner-up", res.get("runner_up")),
            ("starting flags", res.get("baseline"))]
    return [(n, e) for n, e in cols if e]


def summary_text(res: dict) -> str:
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
        iv = f"{fmt_users(e.get('users_low'))}–{fmt_users(e.get('users_high'))}"
        out.append(f"{name:16} {fmt_users(e.get('users')):>7} {iv:>11} {_fmt(e.get('output_tps'), 0):>10}  "
                   f"{flags_text(e.get('server'))}{tag}")
        if e.get("error"):
            out.append(f"{'':16} {e['error'][:200]}")
    if rec:
        out.append("")
        out.append(("✔ " if rec.get("verified") else "(not confirmed) ") + (rec.get("sentence") or ""))
        if not rec.get("measured", True):
            out.append("(predicted only)")
    else:
        out.append(NOTHING_MET)
    return "\n".join(out)


NOTHING_MET = "no configuration met the SLO: loosen it, or give more cards or a smaller checkpoint"


# ---------------------------------------------------------------------- the space
@dataclass
class DimensionValue:
    """One value of one dimension of the space: ``label`` as shown, ``candidates`` with
    it, ``pruned`` of them, and ``reason`` — the planner's most common reason when every
    candidate with this value is pruned (the value cannot start), else None."""

    dimension: str
    value: Any
    label: str
    candidates: int
    pruned: int
    reason: Optional[str]


def candidate_value(c: dict, dimension: str) -> tuple[Any, str]:
    """``(value, label)`` of candidate ``c`` (a ``res["candidates"]`` row) in ``dimension``."""
    s = c.get("server") or {}
    if dimension in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
        v = s.get(dimension) or 1
        return v, str(v)
    if dimension == "checkpoint":
        v = c.get("checkpoint") or s.get("quantization") or "bf16"
        return v, f"{v} ({s.get('model', '')})"
    if dimension == "kv_cache_dtype":
        v = s.get("kv_cache_dtype") or "auto"
        return v, str(v)
    if dimension == "cuda_graphs":
        v = not bool(s.get("enforce_eager"))
        return v, "on" if v else "off (enforce_eager)"
    v = s.get(dimension)
    return v, "default" if v is None else str(v)


def dimension_values(res: dict) -> dict[str, list[DimensionValue]]:
    """The space as check boxes: for each dimension of :data:`DIMENSIONS` that has a value
    in ``res["candidates"]``, its values (sorted) with how many candidates carry each, how
    many the planner pruned, and — for a value every candidate of which was pruned — the
    planner's reason (the commonest among them)."""
    out: dict[str, list[DimensionValue]] = {}
    for dim in DIMENSIONS:
        groups: dict[Any, list[dict]] = {}
        labels: dict[Any, str] = {}
        for c in res["candidates"]:
            v, label = candidate_value(c, dim)
            groups.setdefault(v, []).append(c)
            labels[v] = label
        vals = []
        for v in sorted(groups, key=lambda x: (str(type(x)), x if x is not None else 0)):
            cs = groups[v]
            pr = [c["pruned_because"] for c in cs if c["pruned_because"] is not None]
            reason = Counter(pr).most_common(1)[0][0] if pr and len(pr) == len(cs) else None
            vals.append(DimensionValue(dim, v, labels[v], len(cs), len(pr), reason))
        out[dim] = vals
    return out


def narrowed_space(base: TuneSpace, chosen: dict[str, list[Any]], res: dict) -> TuneSpace:
    """``base`` narrowed to the values the user kept: ``chosen`` maps a dimension of
    :data:`DIMENSIONS` to its kept values (as :func:`candidate_value` gives them); a
    dimension not in ``chosen`` keeps ``base``'s. ``res``: the dry run the values came
    from (a kept checkpoint's model id). Raises ValueError naming a dimension left empty."""
    upd: dict[str, Any] = {}
    for dim, vals in chosen.items():
        if not vals:
            raise ValueError(f"{DIMENSION_TITLES.get(dim, dim)}: keep at least one value")
        if dim == "tensor_parallel_size":
            upd["tp"] = list(vals)
        elif dim == "pipeline_parallel_size":
            upd["pp"] = list(vals)
        elif dim == "data_parallel_size":
            upd["dp"] = list(vals)
        elif dim == "kv_cache_dtype":
            upd["kv_cache_dtype"] = list(vals)
        elif dim == "cuda_graphs":
            upd["enforce_eager"] = [not v for v in vals]
        elif dim == "max_num_batched_tokens":
            upd["max_num_batched_tokens"] = [int(v) for v in vals if v is not None] or None
        elif dim == "checkpoint":
            ids = {}
            for c in res["candidates"]:
                label = candidate_value(c, "checkpoint")[0]
                if label in vals:
                    ids[label] = (c.get("server") or {}).get("model")
            upd["checkpoints"] = {k: v for k, v in ids.items() if v}
    return TuneSpace.model_validate({**base.model_dump(), **upd})


# ---------------------------------------------------------------------- Pareto
@dataclass
class ParetoPoint:
    """A candidate on the Pareto plot of ``vllm bench sweep plot_pareto``: ``per_user``
    output tok/s per user (x) and ``per_gpu`` output tok/s per card (y), at its users at
    the SLO; ``measured`` (else predicted); ``role``: recommended, runner-up or ''."""

    key: str
    users: float
    per_user: float
    per_gpu: float
    measured: bool
    role: str = ""


def pareto_points(res: dict) -> list[ParetoPoint]:
    """Every candidate with a capacity (measured, else predicted) and tokens/s."""
    rec = (res.get("recommendation") or {}).get("key")
    ru = (res.get("runner_up") or {}).get("key")
    out = []
    for c in res["candidates"]:
        if c["pruned_because"] is not None or c.get("failed"):
            continue
        measured = c.get("measured_users") is not None
        users = c["measured_users"] if measured else c.get("predicted_users")
        tps = c.get("measured_tps") if measured else c.get("predicted_tps")
        if not users or not tps:
            continue
        role = "recommended" if c["key"] == rec else "runner-up" if c["key"] == ru else ""
        out.append(ParetoPoint(c["key"], users, tps / users, tps / max(1, c.get("cards") or 1), measured, role))
    return out


def pareto_front(points: list[ParetoPoint]) -> list[ParetoPoint]:
    """The points no other point beats on both axes, by ``per_user`` ascending."""
    front = [p for p in points if not any(q.per_user >= p.per_user and q.per_gpu >= p.per_gpu
                                          and (q.per_user > p.per_user or q.per_gpu > p.per_gpu) for q in points)]
    return sorted(front, key=lambda p: p.per_user)


def slo_per_user_floor(slo: dict) -> Optional[float]:
    """The SLO's boundary on the Pareto plot's x axis: a TPOT p99 of T seconds means a
    user reads at least 1/T output tok/s (TPOT is the time per output token), None
    without a TPOT SLO."""
    t = slo.get("tpot_p99")
    return 1.0 / t if t else None


# ---------------------------------------------------------------------- exports
def vllm_serve_command(server: dict) -> str:
    """The recommendation as one ``vllm serve`` line (the app's own argv builder)."""
    cfg = ServerConfig(**server)
    return "vllm serve " + shlex.join([cfg.model, *cfg.option_argv(include_port=False)])


def vllm_config_yaml(server: dict) -> str:
    """The recommendation as vLLM's ``--config`` YAML (option names as vLLM reads them)."""
    return yaml.safe_dump(ServerConfig(**server).to_vllm_config(), sort_keys=False)


def save_as_profile(name: str, server: dict, base: Optional[Profile] = None, engine: str = "vllm",
                    library: Optional[ProfileLibrary] = None) -> str:
    """Write the recommendation as a user profile named ``name``: ``base``'s engine, rig and
    ramp (the starting profile) with the recommended server options. Returns its path."""
    cfg = ServerConfig(**server)
    data: dict = base.model_dump() if base is not None else {}
    data.update(name=name, server=cfg.to_vllm_config())
    data.setdefault("engine", engine)
    return str((library or ProfileLibrary()).save(Profile.model_validate(data)))
