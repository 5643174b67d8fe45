"""``vllm-dyno plan`` (pre-launch plan) and ``vllm-dyno diagnose LOGFILE``."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from app.cli.common import (
    add_workload_options,
    cards_from_args,
    workload_kw,
    config_from_args,
    executable,
    input_file,
    link_name,
    non_negative,
    number_list,
    positive_int,
    positive_seconds,
    run_number,
    seconds,
    spec_acceptance,
    vllm_version,
)


def _counts(text: str) -> list[int]:
    """``--count 4`` or ``--count 4,8`` (a what-if's several counts) → [4] / [4, 8]."""
    out = []
    for part in text.split(","):
        try:
            n = int(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of cards, e.g. --count 4 "
                                             "(--count 4,8 with --from-run)") from None
        if n < 1:
            raise argparse.ArgumentTypeError(f"{n}: give at least one card, e.g. --count 4")
        out.append(n)
    return out


class _ListGpus(argparse.Action):
    """``--list-gpus``: print :func:`list_gpus` and exit while parsing (like ``--help``:
    no ``--model`` needed)."""

    def __init__(self, option_strings, dest, **kw) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(list_gpus())
        parser.exit(0)


def register(sub: argparse._SubParsersAction) -> None:
    # deferred: only this command needs it (vllm-dyno starts light)
    from app.config import add_server_options

    p = sub.add_parser("plan", help="will it fit, how many users, what breaks — before a launch")
    add_server_options(p, model_required=False)  # --from-run takes the model from the run
    p.add_argument("--gpu", action="append", default=[], metavar="NAME[:GIB[:CC]]",
                   help="card name (catalog or NVML name; --list-gpus shows the catalog); repeat once per card "
                        "for mixed cards; NAME:GIB:CC plans a card the catalog does not know from its memory "
                        "(GiB) and compute capability (e.g. 8.9); 'CPU' for the CPU build; "
                        "default: the cards NVML sees")
    p.add_argument("--list-gpus", action=_ListGpus,
                   help="list the GPU catalog (name, memory, compute capability, NVML names) and exit")
    p.add_argument("--count", type=_counts, action="extend",
                   help="number of cards of a single --gpu (default TP × PP); with --from-run one or more "
                        "counts to predict (--count 4,8 or --count 4 --count 8)")
    p.add_argument("--from-run", type=run_number, metavar="ID",
                   help="what-if: predict run ID's verdict (users at its SLO, output tok/s, scaling, cost per M "
                        "tokens) for the same model on other cards — each --gpu kind × each --count (default: the "
                        "run's own), from its calibration (vllm-dyno calibrate) or the sim's parameters")
    p.add_argument("--nodes", type=number_list(int, what="host counts", example="1,4,8"),
                   help="rig what-if: compare rigs of these many hosts (e.g. 1,4,8) × --cards-per-node cards of one "
                        "--gpu, joined by --link, each against the same cards in one host — per layout (TP within "
                        "a host, PP across hosts, DP replicas where the model fits a host) the predicted users at "
                        "the SLO, output tok/s, TPOT p99 and the link's share of the step; one --nodes N with "
                        "--tensor-parallel-size/--pipeline-parallel-size plans that layout on N hosts")
    p.add_argument("--cards-per-node", type=positive_int, metavar="C",
                   help="rig what-if: cards in each host (default 1)")
    p.add_argument("--link", type=link_name, metavar="NAME",
                   help="rig what-if: the link between the hosts: 10gbe, 25gbe, 100gbe, ib-hdr200, ib-ndr400 "
                        "(--list-gpus shows their bandwidth and latency)")
    p.add_argument("--busy-gib", type=non_negative, default=0.0, help="GiB other processes hold on each given card")
    p.add_argument("--levels", type=number_list(int, what="levels (concurrent users)", example="1,10,30"),
                   help="concurrency levels to predict, e.g. 1,10,30")
    add_workload_options(p, "plan")  # the workload's kinds, predicted as vllm-dyno ramp sends them (same seed)
    p.add_argument("--warmup-seconds", type=seconds, default=0.0,
                   help="warm-up of each predicted level, rig s (as vllm-dyno ramp; default 0)")
    p.add_argument("--step-seconds", type=positive_seconds, default=20.0,
                   help="length of each level of the predicted curve after its warm-up, rig s (default 20)")
    p.add_argument("--slo-ttft-p99", type=positive_seconds, metavar="S",
                   help="predict the users at this TTFT p99 bound (s): the capacity search of vllm-dyno ramp "
                        "--find-capacity run on the step-level engine")
    p.add_argument("--slo-tpot-p99", type=positive_seconds, metavar="S", help="… TPOT p99 bound (s/token)")
    p.add_argument("--slo-e2e-p99", type=positive_seconds, metavar="S", help="… end-to-end p99 bound (s)")
    p.add_argument("--vllm-version", type=vllm_version, help="plan for this vLLM version (default: the installed one, else the newest known)")
    p.add_argument("--python", type=executable, help="interpreter with vLLM (to read its version)")
    p.add_argument("--iommu", choices=("auto", "off", "translated", "passthrough"), default="auto",
                   help="the host's IOMMU, which can make P2P between PCIe cards hang; auto: read this machine's "
                        "(/sys/kernel/iommu_groups) when planning its own cards, else unknown")
    p.add_argument("--acs", choices=("on", "off"),
                   help="PCIe ACS on the host's bridges (root only can read it: sudo lspci -vvv | grep ACSCtl)")
    p.add_argument("--spec-acceptance", type=spec_acceptance, metavar="A",
                   help="with --speculative-config: predict with each draft token accepted at A given the one "
                        "before (0-1; vLLM's /metrics give accepted/draft tokens; default 0.7)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=cmd_plan)

    d = sub.add_parser("diagnose", help="explain a failed vLLM launch from its log, with the fix")
    d.add_argument("logfile", type=input_file, help="a saved vLLM log ('-' reads stdin)")
    d.add_argument("--silent-for", type=seconds, metavar="SECONDS",
                   help="how long vLLM printed nothing after the last line (NCCL hang after 300 s)")
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=cmd_diagnose)


def _cards(a: argparse.Namespace, world: int):
    """The cards to plan for (:func:`app.cli.common.cards_from_args`): the ``--gpu``
    names, a single name × ``--count`` (default TP × PP = ``world``), else the cards
    NVML sees on this machine."""
    return cards_from_args(a.gpu, a.count[0] if a.count else None, world, a.busy_gib)


def _host(a: argparse.Namespace):
    """The host's IOMMU/ACS for the plan: ``--iommu``/``--acs`` as given; with
    ``--iommu auto`` this machine's (:func:`app.planner.pcie.read_host_pcie`) when the
    cards are its own (no ``--gpu``), else unknown."""
    # deferred: only this command needs it (vllm-dyno starts light)
    from app.planner.pcie import HostPcie, read_host_pcie

    acs = None if a.acs is None else a.acs == "on"
    if a.iommu != "auto":
        return HostPcie(a.iommu, acs, "--iommu" + (" --acs" if acs is not None else ""))
    if a.gpu:
        return HostPcie(None, acs, "--acs") if acs is not None else None
    h = read_host_pcie()
    return HostPcie(h.iommu, acs, h.source + ("; ACS from --acs" if acs is not None else ""))


def list_gpus() -> str:
    """The GPU catalog as text: one card a line — catalog name, memory (GB as sold),
    compute capability, dense BF16 TFLOPS, memory bandwidth GB/s, the names NVML reports."""
    # deferred: only this command needs it (vllm-dyno starts light)
    from app.planner.gpus import load_catalog, load_links

    lines = [f"{'GPU':<40} {'memory':>7} {'CC':>5} {'TFLOPS':>7} {'GB/s':>6}  NVML names"]
    for g in load_catalog().values():
        lines.append(f"{g.name:<40} {g.memory_gb or g.memory_gib:>5g}GB {g.cc:>5.1f} {g.tflops_bf16:>7g} "
                     f"{g.bandwidth_gbs:>6g}  {'; '.join(g.nvml_names)}")
    lines.append("A card not listed plans from its memory and compute capability: --gpu NAME:GIB:CC")
    lines += ["", f"{'link (--link, hosts: link:)':<30} {'line Gb/s':>9} {'GB/s':>6} {'latency':>8}"]
    for k in load_links().values():
        lines.append(f"{k.name + ' — ' + k.title:<30} {k.line_gbps:>9g} {k.bandwidth_gbs:>6g} {k.latency_us:>5g} µs")
    return "\n".join(lines)


def workload_from_args(a: argparse.Namespace):
    """The :class:`~app.planner.plan.Workload` of the command line: the workload's options
    (:func:`app.cli.common.workload_kw`, ValueError naming the option) and the ramp's
    (levels, warm-up, step, SLO), their values checked by their argparse types."""
    # deferred: only this command needs it (vllm-dyno starts light)
    from app.loadgen.spec import SLO
    from app.loadgen.workload import Workload as Requests
    from app.planner.plan import Workload

    slo = SLO(ttft_p99=a.slo_ttft_p99, tpot_p99=a.slo_tpot_p99, e2e_p99=a.slo_e2e_p99)
    return Workload(Requests(**workload_kw(a, "plan")), tuple(a.levels) if a.levels else None, a.warmup_seconds,
                    a.step_seconds, None if slo.is_empty() else slo)


def cmd_what_if(a: argparse.Namespace) -> int:
    """``plan --from-run ID``: the what-if table (or JSON) of :func:`app.whatif.what_if`."""
    # deferred: only this command needs it (vllm-dyno starts light)
    from app.loadgen.spec import SLO
    from app.settings import load_settings
    from app.store import RunStore
    from app.whatif import WhatIfError, what_if

    slo = SLO(ttft_p99=a.slo_ttft_p99, tpot_p99=a.slo_tpot_p99, e2e_p99=a.slo_e2e_p99)  # checked by argparse
    targets = [(g, n) for g in (a.gpu or [None]) for n in (a.count or [None])]
    try:
        with RunStore() as store:
            wi = what_if(store, a.from_run, targets, load_settings().pricing, slo)
    except WhatIfError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(wi.as_dict(), indent=1, default=str) if a.json else wi.table())
    return 0


