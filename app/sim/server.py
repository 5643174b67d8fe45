"""The simulated rig's server process: ``python -m app.sim.server --model M [vLLM options]
--sim-gpu NAME --sim-gpu-count N --sim-time-scale K --sim-seed S [--sim-cooling C]
[--sim-ambient-c °C] [--sim-perturb SEED] [--sim-hosts H --sim-link NAME]``.

The rig's options are declared once, on :class:`app.profiles.model.SimRig` (every front
end's ``--sim-…`` options, a profile's ``sim:`` block and the form are generated from
it, and it writes this server's argv); ``--sim-cooling C`` and ``--sim-ambient-c T`` set
how hot the cards run (app/sim/gpus.py): ``--sim-cooling 2 --sim-ambient-c 45`` brings a
loaded card to its slowdown temperature within a minute of rig time.

``--sim-hosts H --sim-link NAME``: the cards sit in H hosts (N ÷ H each, ranks in
order) joined by a link of the link catalog; the step times send what crosses hosts
over it as the planner's model does (app/engine/steptime.py, "Rigs of several hosts").

Started by the Supervisor as engine ``sim`` (app/server/launch.py). It behaves like
``vllm serve``: prints vLLM-format startup lines after a load delay (rig seconds ÷ k),
then serves vLLM's HTTP surface (app/sim/http_api.py) from a continuous-batching
engine in rig time (app/sim/engine.py). Configurations that vLLM refuses exit with
code 1 after vLLM's own error text. SIGTERM/SIGINT stop it cleanly (exit 0).
``--sim-engine-dies-at-request N``: the engine dies on the N-th generation request after
ready, with vLLM 0.32's lines (:func:`engine_death_lines`); the server then exits with
code 0 as vLLM's does (``terminate_if_errored``), or stays up answering ``/health`` 503
with ``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1``.

``--sim-perturb SEED``: the rig steps with hidden "true" parameters, the planner's ×
seeded factors (:func:`app.sim.perturb.true_params`); ``/sim/info`` then says
``perturbed: true`` and the seed, and shows no parameters (``perf``).

``--sim-truth FILE|JSON``: the rig steps as a truth says its cards differ from the model,
by configuration and step (app.profiles.truth, docs/sim-truth.md; a profile's launch
passes its inline ``truth:`` as JSON); ``/sim/info`` then says ``truth: true`` only —
no name, rules, parameters (``perf``) — and the KV cache is the truth's share of the plan's.

``--speculative-config '{…}'``: each decoding step verifies ``num_speculative_tokens``
drafts and emits 1 + accepted tokens in one chunk, each draft position accepted with
probability ``--sim-spec-acceptance A`` given the one before (position i: A^i;
app/engine/specdecode.py); the step time counts the verification and the draft's
passes as the planner does; ``/metrics`` has vLLM's ``vllm:spec_decode_*`` counters and
``/sim/info`` a ``speculative`` object.

``--data-parallel-size D``: D engines (replicas), each with its own scheduler and the
plan's KV blocks, on its own TP × PP cards of the rig (replica r on cards r·TP·PP …),
behind the one HTTP API, which routes requests as vLLM's load balancer does
(:class:`app.engine.balance.DpBalancer`). More ranks than ``--sim-gpu-count`` cards:
vLLM 0.32's refusal (:func:`app.sim.model_adapter.plan_rig`).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import resource
import signal
import sys
import time

from aiohttp import web

from app.config import add_server_options, config_from_namespace
from app.engine.admission import AdmissionLimits
from app.engine.balance import DpBalancer
from app.engine.specdecode import DEFAULT_ACCEPTANCE, check_acceptance
from app.engines import Engine
from app.planner.calibrate import hardware_fingerprint, load_calibration
from app.planner.gpus import DEFAULT_AMBIENT_C
from app.sim import model_adapter as ma
from app.sim import vlog
from app.sim.engine import SimEngine
from app.sim.gpus import GpuBank, ambient_c, cooling_factor
from app.sim.http_api import ApiServer
from app.sim.metrics import SimMetrics
from app.sim.perturb import true_params
from app.profiles.truth import Truth, TruthError, truth_argument

VLLM_VERSION = "0.32.0"


def build_parser() -> argparse.ArgumentParser:
    """The sim's command line: ``--model``, every vLLM option of ServerConfig (generated
    from its metadata, default None = vLLM's default) and the ``--sim-*`` rig options."""

    p = argparse.ArgumentParser(prog="app.sim.server", description="Simulated vLLM server on a virtual GPU rig")
    add_server_options(p, internal=False)
    p.add_argument("--sim-gpu", default="RTX 4090", help="GPU catalog name")
    p.add_argument("--sim-gpu-count", type=int, default=1)
    p.add_argument("--sim-hosts", type=int, default=1, help="the cards sit in this many hosts (evenly)")
    p.add_argument("--sim-link", help="the link between the hosts (link catalog name, e.g. ib-hdr200)")
    p.add_argument("--sim-time-scale", type=float, default=1.0, help="rig runs k× faster than the wall clock")
    p.add_argument("--sim-seed", type=int, default=0)
    p.add_argument("--sim-cooling", help="open, blower4, chassis8, poor or a factor (1 = 80 °C at TDP; default "
                                         "blower4 up to 4 cards, chassis8 above)")
    p.add_argument("--sim-ambient-c", type=float, default=DEFAULT_AMBIENT_C, help="the room's temperature, °C")
    p.add_argument("--sim-eta-mem", type=float, help="override the memory-bandwidth efficiency η_mem")
    p.add_argument("--sim-eta-c", type=float, help="override the compute efficiency η_c")
    p.add_argument("--sim-t-cpu", type=float, help="override the per-step CPU time, seconds")
    p.add_argument("--sim-engine-dies-at-request", type=int, metavar="N",
                   help="the engine dies on the N-th generation request (a CUDA error in the forward pass), "
                        "as vLLM's does: to try the diagnosis of a death after ready")
    p.add_argument("--sim-perturb", type=int, default=0, metavar="SEED",
                   help="a hidden 'true rig': step-time parameters × seeded factors in 0.6–1.6 (0: none), not "
                        "shown in /sim/info — a test bed for tuning")
    p.add_argument("--sim-truth", metavar="FILE|JSON",
                   help="a hidden 'true rig': how its cards differ from the model by configuration and step, a "
                        "YAML file or its mapping as JSON (docs/sim-truth.md); not shown in /sim/info")
    p.add_argument("--sim-spec-acceptance", type=float, default=DEFAULT_ACCEPTANCE, metavar="A",
                   help="with --speculative-config: the chance each draft token is accepted given the one before "
                        f"(0-1; position i is accepted with A^i, app/engine/specdecode.py; default {DEFAULT_ACCEPTANCE})")
    p.add_argument("--sim-reasoning-tokens", type=int, default=0, metavar="N",
                   help="chat completions stream their first N tokens as reasoning (delta.reasoning, as vLLM 0.32 "
                        "with a reasoning parser), then the answer (delta.content); 0: none")
    p.add_argument("--sim-calibrated", action="store_true",
                   help="use the step-time parameters calibrated on a real run of these cards "
                        "(vllm-dyno calibrate RUN_ID), when there are any")
    return p


