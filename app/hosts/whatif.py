"""The rig what-if: the same cards in one host or spread over several (issue 21, item 3).

``vllm-dyno plan --model M --gpu "RTX 4090" --nodes 1,4,8 --cards-per-node 1 --link
ib-hdr200`` plans, for each node count N, the rig of N hosts × C cards and — for N > 1 —
the same N·C cards in one host, each in the layouts vLLM's multi-node advice gives
(docs.vllm.ai "Distributed Inference and Serving": TP = the cards of a node, PP = the
nodes; data parallel replicas where the model fits a node):

- one replica: ``tensor_parallel_size`` C (within each host), ``pipeline_parallel_size``
  N (across the hosts);
- data parallel replicas: the smallest TP t dividing C that fits the model on t cards
  (the plan's checks: no error), ``data_parallel_size`` N·C/t — each replica within a
  host, so nothing crosses the network per step.

Both are layouts the multi-node launch plan accepts (:func:`app.hosts.plan.mp_plan`:
world divisible by the hosts, TP ≤ cards per host; DP replicas a multiple of the hosts).
Each row is :func:`app.planner.plan.plan` with the rig (:class:`app.engine.gpu.RigLayout`):
the predicted users at the SLO (the capacity search on the step-level engine), their
output tokens/s and TPOT p99, and the inter-host link's share of a decode step at those
users (:attr:`app.planner.plan.Plan.link_share`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from app.config import ServerConfig
from app.loadgen.capacity import slo_text
from app.loadgen.spec import SLO
from app.planner.gpus import GpuSpec, LinkSpec, RigLayout
from app.planner.models import ModelArch
from app.planner.plan import Plan, Workload, check, plan

#: the SLO a rig what-if judges users at when none is given: the first token within 2 s
#: and at least 10 tokens/s per user (TPOT p99 ≤ 0.1 s)
DEFAULT_RIG_SLO = SLO(ttft_p99=2.0, tpot_p99=0.1)


class RigWhatIfError(ValueError):
    """Options a rig what-if cannot compare; the message names the option and the fix."""


@dataclass
class RigRow:
    """One layout of one rig: ``rig`` (hosts × cards, link), ``layout`` (vLLM's parallel
    sizes), ``plan`` (its plan with the prediction)."""

    rig: RigLayout
    layout: dict[str, int]
    plan: Plan

    @property
    def rig_text(self) -> str:
        return self.rig.describe()

    @property
    def layout_text(self) -> str:
        tp, pp, dp = (self.layout[k] for k in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"))
        return f"TP {tp} × PP {pp} × DP {dp}"

    @property
    def problem(self) -> str | None:
        """The first error of the plan (the layout does not run), else None."""
        return self.plan.problem if self.plan.verdict == "error" else None

    @property
    def _capacity(self):
        """The predicted capacity, None where the layout does not run."""
        return None if self.problem else self.plan.capacity

    @property
    def users(self) -> float | None:
        return self._capacity.users if self._capacity is not None else None

    @property
    def output_tps(self) -> float | None:
        return self._capacity.output_tps if self._capacity is not None else None

    @property
    def tpot_p99_s(self) -> float | None:
        return self._capacity.tpot_p99 if self._capacity is not None else None

    @property
    def link_share(self) -> float | None:
        return None if self.problem else self.plan.link_share

    def as_dict(self) -> dict[str, Any]:
        return {"hosts": self.rig.hosts, "cards_per_host": self.rig.cards_per_host,
                "link": self.rig.link.name if self.rig.link is not None and self.rig.hosts > 1 else None,
                **self.layout, "users": self.users, "output_tps": self.output_tps, "tpot_p99_s": self.tpot_p99_s,
                "link_share": self.link_share, "problem": self.problem,
                "limited_by": self._capacity.limited_by if self._capacity is not None else None}


def _layout(tp: int, pp: int, dp: int) -> dict[str, int]:
    return {"tensor_parallel_size": tp, "pipeline_parallel_size": pp, "data_parallel_size": dp}


def rig_layouts(hosts: int, cards_per_host: int, fits: Any) -> list[dict[str, int]]:
    """The layouts compared on ``hosts`` × ``cards_per_host`` (module docstring):
    TP within a host × PP across the hosts, then data parallel replicas of the smallest
    TP ``t`` dividing the host's cards for which ``fits(t)`` (the model fits t cards)."""
    out = [_layout(cards_per_host, hosts, 1)]
    for t in (d for d in range(1, cards_per_host + 1) if cards_per_host % d == 0):
        if fits(t):
            dp = hosts * cards_per_host // t
            if dp > 1 and _layout(t, 1, dp) not in out:
                out.append(_layout(t, 1, dp))
            break
    return out