def _config_and_model(a: argparse.Namespace):
    """The server config of ``a`` and its model's architecture; the model None (its error
    printed) when the planner does not know it."""
    # deferred: only the plan commands need it (vllm-dyno starts light)
    from app.planner.models import ModelNotFoundError, resolve_model

    cfg = config_from_args(a)
    try:
        return cfg, resolve_model(cfg.model)
    except (ModelNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return cfg, None


def _rig_options_problem(a: argparse.Namespace) -> str | None:
    """Why the rig what-if's options (``--nodes``, ``--cards-per-node``, ``--link``)
    cannot go together with the rest (None: they can)."""
    if a.nodes is None:
        if a.cards_per_node is not None or a.link is not None:
            given = "--cards-per-node" if a.cards_per_node is not None else "--link"
            return f"{given} belongs to the rig what-if: add --nodes N[,N…] (e.g. --nodes 1,4,8)"
        return None
    if a.from_run is not None:
        return "--nodes is a rig what-if of the planner; --from-run is a run's: give one of them"
    if len(a.gpu) != 1:
        return "--nodes compares rigs of one card kind: give one --gpu NAME (e.g. --gpu \"RTX 4090\")"
    if a.count:
        return "--count with --nodes: the rig has --nodes × --cards-per-node cards; drop --count"
    if any(v is not None for v in (a.tensor_parallel_size, a.pipeline_parallel_size, a.data_parallel_size)) \
            and len(a.nodes) > 1:
        return ("--nodes with several counts compares its own layouts (TP within a host, PP across hosts, DP "
                "replicas): drop --tensor-parallel-size/--pipeline-parallel-size/--data-parallel-size, or give one "
                "--nodes N to plan that layout on N hosts")
    if a.link is None and any(n > 1 for n in a.nodes):
        return (f"--nodes {','.join(map(str, a.nodes))} needs --link NAME, the link between the hosts: 10gbe, 25gbe, "
                "100gbe, ib-hdr200 or ib-ndr400")
    return None


def cmd_rig_what_if(a: argparse.Namespace) -> int:
    """``plan --nodes …``: the rig what-if table (or JSON) of
    :func:`app.hosts.whatif.compare_rigs`."""
    # deferred: only this command needs it (vllm-dyno starts light)
    from app.hosts.whatif import RigWhatIfError, compare_rigs, render_rigs
    from app.planner.gpus import lookup_link
    from app.planner.versions import installed_version

    cfg, model = _config_and_model(a)
    if model is None:
        return 2
    gpu = _cards(a, 1)[0]
    try:
        wl = workload_from_args(a)
        rows = compare_rigs(cfg, gpu, model, a.nodes, a.cards_per_node or 1,
                            lookup_link(a.link) if a.link else None, wl,
                            vllm_version=a.vllm_version or installed_version(a.python))
    except (RigWhatIfError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps({"model": cfg.model, "gpu": gpu.name, "rows": [r.as_dict() for r in rows]}, indent=1,
                         default=str))
    else:
        print(render_rigs(rows, cfg.model, gpu.name, wl))
    return 0


def cmd_plan(a: argparse.Namespace) -> int:
    why = _rig_options_problem(a)
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    if a.nodes is not None and len(a.nodes) > 1 or a.nodes is not None and not any(
            v is not None for v in (a.tensor_parallel_size, a.pipeline_parallel_size, a.data_parallel_size)):
        return cmd_rig_what_if(a)
    if a.from_run is not None:
        return cmd_what_if(a)
    if not a.model:
        print("error: give --model (a local model, a Hugging Face id or a catalog id), or --from-run ID",
              file=sys.stderr)
        return 2
    if a.count and len(a.count) > 1:
        print(f"error: --count {','.join(map(str, a.count))}: several counts are a what-if's; add --from-run ID "
              "(or give one --count)", file=sys.stderr)
        return 2
    # deferred: only this command needs it (vllm-dyno starts light)
    from app.engines import Engine
    from app.planner.plan import plan_for
    from app.planner.render import render_plan
    from app.planner.versions import installed_version

    cfg, model = _config_and_model(a)
    if model is None:
        return 2
    rig = None
    if a.nodes is not None:  # one --nodes N with the layout given: that layout on N hosts × --cards-per-node
        # deferred: only this command needs it (vllm-dyno starts light)
        from app.planner.gpus import rig_layout

        n, c = a.nodes[0], a.cards_per_node or 1
        rig = rig_layout(n, c, a.link)
        if cfg.world_size != n * c:
            print(f"error: --nodes {n} × --cards-per-node {c} = {n * c} cards, but the layout uses "
                  f"{cfg.world_size} (TP × PP × DP): give sizes whose product is {n * c}, or the "
                  f"--nodes/--cards-per-node of the rig the layout fills", file=sys.stderr)
            return 2
        if n > 1 and (cfg.tensor_parallel_size or 1) <= c:
            # what vLLM's multi-node launch accepts (app.hosts.plan.mp_plan, one mechanism); a TP group across
            # hosts is the plan's warning (tp_spans_hosts), not refused here
            # deferred: only this command needs it (vllm-dyno starts light)
            from app.hosts.plan import PlanError, mp_plan
            from app.hosts.spec import Host

            try:
                mp_plan([Host(ssh=f"node{i}", gpus=c) for i in range(n)], cfg)
            except PlanError as e:
                print(f"error: --nodes {n}: {e}", file=sys.stderr)
                return 2
        a.count = [n * c]
    cards = _cards(a, cfg.world_size)
    try:
        wl = workload_from_args(a)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    version = a.vllm_version or installed_version(a.python)
    p = plan_for(Engine.VLLM, cfg, cards, model, wl, version, host=_host(a),
             spec_acceptance=getattr(a, "spec_acceptance", None), rig=rig if rig is not None and rig.multi_host else None)
    if a.json:
        print(json.dumps(p.as_dict(), indent=1, default=str))
    else:
        print(render_plan(p))
    return 1 if p.verdict == "error" else 0


def cmd_diagnose(a: argparse.Namespace) -> int:
    # deferred: only this command needs it (vllm-dyno starts light)
    from app.planner.diagnose import diagnose

    if a.logfile == "-":
        text = sys.stdin.read()
    else:
        text = Path(a.logfile).read_text(errors="replace")
    d = diagnose(text.splitlines(), a.silent_for)
    if d is None:
        msg = "no known problem in this log"
        if a.silent_for is None:
            msg += " (if vLLM stopped printing, pass --silent-for SECONDS)"
        print(json.dumps(None) if a.json else msg)
        return 1
    if a.json:
        print(json.dumps({"problem": d.problem, "explanation": d.explanation, "fix": d.fix, "evidence": d.evidence,
                          "after_ready": d.after_ready}))
    else:
        print(d.summary())
        print("evidence:")
        for l in d.evidence:
            print(f"  {l}")
    return 0