def _fail(text: str, where: str, process: str, wrapped: bool, core: str = "EngineCore_DP0") -> int:
    vlog.emit(text, "ERROR", process, where)
    if wrapped:
        if process.startswith("Worker"):  # vllm/v1/executor/multiproc_executor.py (0.32.0)
            vlog.emit("WorkerProc failed to start.", "ERROR", process, "multiproc_executor.py:953")
        vlog.emit("EngineCore failed to start.", "ERROR", core, "core.py:708")
        failed = "{}" if core == "EngineCore_DP0" else f"{{'{core}': 1}}"
        vlog.emit(f"RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): "
                  f"{failed}", "ERROR", "APIServer", "api_server.py:1")
    return 1


def non_default_args(a: argparse.Namespace, parser: argparse.ArgumentParser) -> dict:
    out = {}
    for k, v in vars(a).items():
        if k.startswith("sim_"):
            continue
        if v != parser.get_default(k):
            out[k] = v
    return out


def config_from_args(a: argparse.Namespace):
    """The parsed vLLM options as a ServerConfig (what the planner plans): every option
    of :func:`build_parser`, none dropped. Raises ``pydantic.ValidationError``."""

    return config_from_namespace(a)


def engine_death_lines() -> list[tuple[str, str, str, str]]:
    """vLLM 0.32's log of an engine that dies in a forward pass, as ``(message, level,
    process, where)``: the engine's ``EngineCore encountered a fatal error.`` and its
    traceback (vllm/v1/engine/core.py:1512, every line with the logger's prefix), torch's
    CUDA error text (c10/cuda/CUDAException.cpp), the API server's failed output handler
    with the ``EngineDeadError`` (vllm/v1/engine/async_llm.py:906) and the client's monitor
    (vllm/v1/engine/core_client.py:816)."""
    core = [
        "EngineCore encountered a fatal error.",
        "Traceback (most recent call last):",
        '  File "/opt/vllm/vllm/v1/engine/core.py", line 1496, in run_engine_core',
        "    engine_core.run_busy_loop()",
        '  File "/opt/vllm/vllm/v1/engine/core.py", line 668, in step',
        "    future = self.model_executor.execute_model(scheduler_output, non_block=True)",
        '  File "/opt/vllm/vllm/v1/worker/gpu_model_runner.py", line 4142, in execute_model',
        "    model_output = self.model(",
        "RuntimeError: CUDA error: an illegal memory access was encountered",
        "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
        "might be incorrect.",
        "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
    ]
    api = [
        "AsyncLLM output_handler failed.",
        "Traceback (most recent call last):",
        '  File "/opt/vllm/vllm/v1/engine/async_llm.py", line 849, in output_handler',
        "    outputs = await engine_core.get_output_async()",
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for "
        "the root cause.",
    ]
    return ([(m, "ERROR", "EngineCore_DP0", "core.py:1512") for m in core]
            + [(m, "ERROR", "APIServer", "async_llm.py:906") for m in api]
            + [("[shutdown] MPClient: engine core exited unexpectedly; starting cleanup", "WARNING", "APIServer",
                "core_client.py:816")])