def compare_rigs(config: ServerConfig, gpu: GpuSpec, model: ModelArch, nodes: list[int], cards_per_node: int,
                 link: LinkSpec | None, workload: Workload, *, vllm_version: str | None = None,
                 use_calibration: bool = True) -> list[RigRow]:
    """Rows for every rig of ``nodes`` hosts × ``cards_per_node`` cards of ``gpu`` joined
    by ``link``, each N > 1 followed by one host with the same N·C cards; ``config``
    gives every other option (its parallel sizes are the what-if's). ``workload``'s SLO
    (else :data:`DEFAULT_RIG_SLO`) judges the users. Raises :class:`RigWhatIfError` for
    options that cannot be compared."""
    if not nodes or any(n < 1 for n in nodes):
        raise RigWhatIfError(f"--nodes {nodes}: give host counts ≥ 1, e.g. --nodes 1,4,8")
    if cards_per_node < 1:
        raise RigWhatIfError(f"--cards-per-node {cards_per_node}: give at least 1")
    if link is None and any(n > 1 for n in nodes):
        raise RigWhatIfError(f"--nodes {','.join(map(str, nodes))} needs --link NAME: the link between the hosts "
                             "(10gbe, 25gbe, 100gbe, ib-hdr200, ib-ndr400)")
    if workload.slo is None or workload.slo.is_empty():
        workload = replace(workload, slo=DEFAULT_RIG_SLO)
    rigs: list[RigLayout] = []
    for n in nodes:
        for r in (RigLayout(n, cards_per_node, link if n > 1 else None),
                  RigLayout(1, n * cards_per_node, None)):
            if r not in rigs and (r.hosts > 1 or r.cards_per_host != cards_per_node or n == 1):
                rigs.append(r)
    base = config.model_copy(update={"tensor_parallel_size": None, "pipeline_parallel_size": None,
                                     "data_parallel_size": None})
    fit_cache: dict[int, bool] = {}

    def fits(t: int) -> bool:
        if t not in fit_cache:
            q = check(base.model_copy(update={"tensor_parallel_size": t}), [gpu] * t, model, workload,
                      vllm_version)
            fit_cache[t] = q.verdict != "error"
        return fit_cache[t]

    rows = []
    for r in rigs:
        cards = [gpu] * (r.hosts * r.cards_per_host)
        for lay in rig_layouts(r.hosts, r.cards_per_host, fits):
            cfg = base.model_copy(update=lay)
            p = plan(cfg, cards, model, workload, vllm_version=vllm_version, use_calibration=use_calibration,
                     rig=r if r.multi_host else None)
            rows.append(RigRow(r, lay, p))
    return rows


def _f(x: float | None, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


def render_rigs(rows: list[RigRow], model: str, gpu: str, workload: Workload) -> str:
    """The rows as a table (``vllm-dyno plan --nodes``)."""
    slo = workload.slo if workload.slo is not None and not workload.slo.is_empty() else DEFAULT_RIG_SLO
    lines = [f"Rig what-if — {model} on {gpu} cards at {slo_text(slo.model_dump())}, "
             f"{workload.prompt_tokens} prompt + {workload.output_tokens} output tokens",
             "",
             f"  {'rig':<44} {'layout':<18} {'users':>6} {'out tok/s':>10} {'TPOT p99':>9} {'link':>6}  note"]
    for r in rows:
        tpot = None if r.tpot_p99_s is None else r.tpot_p99_s * 1000
        share = None if r.link_share is None else r.link_share * 100
        note = f"does not run: {r.problem}" if r.problem else (
            "; ".join(f.problem for f in r.plan.findings if f.verdict == "warn") or "")
        lines.append(f"  {r.rig_text:<44} {r.layout_text:<18} {_f(r.users, 'g'):>6} {_f(r.output_tps, ',.0f'):>10} "
                     f"{_f(tpot, '.1f') + ' ms':>9} {_f(share, '.1f') + '%':>6}  {note}".rstrip())
    lines += ["", "  users: the predicted users at the SLO (capacity search on the step-level engine); link: the "
              "inter-host link's share of a decode step at those users"]
    return "\n".join(lines)