def set_ulimit(target_soft_limit: int = 65535) -> None:
    """Raise the soft limit of open files as vLLM does before it loads the model, with
    its warning when the hard limit is lower (vllm/utils/system_utils.py ``set_ulimit``,
    called by vllm/entrypoints/launchers/launcher.py ``setup_server``, 0.32): the warning
    is harmless, and a server's log carries it on many machines."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < target_soft_limit:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target_soft_limit, hard))
        except ValueError as e:
            vlog.emit(f"Found ulimit of {soft} and failed to automatically increase with error {e}. This can cause "
                      "fd limit errors like `OSError: [Errno 24] Too many open files`. Consider increasing with "
                      "ulimit -n", "WARNING", where="system_utils.py:256")


def _engine_intro(a: argparse.Namespace, k: float) -> None:
    vlog.emit(f"Initializing a V1 LLM engine (v{VLLM_VERSION}) with config: model='{a.model}', "
              f"tensor_parallel_size={a.tensor_parallel_size or 1}, "
              f"pipeline_parallel_size={a.pipeline_parallel_size or 1}, "
              f"data_parallel_size={a.data_parallel_size or 1}, "
              f"quantization={a.quantization}, max_seq_len={a.max_model_len}, sim_gpu='{a.sim_gpu}' "
              f"x{a.sim_gpu_count}, sim_time_scale={k}", process="EngineCore_DP0", where="core.py:74")


def _load_start(a: argparse.Namespace) -> None:
    """vLLM's line as the workers begin to load the weights (v1/worker/gpu_model_runner.py)."""
    vlog.emit(f"Starting to load model {a.model}...", process="EngineCore_DP0", where="gpu_model_runner.py:1")


def main(argv: list[str] | None = None) -> int:
    """Run the sim server until SIGTERM/SIGINT; returns the exit code (1 = refused config)."""
    parser = build_parser()
    a, unknown = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    k = a.sim_time_scale
    if k <= 0:
        print(f"error: --sim-time-scale {k}: must be > 0 (1 = real time, 20 = 20× faster)", file=sys.stderr)
        return 2
    if a.sim_perturb < 0:
        print(f"error: --sim-perturb {a.sim_perturb}: give a seed ≥ 1 (0: no perturbation)", file=sys.stderr)
        return 2
    try:
        check_acceptance(a.sim_spec_acceptance)
        truth = truth_argument(a.sim_truth) if a.sim_truth else None
    except TruthError as e:
        print(f"error: --sim-truth {e}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    vlog.emit(f"vLLM API server version {VLLM_VERSION} (vllm-dyno sim)", where="api_server.py:1896")
    vlog.emit(f"non-default args: {non_default_args(a, parser)}", where="utils.py:328")
    set_ulimit()
    if unknown:
        vlog.emit(f"sim: ignoring options it does not simulate: {' '.join(unknown)}", "WARNING",
                  where="arg_utils.py:1")
    try:
        cooling = cooling_factor(a.sim_cooling, a.sim_gpu_count)
        ambient_c(a.sim_ambient_c)
        if a.sim_gpu_count < 1:
            raise ValueError(f"--sim-gpu-count {a.sim_gpu_count}: the rig needs at least 1 GPU")
        cfg = config_from_args(a)
        plan = ma.plan_rig(cfg, a.sim_gpu, a.sim_gpu_count, a.sim_hosts, a.sim_link)
    except ma.Refusal as r:
        if r.process == "APIServer" or r.core != "EngineCore_DP0":  # before any weights are loaded
            return _fail(r.text, r.where, r.process, r.wrapped, r.core)
        _engine_intro(a, k)
        if r.after_load:  # memory refusals come after the weights are loaded and the profile run
            _load_start(a)
            time.sleep(min(r.load_s / k, 30.0))
            vlog.emit(f"Model loading took {r.weights_gib:.4f} GiB and {r.load_s:.6f} seconds",
                      process="EngineCore_DP0", where="gpu_model_runner.py:2")
            if r.available_kv_gib is not None:
                vlog.emit(f"Available KV cache memory: {r.available_kv_gib:.2f} GiB", process="EngineCore_DP0",
                          where="gpu_worker.py:298")
        return _fail(r.text, r.where, r.process, r.wrapped)
    except (KeyError, LookupError, ValueError) as e:
        msg = e.args[0] if e.args else str(e)
        vlog.emit(f"ValueError: {msg}", "ERROR", where="arg_utils.py:1")
        return 1
    _engine_intro(a, k)
    cores = [f"EngineCore_DP{r}" for r in range(plan.dp)]  # the replicas start together
    # ---- load: rig seconds scaled by k
    if plan.tp * plan.pp > 1:
        vlog.emit("vLLM is using nccl==2.27.3", process="Worker_TP0", where="pynccl.py:70")
    _load_start(a)
    time.sleep(plan.load_s / k)
    for core in cores:
        vlog.emit(f"Model loading took {plan.weights_bytes / ma.GIB:.4f} GiB and {plan.load_s:.6f} seconds",
                  process=core, where="gpu_model_runner.py:2")
    profile_s = 2.0 + 0.5 * plan.tp
    time.sleep(profile_s / k)
    for core in cores:
        vlog.emit(f"Available KV cache memory: {plan.kv_bytes / ma.GIB:.2f} GiB", process=core,
                  where="gpu_worker.py:298")
        vlog.emit(f"GPU KV cache size: {plan.kv_tokens:,} tokens, Maximum concurrency for {plan.max_model_len:,} "
                  f"tokens per request: {plan.max_concurrency:.2f}x", process=core, where="kv_cache_utils.py:1")
    graphs_s = 0.0
    if not a.enforce_eager:
        graphs_s = 8.0
        vlog.emit("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)", process="EngineCore_DP0",
                  where="gpu_model_runner.py:4")
        time.sleep(graphs_s / k)
        for core in cores:
            vlog.emit(f"Graph capturing finished in {graphs_s:.0f} secs, took "
                      f"{plan.cuda_graph_bytes / ma.GIB:.2f} GiB", process=core, where="gpu_model_runner.py:3")
    for core in cores:
        vlog.emit(f"init engine (profile, create kv cache, warmup model) took {profile_s + graphs_s:.2f} seconds",
                  process=core, where="core.py:210")
    try:
        return asyncio.run(_serve(a, plan, cooling, truth))
    except KeyboardInterrupt:
        return 0


async def _serve(a: argparse.Namespace, plan: ma.SimPlan, cooling: float, truth: Truth | None = None) -> int:
    k = a.sim_time_scale
    served = (a.served_model_name or [a.model])[0]
    host, port = a.host or "127.0.0.1", a.port or 8000
    calibrated = None
    if a.sim_calibrated:
        fp = hardware_fingerprint(plan.plan.cards, plan.plan.rig)
        calibrated = load_calibration(fp)
        msg = (f"calibrated parameters for {fp}: {calibrated.source}" if calibrated
               else f"no calibration saved for {fp}; using the defaults")
        vlog.emit("sim: " + msg, "INFO", "EngineCore_DP0", "sim.py:1")
    steps = ma.StepModel(plan, a.sim_eta_mem, a.sim_eta_c, a.sim_t_cpu, params=calibrated)
    if a.sim_perturb:  # the hidden true rig: never logged nor shown
        steps.model = steps.model.with_params(true_params(steps.params, a.sim_perturb))
    num_blocks = plan.num_blocks
    if truth is not None:  # the hidden truth: never logged nor shown
        rig = truth.for_plan(plan.plan)
        steps.model = rig.model(steps.model)
        num_blocks = max(1, int(plan.num_blocks * rig.kv_tokens_scale))
    gpus = GpuBank(plan, a.sim_gpu_count, cooling, a.sim_seed, a.sim_ambient_c)
    gpus.loaded = True
    spec_k = plan.plan.config.num_speculative_tokens
    kv_tokens, kv_conc = plan.capacity(num_blocks)
    metrics = SimMetrics(served, num_blocks, plan.utilization, plan.dp, a.kv_cache_dtype or "auto", spec_k,
                         block_size=plan.block_size, kv_cache_size_tokens=kv_tokens, kv_cache_max_concurrency=kv_conc)
    balancer = DpBalancer(plan.dp)
    t0 = time.monotonic()
    engines = [SimEngine(num_blocks, plan.max_num_seqs, plan.max_num_batched_tokens, steps.engine_step_time, gpus,
                         metrics, k, a.sim_seed, request_overhead_s=steps.params.t_request_s, index=r, t0=t0,
                         on_done=balancer.finished, spec_tokens=spec_k, spec_acceptance=a.sim_spec_acceptance,
                         # vLLM V1 caches prefixes unless told not to (vllm/config/cache.py, 0.32.0)
                         enable_prefix_caching=a.enable_prefix_caching is not False,
                         # vLLM's batch queue: pipeline_parallel_size batches in flight (vllm/config/vllm.py:577)
                         max_concurrent_batches=plan.pp, kv_layout=plan.kv_layout,
                         max_num_active_seqs=plan.plan.config.max_num_active_seqs) for r in range(plan.dp)]
    info = {"engine": Engine.SIM.value, "vllm_version": VLLM_VERSION, "gpu": plan.card.name,
            "gpu_count": a.sim_gpu_count, "seed": a.sim_seed, "cooling": cooling, "ambient_c": a.sim_ambient_c, "model": a.model,
            "served_model_name": served,
            "tensor_parallel_size": plan.tp, "pipeline_parallel_size": plan.pp, "data_parallel_size": plan.dp,
            "max_num_seqs": plan.max_num_seqs, "max_num_batched_tokens": plan.max_num_batched_tokens,
            "max_num_active_seqs": plan.plan.config.max_num_active_seqs,
            "max_num_queued_reqs": plan.plan.config.max_num_queued_reqs,
            "max_num_queued_tokens": plan.plan.config.max_num_queued_tokens,
            "max_model_len": plan.max_model_len, "num_gpu_blocks": num_blocks, "kv_cache_tokens": kv_tokens,
            "kv_bytes_per_token_per_gpu": plan.kv_bytes_per_token, "weights_gib_per_gpu": plan.weights_bytes / ma.GIB,
            "enable_prefix_caching": a.enable_prefix_caching is not False,
            "hosts": a.sim_hosts, "link": plan.plan.rig.link.name if plan.plan.rig and plan.plan.rig.link else None,
            "perturbed": bool(a.sim_perturb), "truth": truth is not None}
    if spec_k:
        info["speculative"] = {"method": plan.plan.config.speculative_method, "num_speculative_tokens": spec_k,
                               "acceptance": a.sim_spec_acceptance}
    if a.sim_perturb:
        info["perturb_seed"] = a.sim_perturb
    elif truth is None:
        info["perf"] = steps.params.as_dict()
    cfg = plan.plan.config
    api = ApiServer(engines, served, a.model, plan.max_model_len, info, os.environ.get("VLLM_API_KEY"),
                    die_at_request=a.sim_engine_dies_at_request, balancer=balancer,
                    reasoning_tokens=max(0, a.sim_reasoning_tokens),
                    admission=AdmissionLimits(cfg.max_num_queued_reqs, cfg.max_num_queued_tokens))
    # shutdown_timeout: how long the HTTP server waits for handlers still running once it
    # stops; api.shutdown() ends every request in flight and refuses later ones, so this is a
    # bound, not a wait (aiohttp's default, 60 s, outlasts the reaper's grace)
    runner = web.AppRunner(api.app(), access_log=None, handle_signals=False, shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    try:
        await site.start()
    except OSError as e:
        vlog.emit(f"OSError: [Errno {e.errno}] error while attempting to bind on address ('{host}', {port}): "
                  f"{e.strerror} (Address already in use)" if e.errno == 98 else f"OSError: {e}", "ERROR")
        await runner.cleanup()
        return 1
    tasks = [asyncio.create_task(e.run()) for e in engines]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    keep_alive = os.environ.get("VLLM_KEEP_ALIVE_ON_ENGINE_DEATH", "0") not in ("", "0")

    def on_engine_death() -> None:
        for line in engine_death_lines():
            vlog.emit(*line)
        if not keep_alive:  # the API server exits once the failed requests are answered (launcher.py)
            loop.call_later(0.5, stop.set)

    api.on_engine_death = on_engine_death
    if plan.dp > 1:  # vllm/entrypoints/cli/serve.py (0.32.0): one API server per replica by default
        vlog.emit(f"Defaulting api_server_count to data_parallel_size ({plan.dp}).", where="serve.py:128")
    vlog.emit(f"Starting vLLM API server 0 on http://{host}:{port}", where="launcher.py:44")
    vlog.emit("Started server process [%d]" % os.getpid(), where="server.py:1")
    vlog.emit("Application startup complete.", where="on.py:62")
    await stop.wait()
    vlog.emit("Shutting down FastAPI HTTP server.", where="launcher.py:99")
    api.shutdown()
    for task in tasks:
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
    await runner.shutdown()
    await runner.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
