"""Diagnosis of a vLLM log: which problem, why, the fix as option values, and the lines
that show it.

A catalog of patterns (source: docs/vllm-facts.md "Failures to recognise") maps log
lines to the planner's problem codes (app.planner.checks); a line takes the most
specific (lowest rank) rule it matches. Wrapper errors (``Engine core initialization
failed``, ``EngineDeadError``) only count when no root cause is found earlier in the
log. A server silent for ``silent_for_s`` ≥ 300 s after ``vLLM is using nccl`` is an
NCCL hang. Fixes read the numbers vLLM printed (and the ``non-default args`` line for
the options in force).

vLLM's configuration classes (``ModelConfig``, ``VllmConfig``, ``CacheConfig``, …) are
pydantic dataclasses since 0.10: a refusal arrives as pydantic's ``ValidationError``
(``1 validation error for ModelConfig`` / ``  Value error, <vLLM's message> [type=…]``).
The rules match vLLM's message inside it. A config refusal no specific rule knows is named
by its phrasing (:data:`CONFIG_KINDS`: ``config_not_divisible``, ``config_conflict``,
``config_out_of_range``, ``config_requires``, ``config_not_supported``,
``config_invalid_value``) with the class, the options it names and vLLM's words, and the
value as the fix where the message gives it ("max_cpu_loras (2) must be >= max_loras (4)"
→ --max-cpu-loras 4); pydantic's own field errors, which have no such phrase, stay
``invalid_config`` with vLLM's own words as the cause.

The engine can also die after the server said ready (the first request kills it:
``EngineCore encountered a fatal error.``, then ``EngineDeadError``): the diagnosis then
says so (``after_ready``), takes its cause from the lines after ``Application startup
complete.`` and, when no rule knows it, the first exception line of the engine's
traceback (``engine_runtime_error``).

A server whose process was ended by a signal (the reaper reports it: ``killed_by``) is
``server_killed``: SIGKILL is what the kernel's out-of-memory killer sends, so the
kernel's log is searched for its record of one of the server's processes
(:func:`oom_records`); when that log cannot be read, the diagnosis says so and where to
look. A line that only warns (vLLM's ulimit warning quotes ``OSError: [Errno 24]``) is
never taken for the cause.

An out-of-memory error is read by the launch phase the log had reached (loading weights,
profiling, KV allocation, CUDA graph capture, serving: app.server.logparse.LAUNCH_PHASES)
and sized from torch's figures (the allocation, the free and total memory, other
processes) and vLLM's; memory that other processes took during the launch — torch's
"Process P has M", workers of one model that found different KV memory, the profiling
assertion of vLLM #56830 — is ``concurrent_launch``, which no option fixes. Environment
and I/O kinds: ``trust_remote_code_needed``, ``tokenizer_load_failed``, ``disk_full``,
``permission_denied``, ``no_c_compiler``, ``gguf_model``. The raise sites of vLLM 0.32.0
each rule covers: docs/vllm-raise-sites.md (scripts/vllm_raise_sites.py).
"""
from __future__ import annotations

import ast
import errno
import math
import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from pydantic import ValidationError

from app.config import VLLM_OPTIONS, ServerConfig
from app.helper_process import signal_name
from app.planner.checks import CLEANUP_HINT, cpu_kv_space_want, floor2
from app.planner.gpus import GpuSpec, cpu_device, unknown_gpu
from app.planner.memory import CPU_DEFAULT_KV_GIB
from app.planner.models import ModelNotFoundError, resolve_model
from app.planner.plan import Plan, fix_to_flags, plan
from app.server.logparse import LogParser, strip_ansi
from app.server.supervisor import EXIT_REASONS

NCCL_SILENCE_S = 300.0
#: gpu_memory_utilization when the log's non-default args do not name it (vllm/config/cache.py, 0.32.0)
DEFAULT_UTILIZATION = 0.92
_N = r"([0-9][0-9,]*(?:\.[0-9]+)?)"
_SIGNED = r"(-?[0-9][0-9,]*(?:\.[0-9]+)?)"


def _num(s: str) -> float:
    return float(s.replace(",", ""))


@dataclass
class Diagnosis:
    """``problem`` a stable code; ``explanation`` plain sentences; ``fix`` option values
    (ServerConfig field names, ``env`` for variables; may be empty when the fix is not
    an option); ``evidence`` the supporting log lines (ANSI stripped), the cause first;
    ``after_ready``: the server had been ready (``/health`` 200) when its engine died,
    so it can serve no more."""

    problem: str
    explanation: str
    fix: dict[str, Any] = field(default_factory=dict)
    evidence: list[str] = field(default_factory=list)
    after_ready: bool = False

    def summary(self) -> str:
        """One short paragraph: problem, why, fix."""

        s = f"Diagnosis: {self.problem} — {self.explanation}"
        if self.fix:
            s += f" Fix: {fix_to_flags(self.fix)}."
        return s


@dataclass
class _Ctx:
    args: dict[str, Any]  # non-default args vLLM printed
    version: str | None = None  # the vLLM version the log names
    lines: list[str] = field(default_factory=list)  # the log's messages (vLLM's line prefix removed)
    raw: list[str] = field(default_factory=list)  # the log's lines, prefix kept (the worker that printed each)
    at: int = 0  # index of the line the rule matched

    def get(self, *names: str, default: Any = None) -> Any:
        for n in names:
            if n in self.args:
                return self.args[n]
        return default


Rule = tuple[str, re.Pattern[str], int, Callable[[re.Match[str], _Ctx], tuple[Any, ...]]]


def _largest_power_of_two(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def _r_kv_ctx(m: re.Match[str], c: _Ctx) -> tuple[str, dict[str, Any]]:
    need, est = int(_num(m.group(1))), int(_num(m.group(4)))
    return (f"one request of the model's max_model_len ({need:,} tokens) needs {m.group(2)} GiB of KV cache "
            f"but only {m.group(3)} GiB is available; about {est:,} tokens fit. Lower max_model_len (or use an "
            f"fp8 KV cache, or raise gpu_memory_utilization).", {"max_model_len": est})


#: options of the non-default args a plan from the log takes (the rest do not change memory)
_PLAN_OPTIONS = ("tensor_parallel_size", "pipeline_parallel_size", "max_num_seqs", "max_num_batched_tokens",
                 "max_model_len", "quantization", "dtype", "kv_cache_dtype", "gpu_memory_utilization",
                 "enforce_eager")


def _log_plan(c: _Ctx, card: GpuSpec, env: dict[str, str] | None = None, **options: Any) -> Plan | None:
    """The plan of the launch the log shows: the model vLLM was given (the non-default
    args' ``model``/``model_tag``, resolved offline: a local directory, the HF cache or
    the catalog), its options there (``options`` override them), ``env``, on TP × PP
    copies of ``card`` (the memory the log reported), under the log's vLLM version. None
    when the model is not known here."""
    name = c.get("model", "model_tag")
    if not name:
        return None
    try:
        model = resolve_model(str(name))
    except (ModelNotFoundError, OSError, ValueError, KeyError):
        return None
    opts = {k: c.args[k] for k in _PLAN_OPTIONS if k in c.args and k in VLLM_OPTIONS}
    opts.update(options)
    try:
        cfg = ServerConfig(model=str(name), env=dict(env or {}), **opts)
        world = (cfg.tensor_parallel_size or 1) * (cfg.pipeline_parallel_size or 1)
        return plan(cfg, [card] * world, model, vllm_version=c.version, use_calibration=False)
    except (ValidationError, ValueError, KeyError):
        return None


def _planned(p: Plan | None, problem: str) -> tuple[str, dict[str, Any]] | None:
    """The planner's finding ``problem`` in ``p``: its message and fix (None: no such finding)."""
    f = None if p is None else next((f for f in p.findings if f.problem == problem), None)
    return None if f is None else (f.message, dict(f.fix or {}))


#: the compute capability of a card known only by the memory a log printed: high enough that
#: no capability check fires, since only the memory findings of such a plan are used
MEMORY_ONLY_CC = 9.0


def _r_free(m: re.Match[str], c: _Ctx) -> tuple[str, dict[str, Any]]:
    """GPU memory held by other processes (vllm/v1/worker/utils.py request_memory, 0.32:
    "Free memory on device cuda:0 (F/T GiB) on startup is less than desired GPU memory
    utilization (U, R GiB)" or "… less than the engine's budget after excluding external
    process's weights (U, R GiB)"; 0.10/0.11 vllm/v1/worker/gpu_worker.py without the
    device). The fix is never a utilization that cannot hold the model: it comes from the
    planner's check for the model of the log (:func:`_log_plan`); without a known
    model it is left to the user, with the figures."""
    free, total, u = _num(m.group(1)), _num(m.group(2)), _num(m.group(3))
    # the log gives the card's memory, not its compute capability; only the plan's memory
    # finding is read here, so a capability that refuses nothing stands in for it
    card = unknown_gpu("GPU", total, MEMORY_ONLY_CC).with_memory(busy_gib=max(0.0, total - free))
    planned = _planned(_log_plan(c, card, gpu_memory_utilization=u), "not_enough_free_vram")
    if planned is not None:
        return planned
    fit = floor2(free / total)
    return (f"other processes (often a leftover vLLM) hold memory on the GPU: only {free} of {total} GiB is "
            f"free, less than gpu_memory_utilization {m.group(3)} asks for. {CLEANUP_HINT[0].upper()}"
            f"{CLEANUP_HINT[1:]}; a utilization of at most {fit} fits the free memory ({fit * total:.2f} GiB), "
            f"but whether that holds the model's weights and a KV cache is not known from this log.", {})


def _kv_space_fix(available_gib: float, want: int) -> dict[str, Any]:
    """A ``VLLM_CPU_KVCACHE_SPACE`` of ``want`` GiB, or less when less is available (whole
    GiB, as vLLM parses it), or {} when not even 1 GiB is."""
    n = min(want, math.floor(available_gib + 1e-9))
    return {"env": {"VLLM_CPU_KVCACHE_SPACE": str(n)}} if n >= 1 else {}


def _r_node_startup(m: re.Match[str], c: _Ctx) -> tuple[str, dict[str, Any]]:
    """The CPU build's start-up check (vllm/v1/worker/cpu_worker.py CPUWorker.__init__,
    0.32: "Available memory on node N (A/T GiB) on startup is less than desired CPU
    memory utilization (U, R GiB)"): the planner's fix for the model of the log on that
    node (a KV cache size, or a utilization that fits and holds the model)."""
    node, avail, total, u = m.group(1), _num(m.group(2)), _num(m.group(3)), _num(m.group(4))
    card = cpu_device(total, 1).with_memory(busy_gib=max(0.0, total - avail))
    planned = _planned(_log_plan(c, card, gpu_memory_utilization=u), "not_enough_node_memory")
    if planned is not None:
        return planned
    fit = floor2(avail / total)
    return (f"on the CPU build gpu_memory_utilization is a fraction of NUMA node {node}'s memory: {u} × {total} GiB "
            f"is more than the {avail} GiB available there. Set the KV cache size instead (VLLM_CPU_KVCACHE_SPACE, "
            f"GiB, below what the weights leave of {avail} GiB; vLLM then skips this check) or use a utilization of "
            f"at most {fit}; the model of this log is not known here, so neither is sized for it.", {})


def _r_node_kv(m: re.Match[str], c: _Ctx) -> tuple[str, dict[str, Any]]:
    """The CPU build's KV cache allocation (vllm/v1/worker/cpu_worker.py
    determine_available_memory, 0.32): with VLLM_CPU_KVCACHE_SPACE "Available memory on
    node N (A/T GiB) on kv cache allocation is less than requested memory for kv (K
    GiB)"; sized from the utilization "… (K/R GiB). Reduce CPU memory used by other
    processes." — K ≤ 0 when the process itself (weights, runtime) already takes the
    budget R. A is measured after the weights are loaded, so a KV cache up to A fits:
    the fix is the KV cache the model can use (:func:`app.planner.checks.cpu_kv_space_want`
    for the model of the log; 4 GiB when it is not known), at most A."""
    node, avail, total, kv = m.group(1), _num(m.group(2)), _num(m.group(3)), _num(m.group(4))
    p = _log_plan(c, cpu_device(total, 1))
    fix = _kv_space_fix(avail, cpu_kv_space_want(p) if p is not None else int(CPU_DEFAULT_KV_GIB))
    size = (f"VLLM_CPU_KVCACHE_SPACE={fix['env']['VLLM_CPU_KVCACHE_SPACE']} (GiB) fits" if fix else
            f"not even 1 GiB fits: free memory on the node (other programs; {CLEANUP_HINT})")
    if m.group(5) is None:
        return (f"the KV cache of {kv} GiB (VLLM_CPU_KVCACHE_SPACE) is more than the {avail} GiB still available on "
                f"NUMA node {node} after loading the model: {size}.", fix)
    budget = _num(m.group(5))
    if kv <= 0:
        return (f"the CPU build's process (weights and runtime, {budget - kv:.2f} GiB) already takes the whole budget "
                f"of gpu_memory_utilization × the node's {total} GiB = {budget} GiB, leaving nothing for the KV cache: "
                f"set the KV cache size instead — {size} — or raise gpu_memory_utilization.", fix)
    return (f"the KV cache the utilization leaves ({kv} of {budget} GiB) is more than the {avail} GiB still available "
            f"on NUMA node {node}: set the KV cache size instead — {size} — or lower gpu_memory_utilization.", fix)


def _r_sampler(m: re.Match[str], c: _Ctx) -> tuple[str, dict[str, Any]]:
    n = int(_num(m.group(1)))
    seqs = 256 if n > 256 else max(1, n // 2)
    return (f"the sampler warm-up for {n} sequences (fp32 logits over the whole vocabulary) did not fit in the "
            f"memory left after the KV cache; {seqs} is vLLM's default for cards under 70 GiB.",
            {"max_num_seqs": seqs})


def _r_heads(m: re.Match[str], c: _Ctx) -> tuple[str, dict[str, Any]]:
    heads, tp = int(m.group(1)), int(m.group(2))
    d = max(t for t in range(1, tp) if heads % t == 0) if tp > 1 else 1
    return (f"tensor parallel size {tp} does not divide the {heads} attention heads; {d} is the largest size "
            f"below it that does (or use pipeline parallelism).", {"tensor_parallel_size": d})


def _r_world(m: re.Match[str], c: _Ctx) -> tuple[str, dict[str, Any]]:
    world, n = int(m.group(1)), int(m.group(2))
    pp = int(c.get("pipeline_parallel_size", default=1) or 1)
    tp = _largest_power_of_two(max(1, n // pp))
    return (f"tensor × pipeline parallel size is {world} but only {n} GPUs are visible "
            f"(CUDA_VISIBLE_DEVICES / the card count).", {"tensor_parallel_size": tp})


def _r_dp_rank(m: re.Match[str], c: _Ctx) -> tuple[str, dict[str, Any]]:
    n = int(m.group(2))
    world = int(c.get("tensor_parallel_size", default=1) or 1) * int(c.get("pipeline_parallel_size", default=1) or 1)
    dp = int(c.get("data_parallel_size", default=1) or 1)
    fit = max(1, n // world)
    return (f"data_parallel_size {dp} × (tensor × pipeline parallel size {world}) needs {dp * world} GPUs but only "
            f"{n} are visible: the replica that would start at GPU {n} has none (CUDA_VISIBLE_DEVICES / the card "
            f"count).", {"data_parallel_size": fit})


def _cc(s: str) -> str:
    """A capability as vLLM prints it ("75", or "7.5") → "7.5"."""
    return s if "." in s else f"{int(s) / 10:.1f}"


def _quant_advice(method: str) -> str:
    """What to change when ``method``'s kernels refuse the card: another checkpoint
    format that runs there (AWQ from 7.5, GPTQ from 6.0 — their get_min_capability())
    or a newer card; an online method on a 16-bit checkpoint can simply be dropped."""
    m = method.lower()
    if "fp8" in m or "fp4" in m or "mx" in m or m in ("modelopt", "modelopt_mixed", "online"):
        return ("Use an AWQ (from 7.5) or GPTQ (from 6.0) checkpoint, or a newer card; if --quantization "
                f"{method} quantizes a 16-bit checkpoint while loading, drop it.")
    if "awq" in m or "marlin" in m:
        return "Use a GPTQ checkpoint (runs from 6.0) or a newer card."
    return "Use a checkpoint in a format this card runs (GPTQ from 6.0, AWQ from 7.5) or a newer card."


def _r_quant_cc(m: re.Match[str], c: _Ctx) -> tuple[str, dict[str, Any]]:
    return (f"the {m.group(1)} kernels need compute capability {_cc(m.group(2))}; this GPU has "
            f"{_cc(m.group(3))}. {_quant_advice(m.group(1))}", {})


def _r_scheme_cc(m: re.Match[str], c: _Ctx) -> tuple[str, dict[str, Any]]:
    need = "exactly" if m.group(1) == "Required" else "at least"
    return (f"the checkpoint's quantization scheme (compressed-tensors or quark) needs compute capability {need} "
            f"{_cc(m.group(2))}; this GPU has {_cc(m.group(3))}. Use a checkpoint in a scheme this card runs "
            f"(weight-only W4A16/W8A16, or AWQ/GPTQ) or a newer card.", {})


def _r_kernel_cc(m: re.Match[str], c: _Ctx) -> tuple[str, dict[str, Any]]:
    return (f"no kernel for the quantized layers runs on this GPU: {m.group(1)} needs compute capability "
            f"{_cc(m.group(2))}, this GPU has {_cc(m.group(3))} (vLLM lists every kernel it tried after "
            f"\"Failed to find a kernel\"). Use a checkpoint in a format this card runs (GPTQ from 6.0, AWQ from "
            f"7.5) or a newer card.", {})


def _r_kernel_none(m: re.Match[str], c: _Ctx) -> tuple[str, dict[str, Any]]:
    return (f"no kernel of this vLLM can run the quantized {m.group(1)} layers here; the lines after it give each "
            f"kernel's reason: a compute capability below the kernel's minimum (then another checkpoint format or a "
            f"newer card), or a layer shape the kernel cannot split (then another tensor_parallel_size).", {})


def _r_marlin_cc(m: re.Match[str], c: _Ctx) -> tuple[str, dict[str, Any]]:
    return (f"the Marlin kernels do not run on compute capability {_cc(m.group(2))} (they need 8.0 up to vLLM 0.11, "
            f"7.5 from 0.32), and this checkpoint's {m.group(1)} weights need them. Use a GPTQ checkpoint (runs from "
            f"6.0 without Marlin), a newer vLLM or a newer card.", {})


def _r_platform_quant(m: re.Match[str], c: _Ctx) -> tuple[str, dict[str, Any]]:
    return (f"{m.group(1)} has no kernels on this device ({m.group(2)}: Platform.verify_quantization); use a "
            f"checkpoint in a format it runs, or leave --quantization unset.", {})


def _r_quant_mismatch(m: re.Match[str], c: _Ctx) -> tuple[str, dict[str, Any]]:
    ckpt, given = m.group(1), m.group(2)
    if ckpt in ("", "None"):  # a quantization_config without quant_method: "()" up to 0.11, "(None)" from 0.32
        return (f"the checkpoint's quantization_config names no quant_method, so --quantization {given} does not "
                f"match it. Drop --quantization.", {"quantization": None})
    return (f"the checkpoint is quantized with {ckpt} (its quantization_config) and --quantization {given} does not "
            f"match it. Drop --quantization (vLLM reads the checkpoint's method and picks its fastest kernel) or "
            f"give --quantization {ckpt}.", {"quantization": None})


def _r_quant_no_config(m: re.Match[str], c: _Ctx) -> tuple[str, dict[str, Any]]:
    q = m.group(1)
    return (f"--quantization {q} needs a checkpoint quantized with {q}, but this one has no quantization_config (nor "
            f"{q}'s own config file): it is a 16-bit checkpoint, or quantized another way. Drop --quantization, or "
            f"use a checkpoint quantized with {q}.", {"quantization": None})


def _r_bf16(m: re.Match[str], c: _Ctx) -> tuple[str, dict[str, Any]]:
    return ("bfloat16 needs compute capability 8.0 (Ampere or newer); run the model in float16.", {"dtype": "half"})


def _r_awq_bf16(m: re.Match[str], c: _Ctx) -> tuple[str, dict[str, Any]]:
    return (f"this vLLM runs {m.group(1)} only in float16.", {"dtype": "half"})


#: torch's out-of-memory message (c10/cuda/CUDACachingAllocator.cpp, torch 2.4–2.13: "CUDA out of
#: memory. Tried to allocate X. GPU d has a total capacity of T of which F is free. Process P has M
#: memory in use. Including non-PyTorch memory, this process has N memory in use. …"; older
#: builds spell it "capacty"); each "Process P has M" names another process on the card
_TORCH_OOM = re.compile(r"Tried to allocate " + _N + r" ?([KMG]iB|B)\. GPU (\d+) has a total capaci?ty of " + _N
                        + r" ?([KMG]iB|B) of which " + _N + r" ?([KMG]iB|B) is free")
_TORCH_OTHER = re.compile(r"Process (\d+) has " + _N + r" ?([KMG]iB|B) memory in use")
_UNIT = {"B": 2 ** -30, "KiB": 2 ** -20, "MiB": 2 ** -10, "GiB": 1.0}
#: vllm/v1/worker/gpu_worker.py determine_available_memory (0.32.0): "Available KV cache memory: %s GiB",
#: one line per worker (the figure may be negative)
_KV_AVAIL = re.compile(r"Available KV cache memory: " + _SIGNED + r" ?GiB")
_WORKER = re.compile(r"^\(([^) ]+) pid=")


def _gib(n: str, unit: str) -> float:
    return _num(n) * _UNIT[unit]


@dataclass
class _Oom:
    """The figures of a torch out-of-memory message, GiB: the allocation that failed,
    the card's total and free memory, and what other processes hold (pid → GiB)."""

    tried: float
    gpu: int
    total: float
    free: float
    others: dict[int, float]

    @property
    def others_gib(self) -> float:
        return sum(self.others.values())


def _torch_oom(text: str) -> _Oom | None:
    m = _TORCH_OOM.search(text)
    if m is None:
        return None
    others = {int(o.group(1)): _gib(o.group(2), o.group(3)) for o in _TORCH_OTHER.finditer(text)}
    return _Oom(_gib(m.group(1), m.group(2)), int(m.group(3)), _gib(m.group(4), m.group(5)),
                _gib(m.group(6), m.group(7)), others)


def _phase_at(c: _Ctx) -> "tuple[str | None, LogParser]":
    """The launch phase the log had reached before the matched line (a key of
    app.server.logparse.LAUNCH_PHASES: weights, profile, kv_cache, graphs, api, ready) and the
    parser that read it (its facts: weights GiB, KV budget, graph memory)."""
    parser = LogParser()
    for line in c.lines[:c.at]:
        parser.feed(line)
    return parser.facts.phase, parser


def _kv_figures(c: _Ctx) -> dict[str, float]:
    """Each worker's "Available KV cache memory" before the matched line (worker name → GiB;
    a log without vLLM's process prefix gives one worker, "")."""
    out: dict[str, float] = {}
    for line in c.raw[:c.at + 1] if c.raw else c.lines[:c.at + 1]:
        m = _KV_AVAIL.search(line)
        if m:
            w = _WORKER.match(line)
            out[w.group(1) if w else ""] = _num(m.group(1))
    return out


_SEQUENTIAL = ("no option fixes this: start the launches one after the other (vLLM sizes its budget from the "
               "memory free when it starts and measures the whole card while profiling), or give each its own "
               "GPUs (CUDA_VISIBLE_DEVICES / --gpus)")


def _r_no_kv(m: re.Match[str], c: _Ctx) -> tuple[str, dict[str, Any], str]:
    """"No available memory for the cache blocks" (vllm/v1/core/kv_cache_utils.py, 0.32.0),
    sized from the workers' "Available KV cache memory: X GiB" lines before it. Workers
    of one replica hold equal shares of the model, so figures that differ by more than a
    GiB mean that something else took memory on the lowest one's card while vLLM
    profiled (a second launch started at the same time): ``concurrent_launch``, which no
    option fixes. A single negative figure is the budget's shortfall: the utilization
    is raised by exactly that much of the card where the card's size is known (the
    free-memory line), else the shortfall is given in GiB."""
    kv = _kv_figures(c)
    u = float(c.get("gpu_memory_utilization", default=DEFAULT_UTILIZATION) or DEFAULT_UTILIZATION)
    if len(kv) > 1 and max(kv.values()) - min(kv.values()) > 1.0:
        low = min(kv, key=kv.get)
        spread = max(kv.values()) - kv[low]
        return (f"the workers of one model found different KV cache memory ({', '.join(f'{w or chr(63)}: {v:.2f} GiB' for w, v in kv.items())}): "
                f"they hold equal shares of the model, so {spread:.2f} GiB on {low}'s card was taken by another "
                f"process while vLLM profiled — usually a second launch started at the same time; {_SEQUENTIAL}.",
                {}, "concurrent_launch")
    neg = min(kv.values()) if kv else None
    if neg is not None and neg < 0:
        short = -neg
        total = _total_from_log(c)
        if total:
            add = math.ceil((short + 0.5) / total * 100) / 100  # the shortfall and half a GiB of KV cache
            new = round(u + add, 2)
            if new <= 0.95:
                return (f"the weights and the profiled activations take {short:.2f} GiB more than the budget "
                        f"(gpu_memory_utilization {u} × {total:.2f} GiB; vLLM logged \"Available KV cache memory: "
                        f"{neg:.2f} GiB\"): gpu_memory_utilization {new} covers that and half a GiB of KV cache. If "
                        f"another launch started on this card at the same time, {_SEQUENTIAL}.",
                        {"gpu_memory_utilization": new})
            return (f"the weights and the profiled activations take {short:.2f} GiB more than the budget "
                    f"(gpu_memory_utilization {u} × {total:.2f} GiB): no utilization up to 0.95 covers it — quantize, "
                    f"spread the model over more GPUs (tensor_parallel_size), or lower max_num_batched_tokens (the "
                    f"profiled activations grow with it). If another launch started on this card at the same time, "
                    f"{_SEQUENTIAL}.", {})
        return (f"the weights and the profiled activations take {short:.2f} GiB more than the budget (vLLM logged "
                f"\"Available KV cache memory: {neg:.2f} GiB\"): raise gpu_memory_utilization by {short + 0.5:.2f} GiB "
                f"÷ the card's memory (e.g. +{math.ceil((short + 0.5) / 80 * 100) / 100} on an 80 GiB card, "
                f"+{math.ceil((short + 0.5) / 24 * 100) / 100} on a 24 GiB one), quantize or use more GPUs. If another "
                f"launch started on this card at the same time, {_SEQUENTIAL}.", {})
    fix = {"gpu_memory_utilization": min(0.95, round(u + 0.03, 2))} if u < 0.95 else {}
    return ("weights and activations take the whole memory budget, nothing is left for the KV cache: raise "
            "gpu_memory_utilization, quantize, or spread the model over more GPUs.", fix, "no_kv_cache_memory")


#: vllm/v1/worker/gpu_worker.py determine_available_memory (0.32.0, DEBUG): "Initial free memory: %s GiB;
#: Requested memory: %f (util), %s GiB" — the requested memory is utilization × the card's total
_REQUESTED = re.compile(r"Requested memory: " + _N + r" \(util\), " + _N + r" ?GiB")


def _total_from_log(c: _Ctx) -> float | None:
    """The card's total memory, GiB, where the log gives it: torch's out-of-memory
    message, or vLLM's requested memory ÷ its utilization (logged at DEBUG)."""
    for line in reversed(c.lines):
        o = _torch_oom(line)
        if o is not None:
            return o.total
        r = _REQUESTED.search(line)
        if r and _num(r.group(1)) > 0:
            return _num(r.group(2)) / _num(r.group(1))
    return None


_PHASE_WORDS = {"engine": "while starting the engine", "weights": "while loading the weights",
                "profile": "while profiling the activations (a forward pass of max_num_batched_tokens tokens)",
                "kv_cache": "while allocating the KV cache", "graphs": "while capturing CUDA graphs",
                "api": "after the engine started", "ready": "while serving"}


def _r_oom(m: re.Match[str], c: _Ctx) -> tuple[str, dict[str, Any], str]:
    """A torch out-of-memory error, by the launch phase the log had reached
    (:func:`_phase_at`: LAUNCH_PHASES, vLLM 0.32.0's lines) and sized from torch's
    figures (:func:`_torch_oom`) and vLLM's (weights, KV budget, graph memory):

    - other processes hold memory the allocation lacks: they grew after vLLM's start-up
      check (which passed), so another launch ran at the same time — ``concurrent_launch``;
    - loading weights — ``weights_do_not_fit``: quantize or more GPUs (no utilization helps);
    - profiling — the activations of max_num_batched_tokens tokens: halve it (at least
      the allocation's share);
    - KV allocation, graph capture, serving — the utilization lowered by the allocation
      that failed less the free memory (+0.01), or --enforce-eager for the graphs;
    - no phase and no figures: the utilization lowered by 0.05 (as before)."""
    text = c.lines[c.at] if c.lines else m.string
    o = _torch_oom(text)
    phase, parser = _phase_at(c)
    after_ready = parser.facts.ready or phase == "ready"
    u = float(c.get("gpu_memory_utilization", default=DEFAULT_UTILIZATION) or DEFAULT_UTILIZATION)
    where = _PHASE_WORDS.get("ready" if after_ready else phase or "", "")
    if o is not None and o.others_gib >= 1.0 and o.others_gib + o.free >= o.tried:
        pids = ", ".join(str(p) for p in o.others)
        return (f"the GPU ran out of memory {where or 'during the launch'}: other processes (pid {pids}) hold "
                f"{o.others_gib:.2f} GiB of GPU {o.gpu}'s {o.total:.2f} GiB and only {o.free:.2f} GiB was free for "
                f"an allocation of {o.tried:.2f} GiB. vLLM's start-up check passed, so they took that memory during "
                f"this launch — usually a second launch started at the same time; {_SEQUENTIAL}. A leftover vLLM: "
                f"{CLEANUP_HINT}.", {}, "concurrent_launch")
    short = None if o is None else max(0.0, o.tried - o.free)
    if phase == "weights" and not after_ready:
        w = parser.facts.model_loading_gib
        extra = f" ({o.total:.2f} GiB card)" if o else ""
        return (f"the GPU ran out of memory while loading the weights{extra}: the model's share per GPU does not "
                f"fit{f' (loaded so far: {w} GiB)' if w else ''}; gpu_memory_utilization does not change this — use a "
                f"quantized checkpoint or spread the model over more GPUs (tensor_parallel_size).", {},
                "weights_do_not_fit")
    if phase == "profile" and not after_ready:
        cur = c.get("max_num_batched_tokens")
        cur = int(cur) if cur else None
        if cur:
            n = max(256, 1 << ((cur // 2).bit_length() - 1))
            if o is not None and o.tried > o.free > 0:
                n = min(n, max(256, 1 << (int(cur * o.free / o.tried).bit_length() - 1)))
            fix = {"max_num_batched_tokens": n} if n < cur else {}
        else:
            fix = {}
        fig = f" (tried {o.tried:.2f} GiB, {o.free:.2f} GiB free of {o.total:.2f} GiB)" if o else ""
        return (f"the GPU ran out of memory while profiling the activations{fig}: vLLM runs one forward pass of "
                f"max_num_batched_tokens tokens to size them; fewer tokens per step "
                f"{'(' + str(fix['max_num_batched_tokens']) + ')' if fix else '(lower --max-num-batched-tokens)'} "
                f"lower that peak, or quantize / use more GPUs.", fix, "cuda_oom")
    if phase in ("kv_cache", "graphs", "api", "ready") or after_ready:
        total = o.total if o else None
        down = (math.ceil(short / total * 100 - 1e-9) / 100 + 0.01) if o and total else 0.05  # the shortfall + 1 %
        new = round(max(0.5, u - max(0.01, down)), 2)
        fig = (f" an allocation of {o.tried:.2f} GiB found {o.free:.2f} GiB free of {o.total:.2f} GiB" if o else "")
        if phase == "graphs" and not after_ready:
            g = parser.facts.kv_cache_tokens
            return (f"the GPU ran out of memory while capturing CUDA graphs, which live outside "
                    f"gpu_memory_utilization:{fig or ' no figures in the log'}{f' (KV cache: {g:,} tokens)' if g else ''}."
                    f" gpu_memory_utilization {new} leaves that room, or --enforce-eager captures none (slower "
                    f"decoding).", {"gpu_memory_utilization": new}, "cuda_graph_oom_risk")
        if after_ready:
            return (f"the GPU ran out of memory while serving:{fig or ' no figures in the log'}. The KV cache, "
                    f"sized by gpu_memory_utilization {u}, left too little for the activations of a full step: "
                    f"gpu_memory_utilization {new} leaves that room (or lower max_num_seqs / max_num_batched_tokens).",
                    {"gpu_memory_utilization": new}, "cuda_oom")
        kv = parser.facts.available_kv_cache_gib
        return (f"the GPU ran out of memory {where}:{fig or ' no figures in the log'}"
                f"{f' (KV budget {kv} GiB)' if kv is not None else ''}; gpu_memory_utilization {new} fits it.",
                {"gpu_memory_utilization": new}, "cuda_oom")
    return ("the GPU ran out of memory while loading, profiling or capturing CUDA graphs (the log shows no phase): "
            "lower gpu_memory_utilization (CUDA graphs live outside it), or --enforce-eager, quantize or use more "
            "GPUs.", {"gpu_memory_utilization": round(max(0.5, u - 0.05), 2)}, "cuda_oom")


def _r_maxlen(m: re.Match[str], c: _Ctx) -> tuple[str, dict[str, Any]]:
    return (f"max_model_len {int(_num(m.group(1))):,} is longer than the model allows ({int(_num(m.group(2))):,}).",
            {"max_model_len": int(_num(m.group(2)))})


def _r_batched(m: re.Match[str], c: _Ctx) -> tuple[str, dict[str, Any]]:
    return ("max_num_batched_tokens must be at least max_num_seqs.", {"max_num_batched_tokens": int(_num(m.group(2)))})


def _r_active(m: re.Match[str], c: _Ctx) -> tuple[str, dict[str, Any]]:
    return ("max_num_active_seqs must be at most max_num_seqs.", {"max_num_active_seqs": int(_num(m.group(2)))})


def _r_unrecognized(m: re.Match[str], c: _Ctx) -> tuple[str, dict[str, Any]]:
    flags = re.findall(r"--([A-Za-z0-9][\w-]*)", m.group(1))
    return (f"this vLLM version does not accept {', '.join('--' + f for f in flags) or m.group(1)} "
            f"(removed or renamed).", {f.replace("-", "_"): None for f in flags})


def _r_unknown_quant(m: re.Match[str], c: _Ctx) -> tuple[str, dict[str, Any]]:
    return (f"--quantization {m.group(1)} is not a method this vLLM version knows; leave it unset to use the "
            f"checkpoint's own quantization_config.", {"quantization": None})


#: vLLM's line prefix: ``(EngineCore_DP0 pid=7) ERROR 01-28 21:40:02 [core.py:710] `` (vllm/logger.py
#: _FORMAT; 0.10 prints no process part, 0.11 adds it to every stdout/stderr line, also to
#: tracebacks: vllm/utils decorate_logs; 0.32/0.33 put it in the format)
_PREFIX = re.compile(r"^(?:\((\S+) pid=\d+\) )?(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d "
                     r"\d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]*\] )?")


def _message(line: str) -> str:
    """A log line without vLLM's prefix (process, level, time, file:line)."""
    return line[_PREFIX.match(line).end():]


# pydantic's ValidationError text (pydantic_core ValidationError.__str__, the same in the
# pydantic 2.x that vLLM 0.10–0.33 install): a header, then per error an optional location
# line, the message indented two spaces (continuation lines of a multi-line message are
# not indented) ending in ``[type=…, input_value=…, input_type=…]``, and the docs URL.
_PYD_HEADER = re.compile(r"^(?:[\w.]*ValidationError: )?(\d+) validation errors? for (\w+)\s*$")
_PYD_TAIL = re.compile(r"\s*\[type=\w+(?:, input_value=.*?)?(?:, input_type=\w+)?\]\s*$")
_PYD_URL = re.compile(r"^\s*For further information visit https://errors\.pydantic\.dev/")
_PYD_KIND = re.compile(r"^\s*(?:Value error|Assertion failed), ")


@dataclass
class ConfigError:
    """One error of a pydantic ValidationError: ``loc`` the field (None for a check of the
    whole class, vLLM's ``__post_init__``/validators), ``message`` vLLM's or pydantic's
    words without the ``Value error, `` kind and the ``[type=…]`` tail, ``line`` the index
    of its message's first line, ``loc_line`` that of the location line (None without)."""

    loc: str | None
    message: str
    line: int
    loc_line: int | None = None


@dataclass
class ValidationBlock:
    """A pydantic ValidationError in the log: ``cls`` the class (``ModelConfig``…),
    ``header`` and ``end`` the indices of its first and last lines, ``errors`` in order."""

    cls: str
    header: int
    end: int
    errors: list[ConfigError]


def validation_block(msgs: list[str], i: int) -> ValidationBlock | None:
    """The pydantic ValidationError that line ``i`` of ``msgs`` (messages, vLLM's prefix
    removed) belongs to, its header included; None when it is part of none."""
    for h in range(i, max(-1, i - 200), -1):
        m = _PYD_HEADER.match(msgs[h])
        if m:
            break
    else:
        return None
    count, errors = int(m.group(1)), []
    loc, loc_at, buf, start, j, end = None, None, [], h, h + 1, h
    while j < len(msgs) and len(errors) < count and j - h <= 60 * count:
        t = msgs[j]
        if _PYD_URL.match(t):
            end = j
        else:
            tail = _PYD_TAIL.search(t)
            if tail is None and not buf and not t.startswith(" "):
                loc, loc_at, end = t.strip() or None, j, j  # the field's location line
            else:
                if not buf:
                    start = j
                buf.append(t[:tail.start()] if tail else t)
                end = j
                if tail is not None:
                    text = _PYD_KIND.sub("", " ".join(x.strip() for x in buf if x.strip()), count=1)
                    errors.append(ConfigError(loc, text.strip(), start, loc_at if loc else None))
                    loc, loc_at, buf = None, None, []
        j += 1
    if j < len(msgs) and _PYD_URL.match(msgs[j]):
        end = j
    if not errors or not h <= i <= end:
        return None
    return ValidationBlock(m.group(2), h, end, errors)


def evidence_text(line: str) -> str:
    """An evidence line as shown to the user: vLLM's prefix kept, pydantic's
    ``[type=…, input_value=…]`` tail dropped (the log keeps the whole line)."""
    return _PYD_TAIL.sub("", line)


def _r_invalid_config(m: re.Match[str], c: _Ctx) -> tuple[str, dict[str, Any]]:
    b = validation_block(c.lines, c.at)
    errs = b.errors if b is not None else []
    said = "; ".join((f"{e.loc}: " if e.loc else "") + e.message.rstrip(".") for e in errs) or "see the log"
    n = f"{len(errs)} validation errors" if len(errs) > 1 else "validation error"
    return (f"vLLM refused the configuration ({m.group(2)}, {n}): {said}. Change the option it names and launch "
            f"again.", {})


def _r_attention(m: re.Match[str], c: _Ctx) -> tuple[str, dict[str, Any]]:
    # the CPU build's kernel (vllm/_C: "Unsupported CPU attention configuration: head_dim=16 isa=2 …") is
    # chosen at the first forward pass, after /health already answers 200
    return (f"the CPU build's attention kernels have none for this model's {m.group(1)}; the server reports "
            f"healthy but fails on the first request. Serve a model with another head size (the tiny test model "
            f"uses head_dim=64) or use a GPU.", {})


#: what --trust-remote-code allows, said wherever it is offered
REMOTE_CODE_WORD = ("--trust-remote-code lets the Python files in the model's repository (its configuration, "
                    "modeling or tokenizer .py) run inside the server with your user's rights: read them first, "
                    "and pin the commit you read with --revision")


def _r_remote_code(m: re.Match[str], c: _Ctx) -> tuple[str, dict[str, Any]]:
    """The model (its config, or the tokenizer of a custom class) is custom code that
    transformers refuses to run without trust_remote_code: vLLM's own sentence
    (vllm/transformers_utils/config.py and vllm/tokenizers/hf.py, 0.32.0) or
    transformers' (dynamic_module_utils.py resolve_trust_remote_code, 5.19)."""
    what = "tokenizer" if "tokenizer" in m.group(0) else "model"
    return (f"the {what} is custom code that transformers runs only when allowed: add --trust-remote-code. "
            f"{REMOTE_CODE_WORD}. If the model was made with a newer transformers than vLLM's, upgrading "
            f"transformers in vLLM's environment may make the custom code unnecessary.", {"trust_remote_code": True})


def _r_tokenizer(m: re.Match[str], c: _Ctx) -> tuple[str, dict[str, Any]]:
    """A tokenizer that will not load (transformers 5.19: tokenization_utils_base.py "Can't
    load tokenizer for 'X'", tokenization_utils_tokenizers.py "Couldn't instantiate the
    backend tokenizer", utils/import_utils.py "requires the SentencePiece library")."""
    if m.group("name"):
        name = m.group("name")
        return (f"no tokenizer could be loaded from {name!r}: its tokenizer files (tokenizer.json, or "
                f"tokenizer.model / vocab files with tokenizer_config.json) are missing or unreadable there. Give "
                f"one that has them with --tokenizer (a directory or Hub id, e.g. the base model the checkpoint was "
                f"made from), or download the whole repository.", {})
    return ("the tokenizer has only a slow (SentencePiece) form and the library to read it is not installed in "
            "vLLM's environment: install it there (pip install sentencepiece; tiktoken for a tiktoken vocabulary) or "
            "give a repository with a tokenizer.json via --tokenizer.", {})


#: huggingface_hub file_download.py _check_disk_space (1.x): a warning before a download that will not fit
_HF_DISK = re.compile(r"Not enough free disk space to download the file\. The expected file size is: " + _N
                      + r" MB\. The target location (\S+) only has " + _N + r" MB free disk space")


def _r_disk_full(m: re.Match[str], c: _Ctx) -> tuple[str, dict[str, Any]]:
    """The disk filled (ENOSPC, ``[Errno 28] No space left on device``), usually while
    downloading the weights; huggingface_hub's warning before the download gives the
    target and its free space."""
    path, size, free = None, None, None
    for line in c.lines[:c.at + 1]:
        h = _HF_DISK.search(line)
        if h:
            size, path, free = _num(h.group(1)), h.group(2), _num(h.group(3))
    if m.groupdict().get("path") and path is None:
        path = m.group("path")
    if m.re is _HF_DISK:
        size, path, free = _num(m.group(1)), m.group(2), _num(m.group(3))
    where = f" at {path}" if path else ""
    figs = (f" (a file of {size / 1e3:.2f} GB, {free / 1e3:.2f} GB free there)" if size is not None and free is not None
            else "")
    return (f"the disk filled{where}{figs}: vLLM (huggingface_hub) downloads the whole checkpoint into the Hugging "
            f"Face cache before loading. Free space there, or download to a disk with room: --download-dir DIR "
            f"(or HF_HOME for the whole cache); `df -h` shows the free space.", {})


def _r_denied(m: re.Match[str], c: _Ctx) -> tuple[str, dict[str, Any]]:
    """EACCES (``[Errno 13] Permission denied: 'P'``)."""
    path = m.group(1)
    return (f"vLLM may not read or write {path!r} (permission denied): usually the Hugging Face cache or a "
            f"download directory owned by another user (root in a container). Make it writable for this user "
            f"(chown), or point HF_HOME / --download-dir at a directory of your own.", {})


def _r_compiler(m: re.Match[str], c: _Ctx) -> tuple[str, dict[str, Any]]:
    """No C/C++ compiler: torch.compile's inductor (torch/_inductor/exc.py InvalidCxxCompiler,
    torch 2.13) or Triton's launcher build (triton/runtime/build.py "Failed to find C
    compiler", triton 3.x)."""
    if "Triton" in m.group(0) or "CC environment" in m.group(0):
        return ("Triton builds a small C launcher for each kernel and found no C compiler: install one (Debian/"
                "Ubuntu: apt-get install gcc; in a container image, the build-essential package) or point CC at "
                "one. --enforce-eager does not avoid it: vLLM's own Triton kernels still need it.", {})
    return ("torch.compile (inductor) found no working C++ compiler: install one (Debian/Ubuntu: apt-get install g++ "
            "or build-essential) or set CXX; --enforce-eager turns torch.compile (and CUDA graphs) off, which avoids "
            "the compiler at the cost of slower steps.", {"enforce_eager": True})


def _r_gguf(m: re.Match[str], c: _Ctx) -> tuple[str, dict[str, Any]]:
    """A GGUF file given as the model: vLLM 0.32.0 has no GGUF loader (no gguf_loader.py in
    vllm/model_executor/model_loader/, no ``gguf`` quantization) and looks for a
    config.json: "Invalid repository ID or local directory specified: '….gguf'"
    (vllm/transformers_utils/config.py), or transformers' "It looks like the config file
    at '….gguf' is not a valid JSON file"."""
    return (f"{m.group(1)!r} is a GGUF file (llama.cpp's format); vLLM {c.version or '0.32'} loads Hugging Face "
            f"checkpoints (a directory or Hub id with config.json and safetensors), not GGUF. Serve the model the "
            f"GGUF was made from, or a quantized checkpoint vLLM loads (AWQ, GPTQ, FP8, compressed-tensors).", {})


def _r_profile_race(m: re.Match[str], c: _Ctx) -> tuple[str, dict[str, Any]]:
    """vllm/v1/worker/gpu_worker.py determine_available_memory (0.32.0), an AssertionError:
    "Error in memory profiling. Initial free memory X GiB, current free memory Y GiB. This
    happens when other processes sharing the same container release GPU memory while
    vLLM is profiling during initialization." (vLLM issue #56830)."""
    init, now = _num(m.group(1)), _num(m.group(2))
    return (f"another process on the same GPU released {now - init:.2f} GiB while vLLM profiled its memory (free "
            f"memory went from {init} to {now} GiB): vLLM's profile assumes nobody else changes their memory "
            f"meanwhile — usually another launch ending, or one starting and failing, at the same time; "
            f"{_SEQUENTIAL}.", {})


#: the options of `vllm serve` (vllm/engine/arg_utils.py EngineArgs fields, vLLM 0.32.0; --flag-name is
#: the field with "-" for "_"): an option a config error names is one of these when it is a flag
SERVE_OPTIONS = frozenset("""
additional_config aggregate_engine_logging all2all_backend allow_deprecated_quantization
allowed_local_media_path allowed_media_domains async_scheduling attention_backend attention_config
aux_output_config block_size code_revision collect_detailed_traces compilation_config config_format convert
cp_kv_cache_interleave_size cpu_distributed_timeout_seconds cpu_offload_gb cpu_offload_params
cudagraph_capture_sizes cudagraph_metrics custom_histogram_buckets data_parallel_address data_parallel_backend
data_parallel_external_lb data_parallel_hybrid_lb data_parallel_multi_port_external_lb data_parallel_rank
data_parallel_rpc_port data_parallel_size data_parallel_size_local data_parallel_start_rank
dbo_decode_token_threshold dbo_prefill_token_threshold dcp_comm_backend dcp_kv_cache_interleave_size
dcp_q_replicate decode_context_parallel_size default_mm_loras device_ids diffusion_config disable_cascade_attn
disable_chunked_mm_input disable_custom_all_reduce disable_hybrid_kv_cache_manager disable_log_stats
disable_nccl_for_dp_synchronization disable_sliding_window distributed_executor_backend
distributed_timeout_seconds download_dir dp_sync_interval dtype ec_manager_config ec_transfer_config
elastic_ep_max_dp_size enable_batch_sharded_sampling enable_chunked_prefill enable_cumem_allocator enable_dbo
enable_elastic_ep enable_ep_weight_filter enable_eplb enable_expert_parallel enable_fault_tolerance
enable_flashinfer_autotune enable_hc_sp enable_layerwise_nvtx_tracing enable_logging_iteration_details
enable_lora enable_mamba_cache_stochastic_rounding enable_mamba_shared_prefix_checkpoint enable_mfu_metrics
enable_mixed_moe_lora_format enable_mm_embeds enable_mm_processor_stats enable_moe_shared_loras
enable_nccl_comm_suspend enable_prefix_caching enable_prompt_embeds enable_return_routed_experts
enable_shm_tensor_arena enable_sleep_mode enable_tower_connector_lora enable_trace_replay enforce_eager
engram_config eplb_config expert_placement_strategy fail_on_environ_validation fault_tolerance_config
fully_sharded_loras gdn_prefill_backend generation_config gpu_memory_utilization hf_config_path hf_overrides
hf_token ignore_patterns interleave_mm_strings io_processor_plugin ir_op_priority jit_monitor_mode
jit_monitor_verbose kda_decode_backend kda_prefill_backend kernel_config kv_cache_dtype
kv_cache_dtype_skip_layers kv_cache_memory_bytes kv_cache_metrics kv_cache_metrics_sample kv_events_config
kv_offloading_backend kv_offloading_size kv_sharing_fast_prefill kv_transfer_config language_model_only
limit_mm_per_prompt linear_backend load_format log_config_file log_level logging_config logits_processors
logprobs_mode long_prefill_token_threshold long_prefill_token_threshold_adaptive lora_dtype lora_target_modules
mamba_backend mamba_block_size mamba_cache_dtype mamba_cache_mode mamba_cache_philox_rounds mamba_config
mamba_ssm_cache_dtype mamba_ssu_algorithm master_addr master_port max_cpu_loras max_cudagraph_capture_size
max_logprobs max_lora_cls_labels max_lora_rank max_loras max_model_len max_num_active_seqs
max_num_batched_tokens max_num_queued_reqs max_num_queued_tokens max_num_scheduled_tokens max_num_seqs
max_parallel_loading_workers media_io_kwargs mm_device_do_normalize mm_encoder_attn_backend
mm_encoder_attn_dtype mm_encoder_fp8_scale_path mm_encoder_fp8_scale_save_margin mm_encoder_fp8_scale_save_path
mm_encoder_only mm_encoder_tp_mode mm_hasher_algorithm mm_ipc_gpu_memory_gb mm_processor_cache_gb
mm_processor_cache_type mm_processor_device mm_processor_kwargs mm_shm_cache_max_object_size_mb mm_tensor_ipc
model model_class_overrides model_impl model_loader_extra_config model_weights moe_backend nnodes node_rank
num_gpu_blocks_override numa_bind numa_bind_cpus numa_bind_nodes offload_backend offload_group_size
offload_num_in_group offload_params offload_prefetch_step optimization_level otlp_traces_endpoint
override_generation_config per_request_spec_decode_metrics performance_mode pipeline_parallel_size pooler_config
prefill_context_parallel_size prefill_schedule_interval prefix_cache_retention_interval prefix_caching_hash_algo
prefix_match_unit profiler_config pt_load_map_location quantization quantization_config ray_workers_use_nsight
reasoning_config reasoning_parser reasoning_parser_plugin renderer_num_workers replayssm_buffer_len
return_sampling_mask revision runner safetensors_load_strategy safetensors_prefetch_block_size
safetensors_prefetch_num_threads scheduler_cls scheduler_reserve_full_isl scheduling_policy seed
served_model_name show_hidden_metrics_for_version shutdown_timeout skip_mm_profiling skip_tokenizer_init
sleep_mode_offload_cudagraph sleep_preserve_parameter_names sparse_indexer_topk_backend spec_method spec_model
spec_tokens specialize_active_lora speculative_config stream_interval structured_outputs_config
swa_bounded_replay tensor_parallel_size tokenizer tokenizer_mode tokenizer_revision tokens_only
trust_remote_code ubatch_size use_fp64_gumbel use_replayssm use_tqdm_on_load video_pruning_method
video_pruning_rate watermark watermark_config weight_transfer_config worker_cls worker_extension_cls
""".split())

# ---------------------------------------------------------------------- config refusals by kind
# Most of vLLM's refusals of a configuration are a ValueError (or TypeError, NotImplementedError) from
# a config class's __post_init__ / validators (vllm/config/*.py, vllm/engine/arg_utils.py
# create_engine_config, vLLM 0.32.0) whose message names the option and says what is wrong in one of a
# few phrasings; inside a pydantic ValidationError it is the "  Value error, …" line. The kinds below
# are those phrasings; the explanation names the class (from the traceback's file, or the pydantic
# header), the option(s) and vLLM's own words, and the fix is sized where the message gives the value.
#: the rank of the generic config rules: after every specific rule (≤ 50), before the pydantic header (60); one rank per kind, in order
CONFIG_RANK = 51
#: an exception line (not a warning that happens to use the phrase), or pydantic's "Value error, …"
#: the classes vLLM's config checks raise (a library's own error — pynvml's NVMLError_NotSupported in a
#: traceback vLLM logs and goes on from — is not one)
_EXC_LINE = (r"^(?:ERROR )?(?:\s*(?:Value error|Assertion failed), |(?:[\w.]+\.)?(?:ValueError|TypeError|"
             r"NotImplementedError|RuntimeError|KeyError|IndexError|ArgumentTypeError|FileNotFoundError|Exception|"
             r"\w*Config\w*Error): )"
             r"(?!.*(?:CUDA error|NCCL error|out of memory|died unexpectedly|exited unexpectedly|initialization failed|"
             r"EngineDeadError|EngineCore encountered))")
#: (kind, phrase, head): the first that matches names the kind
CONFIG_KINDS: list[tuple[str, str, str]] = [
    ("config_not_divisible", r"divisible by|\bdivisible\b|multiple of|must divide|evenly divide", "a size that must divide another"),
    ("config_conflict", r"cannot be used (?:with|together|in conjunction)|cannot both|mutually exclusive|"
                        r"cannot be (?:paired|combined|enabled|set) (?:with|together)|(?:are|is) (?:not )?incompatible|"
                        r"not compatible with|\bCannot use\b|\bconflict|can't be set|cannot be (?:set|used|enabled) "
                        r"(?:in|when|with)|\bOnly one\b|more than one|specified via both|only one allowed|Cannot set both|cannot be "
                        r"mixed|referenced by both|Disable one of|not (?:currently )?compatible",
     "options it does not take together"),
    ("config_out_of_range", r"must be (?:less|greater|smaller|larger|lower|higher|bigger) than|must be (?:>=|<=|>|<)|"
                            r"\bmust be (?:positive|non-negative|nonnegative|at least|at most|between|in (?:the )?range|"
                            r"a positive)|must not (?:exceed|be (?:greater|larger|less|smaller))|cannot (?:exceed|be "
                            r"(?:greater|larger|less|smaller|negative|more|zero))|\bexceeds?\b|is (?:larger|greater|"
                            r"smaller|less|more) than|out of (?:range|bounds)|should be (?:less|greater|at least|at "
                            r"most|>=|<=)|(?:>=|<=|<|>) ?-?\d", "a value out of range"),
    ("config_requires", r"\brequires?\b|\brequired\b|must be (?:set|provided|specified|enabled|given|True|False)|"
                        r"Please (?:specify|set|provide)|needs? to be|only (?:valid|allowed|applicable|works?) (?:with|when|for)|"
                        r"must (?:also )?(?:set|specify|provide|enable)", "an option that needs another"),
    ("config_not_supported", r"not (?:yet )?supported|does not support|doesn't support|\bunsupported\b|only supported|"
                             r"is supported only|only supports?|not (?:yet )?implemented|not available|currently only|"
                             r"is deprecated|no longer supported|not allowed|has been removed|can only be (?:set|used)|not applicable|"
                             r"does not (?:have|contain)|is not (?:compatible|valid|multimodal)|\bonly (?:be )?(?:set|valid|works?)\b|"
                             r"was removed|do not support|does not yet support|supports only|currently supports|"
                             r"is currently supported|\bOnly \w+ is\b|no compatible|No valid|Unable to use",
     "a setting it does not support here"),
    ("config_invalid_value", r"\bInvalid\b|\bUnknown\b|\bUnrecognized\b|must be one of|must be (?:a |an )?(?:'|\"|string|"
                             r"integer|int\b|float|bool|dict|list|valid|either)|\bValid \w+|[Ss]upported \w+ (?:are|is)|"
                             r"\bgot\b|not a valid|is not (?:a|an) |\bexpected\b|must be\b|should be\b|must (?:not )?(?:contain|use|have|differ|fit)|"
                             r"not found|does not match|should (?:only )?be|must (?:be )?(?:strictly )?increasing|(?i:invalid)|must not be|"
                             r"\bMissing\b|Cannot find|Could not find|Expected\b|must (?:also )?(?:be|match|align|precede)|"
                             r"should have the same|need to have same|have the same precision|but \w+ is not enabled",
     "a value it does not take"),
]
#: the config class of a vLLM file (a traceback's ``File ".../vllm/config/<name>.py"``)
_CONFIG_FILE = re.compile(r'File "[^"]*/vllm/((?:config|engine|model_executor|platforms|v1)/[\w/]+)\.py", line \d+, '
                          r'in (\w+)')
_SUBJECT = re.compile(r"(?:`|')?(--[a-z][\w-]*|\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b)(?:`|')?(?:\s*[=(]\s*(-?\d+)\)?)?\s*"
                      r"((?:must|should|cannot|can not|can't|is|are)\b\s*(?:be\s*|not\s*)*)?"
                      r"(divisible by|a multiple of|less than or equal to|greater than or equal to|less than|"
                      r"smaller than|greater than|larger than|at least|at most|exceeds?|<=|>=|<|>)\s*"
                      r"(?:[`'\w.-]*[A-Za-z_`'][`'\w.-]*\s*){0,4}?[(=]?\s*(-?\d+)\b(?!\.\d)(?!\s*[-+*/])")


def _options_named(text: str) -> list[str]:
    """The options a message names, in order: ``--flags`` and snake_case names, as
    ``--flag`` where they are options of ``vllm serve`` (:data:`SERVE_OPTIONS`)."""
    out: list[str] = []
    for x in re.finditer(r"--[a-z][\w-]*|\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b", text):
        t = x.group(0)
        name = t[2:].replace("-", "_") if t.startswith("--") else t
        # a snake_case word is an option where vLLM treats it as one (a subject or an assignment: "ec_role is",
        # "dp_shared_memory requires", "specify kv_role"), not a layer's or a tensor's name in passing
        if not t.startswith("--") and name not in SERVE_OPTIONS and not (
                re.match(r"`?'?\s*(?:=|\(|must|should|cannot|can't|can only|requires?|is|are|was|only|to be)\b|`?'?\s*[=(]",
                         text[x.end():]) or re.search(r"(?:specify|set|unset|enable|disable|use)\s+`?$", text[:x.start()],
                                                      re.I)):
            continue
        shown = f"--{name.replace('_', '-')}" if name in SERVE_OPTIONS else t
        if shown not in out:
            out.append(shown)
    return out


def _config_where(c: _Ctx) -> str:
    """The class that refused: the pydantic header's, else the last vLLM file of the
    traceback above the line (``vllm/config/scheduler.py`` SchedulerConfig.verify…)."""
    b = validation_block(c.lines, c.at) if c.lines else None
    if b is not None:
        return b.cls
    for line in reversed(c.lines[max(0, c.at - 40):c.at]):
        f = _CONFIG_FILE.search(line)
        if f:
            return f"vllm/{f.group(1)}.py {f.group(2)}"
    return ""


def _is_subject(x: re.Match[str]) -> bool:
    """Whether the option of a :data:`_SUBJECT` match is what the message refuses — "X
    must be …", "X exceeds …", "requires --x <= N" — and not a condition of it ("… is not
    supported with data_parallel_size > 1", "… only when data_parallel_size > 1"), whose
    value the fix must not set."""
    before = x.string[:x.start()].rstrip(" `'")
    if re.search(r"\b(?:with|when|if|unless|and|or|for|while)$", before):
        return False
    if x.group(3) or x.group(4).startswith("exceed"):
        return True
    return x.group(1).startswith("--") and before.endswith("requires")


def _sized(text: str) -> dict[str, Any]:
    """The value the message asks for, as a fix, where its subject is a flag of ``vllm
    serve`` and the bound a whole number: "X (v) must be divisible by N" → the largest
    multiple of N up to v (N when v is below it); "less than N" → N − 1, "at most / <= /
    exceeds N" and "cannot be larger than / must not exceed N" → N, "greater than N" → N +
    1, "at least / >= N" → N. {} otherwise (the words then say what to change)."""
    s = next((x for x in _SUBJECT.finditer(text) if _is_subject(x)), None)
    if s is None:
        return {}
    name = s.group(1)[2:].replace("-", "_") if s.group(1).startswith("--") else s.group(1)
    if name not in SERVE_OPTIONS:
        return {}
    v = int(s.group(2)) if s.group(2) is not None else None
    neg = bool(re.search(r"not|n't", s.group(3) or ""))
    rel, n = s.group(4), int(s.group(5))
    if rel in ("divisible by", "a multiple of"):
        if n <= 0 or neg:
            return {}
        val = n if v is None or v < n else v // n * n
    elif neg:  # "cannot be larger than N", "must not exceed N": at most N; "cannot be less than N": at least N
        val = n
        if rel in ("at least", "at most", ">=", "<=", "<", ">"):
            return {}
    elif rel in ("less than", "smaller than", "<"):
        val = n - 1
    elif rel in ("greater than", "larger than", ">"):
        val = n + 1
    else:
        val = n
    return {name: val} if val != v else {}


def _r_config(kind: str, head: str) -> Callable[[re.Match[str], _Ctx], tuple[str, dict[str, Any]]]:
    def explain(m: re.Match[str], c: _Ctx) -> tuple[str, dict[str, Any]]:
        words = _PYD_TAIL.sub("", m.string[m.end(1):]).strip()
        opts = _options_named(words)
        where = _config_where(c)
        fix = _sized(words) if kind in ("config_not_divisible", "config_out_of_range") else {}
        what = f"{head} ({', '.join(opts[:3])})" if opts else head
        flags = [o for o in opts if o.startswith("--")]
        if fix:
            todo = f"{fix_to_flags(fix)} is the value it asks for"
        elif re.search(r"per_partition|per[ -](?:TP )?rank|per GPU", words):
            todo = ("a layer's size per GPU is the model's size ÷ tensor_parallel_size: another --tensor-parallel-size "
                    "(one that leaves that size a multiple), or a checkpoint quantized for this split, fixes it")
        elif flags:
            todo = f"change {' or '.join(flags[:2])} as vLLM's words say, or leave it unset for vLLM's default"
        elif opts:
            todo = ("the names are vLLM's own (fields of a JSON option such as --speculative-config or "
                    "--compilation-config, of the model's config, or a flag's internal name): change the setting they "
                    "stand for as vLLM's words say")
        else:
            todo = "change the option it names (or the model) as vLLM's words say"
        return (f"vLLM refused {what}: \"{words.rstrip('.')}\"{f' ({where})' if where else ''}. {todo[0].upper()}{todo[1:]}.",
                fix)
    return explain


def _config_rules() -> list[Rule]:
    # the phrases of config_invalid_value are case-sensitive ("Invalid", "Unknown" open vLLM's sentences)
    return [(kind, re.compile(f"({_EXC_LINE}).*?" + (f"(?:{phrase})" if kind == "config_invalid_value" else
                                                     f"(?i:{phrase})")),
             CONFIG_RANK + i, _r_config(kind, head)) for i, (kind, phrase, head) in enumerate(CONFIG_KINDS)]


def _fixed(text: str, fix: dict[str, Any] | None = None) -> Callable[[re.Match[str], _Ctx], tuple[str, dict[str, Any]]]:
    return lambda m, c: (text, dict(fix or {}))


_NCCL_FIX = {"env": {"NCCL_P2P_DISABLE": "1"}, "disable_custom_all_reduce": True}

#: (code, pattern, rank, explain+fix). Lower rank = more specific; wrappers rank 90+.
RULES: list[Rule] = [
    ("context_exceeds_kv_cache", re.compile(
        r"max seq len \(" + _N + r"\).*?\(" + _N + r" ?GiB KV cache is needed.*?available KV cache memory \("
        + _N + r" ?GiB\).*?estimated maximum model length is " + _N), 10, _r_kv_ctx),
    ("not_enough_free_vram", re.compile(
        r"Free memory on device (?:\S+ )?\(" + _N + r"/" + _N + r" ?GiB\) on startup is less than (?:desired GPU "
        r"memory utilization|the engine's budget after excluding external process's weights) \(" + _N), 10, _r_free),
    ("not_enough_node_memory", re.compile(
        r"Available memory on node (\d+) \(" + _N + r"/" + _N + r" ?GiB\) on startup is less than desired CPU "
        r"memory utilization \(" + _N), 10, _r_node_startup),
    ("no_kv_cache_memory", re.compile(  # the utilization's budget is smaller than the process itself
        r"Available memory on node (\d+) \(" + _N + r"/" + _N + r" ?GiB\) on kv cache allocation is less than "
        r"requested memory for kv \((-[0-9][0-9,]*(?:\.[0-9]+)?|0(?:\.0+)?)/" + _N + r" ?GiB\)"), 10, _r_node_kv),
    ("not_enough_node_memory", re.compile(
        r"Available memory on node (\d+) \(" + _N + r"/" + _N + r" ?GiB\) on kv cache allocation is less than "
        r"requested memory for kv \(" + _SIGNED + r"(?:/" + _N + r")? ?GiB\)"), 10, _r_node_kv),
    ("sampler_warmup_oom", re.compile(r"out of memory occurred when warming up sampler with " + _N), 10, _r_sampler),
    ("tp_not_divisor_of_heads", re.compile(
        r"Total number of attention heads \((\d+)\) must be divisible by tensor parallel size \((\d+)\)"), 10, _r_heads),
    ("not_enough_gpus", re.compile(r"World size \((\d+)\) is larger than the number of available GPUs \((\d+)\)"),
     10, _r_world),
    # vllm/v1/worker/gpu_worker.py init_device (0.32.0): a data parallel rank past the visible GPUs
    ("not_enough_gpus", re.compile(r"DP adjusted local rank (\d+) is out of bounds for (\d+) devices"), 10,
     _r_dp_rank),
    ("quantization_unsupported_by_gpu", re.compile(
        r"quantization method (\S+(?: \+ \S+)?) is not supported for the current GPU\. Minimum capability: (\d+)\. "
        r"Current capability: (-?\d+)"), 10, _r_quant_cc),
    ("quantization_unsupported_by_gpu", re.compile(
        r"Quantization scheme is not supported for (?:['\"], ['\"])?the current GPU\. (Min|Required) capability: "
        r"(?:['\"], ['\"])?(\d+)\. (?:['\"], ['\"])?Current capability: (-?\d+)"), 10, _r_scheme_cc),
    ("quantization_unsupported_by_gpu", re.compile(r"No compressed-tensors compatible scheme was found"), 12, _fixed(
        "this vLLM has no compressed-tensors scheme for the checkpoint's layout on this GPU: W4A8 with FP8 "
        "activations runs only on compute capability 9.0 (Hopper), and other layouts are not supported by this "
        "version. Use a checkpoint in another scheme (W4A16, W8A8) or a Hopper card.")),
    ("quantization_unsupported_by_gpu", re.compile(
        r"(\w+) requires capability (\d+), current compute\s+capability is (-?\d+)"), 11, _r_kernel_cc),
    ("quantization_unsupported_by_gpu", re.compile(
        r"Failed to find a kernel that can implement the (\w+) linear layer"), 12, _r_kernel_none),
    ("quantization_unsupported_by_gpu", re.compile(
        r"Marlin does not support weight_bits = (\S+)\. Only types = \[\] are supported \(for group_size = -?\d+, "
        r"device_capability = (-?\d+)"), 10, _r_marlin_cc),
    ("quantization_unsupported_by_gpu", re.compile(
        r"torchao FP8 activation quantization config '([^']*)' requires GPU compute capability >= (\d+\.\d+)"
        r"(?:.*?current GPU compute capability: (\d+\.\d+))?"), 10, _fixed(
        "this torchao config computes in FP8, which needs compute capability 8.9 (Ada Lovelace, Hopper); use a "
        "weight-only torchao config (Int8WeightOnlyConfig, Int4WeightOnlyConfig) or a newer card.")),
    ("quantization_unsupported_by_gpu", re.compile(
        r"FP8 PTPC online quant requires a kernel that honors per-token activation quantization"), 10, _fixed(
        "per-token FP8 online quantization needs FP8 compute (compute capability 8.9, Cutlass FP8); on this card "
        "only the weight-only FP8 Marlin kernel runs. Use --quantization fp8_per_tensor or a newer card.",
        {"quantization": "fp8_per_tensor"})),
    ("quantization_unsupported_by_gpu", re.compile(
        r"nvfp4_per_token online quantization requires a Blackwell \(SM100\) GPU"), 10, _fixed(
        "NVFP4 online quantization runs only on Blackwell (compute capability 10.x); use --quantization "
        "fp8_per_tensor (from 7.5) or a Blackwell card.", {"quantization": "fp8_per_tensor"})),
    ("quantization_unsupported_by_gpu", re.compile(r"ptpc_fp8 quantization is supported only on ROCm"), 10, _fixed(
        "ptpc_fp8 runs on AMD (ROCm) only; on an NVIDIA card quantize the 16-bit checkpoint with --quantization fp8.",
        {"quantization": "fp8"})),
    ("quantization_unsupported_by_gpu", re.compile(r"([\w-]+) quantization is currently not supported in (\w+)"),
     10, _r_platform_quant),
    ("quantization_mismatch", re.compile(
        r"Quantization method specified in the model config \(([^)]*)\) does not match the quantization method "
        r"specified in the `quantization` argument \(([^)]*)\)"), 10, _r_quant_mismatch),
    ("quantization_mismatch", re.compile(r"Cannot find the config file for ([\w-]+)"), 10, _r_quant_no_config),
    ("dtype_unsupported_by_gpu", re.compile(r"Bfloat16 is only supported on GPUs with compute capability"), 10, _r_bf16),
    ("dtype_unsupported_by_quantization", re.compile(r"torch\.bfloat16 is not supported for quantization method (\w+)"),
     10, _r_awq_bf16),
    ("max_model_len_exceeds_model", re.compile(
        r"User-specified max_model_len \(" + _N + r"\) is greater than the derived max_model_len \(\w+=" + _N),
     10, _r_maxlen),
    ("batched_tokens_below_num_seqs", re.compile(
        r"max_num_batched_tokens \((\d+)\) must be greater than or equal to max_num_seqs \((\d+)\)"), 10, _r_batched),
    # vllm/config/scheduler.py:335–342 (0.32.0; --max-num-active-seqs, 0.31+)
    ("active_seqs_above_num_seqs", re.compile(
        r"max_num_active_seqs \((\d+)\) cannot be greater than max_num_seqs \((\d+)\)"), 10, _r_active),
    # vllm/config/scheduler.py SchedulerConfig.verify_max_model_len (0.32.0): chunked prefill off
    ("batched_tokens_below_max_model_len", re.compile(
        r"max_num_batched_tokens \((\d+)\) is smaller than max_model_len \((\d+)\)"), 10,
     lambda m, c: (f"with chunked prefill off a prompt is prefilled in one step, and max_num_batched_tokens "
                   f"{m.group(1)} is below max_model_len {m.group(2)}: raise max_num_batched_tokens to {m.group(2)} "
                   f"(or lower max_model_len, or leave chunked prefill on).",
                   {"max_num_batched_tokens": int(m.group(2))})),
    # triton/language/core.py (3.9.0): an FP8 E4M3 KV cache below compute capability 8.9 (app.planner.checks.FP8_E4M3_KV)
    ("kv_cache_dtype_unsupported_by_gpu", re.compile(r"type fp8e4nv not supported in this architecture"), 10,
     _fixed("the FP8 E4M3 KV cache (--kv-cache-dtype fp8 / fp8_e4m3) needs compute capability 8.9 for vLLM's "
            "Triton attention kernels; fp8_e5m2 is also one byte per value and compiles on this card.",
            {"kv_cache_dtype": "fp8_e5m2"})),
    ("quantization_unknown", re.compile(r"Unknown quantization method: ([\w-]+)"), 10, _r_unknown_quant),
    ("option_not_accepted", re.compile(r"unrecognized arguments: (.*)$"), 10, _r_unrecognized),
    # vllm/config/speculative.py SpeculativeConfig.__post_init__ (0.32/0.33; the same sentences in 0.10/0.11's
    # vllm/config.py), inside pydantic's "Value error, …" of SpeculativeConfig
    ("speculative_draft_missing", re.compile(r"num_speculative_tokens was provided but without speculative model"),
     10, _fixed(
        "the --speculative-config method needs a draft model (eagle, eagle3, medusa, draft_model …) and none was "
        "given: add \"model\" (the EAGLE head or the smaller model, a directory or Hugging Face id) to the "
        "speculative config, or use \"method\": \"ngram\", which needs no draft.")),
    ("speculative_tokens_missing", re.compile(
        r"A speculative model was provided, but `?num_speculative_tokens`? was not provided"), 10, _fixed(
        "the --speculative-config has a draft model but no num_speculative_tokens, and the draft's config gives "
        "none: add \"num_speculative_tokens\" (draft tokens per step, e.g. 3).")),
    ("speculative_ngram_lookup", re.compile(
        r"prompt_lookup_min=(\d+) must be <= prompt_lookup_max=(\d+)|Either prompt_lookup_max or "
        r"prompt_lookup_min must be provided when using the ngram method"), 10, _fixed(
        "the ngram proposer's n-gram window is invalid: in --speculative-config set prompt_lookup_min ≤ "
        "prompt_lookup_max (n-gram lengths in tokens, e.g. \"prompt_lookup_max\": 3).")),
    ("speculative_method_unknown", re.compile(r"Input should be 'ngram', 'medusa'"), 10, _fixed(
        "the --speculative-config method is not one this vLLM knows (it lists the ones it takes above): use e.g. "
        "\"ngram\" (no draft model), \"eagle\"/\"eagle3\" with an EAGLE head in \"model\", or \"draft_model\" "
        "with a smaller model of the same tokenizer.")),
    # environment and I/O (issue 36 item 5): each wording cited in tests/unit/test_diagnose_env.py
    ("trust_remote_code_needed", re.compile(
        r"consider setting `trust_remote_code=True`|contains custom code which must be executed|"
        r"references custom code contained in|requires you to execute the (?:configuration|tokenizer) file"), 10,
     _r_remote_code),
    ("tokenizer_load_failed", re.compile(
        r"Can't load tokenizer for '(?P<name>[^']*)'|(?P<conv>Couldn't instantiate the backend tokenizer|requires "
        r"the SentencePiece library but it was not found)"), 11, _r_tokenizer),
    ("disk_full", re.compile(r"\[Errno 28\] No space left on device(?:: '(?P<path>[^']*)')?"), 10, _r_disk_full),
    ("disk_full", _HF_DISK, 50, _r_disk_full),
    ("permission_denied", re.compile(r"\[Errno 13\] Permission denied: '([^']*)'"), 20, _r_denied),
    ("no_c_compiler", re.compile(r"No working C\+\+ compiler found|InvalidCxxCompiler|Failed to find C compiler\. "
                                 r"Please specify via CC environment"), 10, _r_compiler),
    ("gguf_model", re.compile(r"(?:Invalid repository ID or local directory specified: |the config file at )"
                              r"'([^']*\.gguf)'"), 12, _r_gguf),
    ("concurrent_launch", re.compile(
        r"Error in memory profiling\. Initial free memory " + _N + r" ?GiB, current free memory " + _N), 10,
     _r_profile_race),
    ("shm_too_small", re.compile(r"Error while creating shared memory segment /dev/shm"), 10, _fixed(
        "/dev/shm is too small for NCCL (usual in containers): run the container with --ipc=host or a larger "
        "--shm-size.")),
    ("port_in_use", re.compile(r"Address already in use"), 20, _fixed(
        "the port is taken by another program: launch on another port (vLLM Dyno picks a free one).")),
    ("attention_unsupported", re.compile(r"Unsupported CPU attention configuration: (head_dim=\d+)"), 10,
     _r_attention),
    # vllm/platforms/cuda.py get_attn_backend_cls and vllm/platforms/interface.py / cpu.py (0.32.0): no
    # attention backend (or MLA prefill backend) takes the model's attention on this device
    ("attention_unsupported", re.compile(r"Selected backend (\S+) is not valid for this configuration\. Reason: (.*)"),
     10, lambda m, c: (f"the attention backend chosen with --attention-backend ({m.group(1)}) cannot run this model "
                       f"here ({m.group(2).strip()}): drop --attention-backend and vLLM picks one that can.",
                       {"attention_backend": None})),
    ("attention_unsupported", re.compile(r"No valid (?:attention|(?:CPU )?MLA prefill) backend found(?: for (\S+))?"),
     10, _fixed("no attention backend of this vLLM runs this model's attention on this device (vLLM lists each "
                "backend's reason: head size, dtype, KV cache dtype, block size or compute capability): change what "
                "the reasons name (--kv-cache-dtype auto, --block-size, --dtype) or use a card or vLLM build that has "
                "such a backend.")),
    # vllm/model_executor/model_loader/default_loader.py and weight_utils.py (0.32.0): a directory without the
    # weights, or an index that names files that are not there (a download that stopped)
    ("model_weights_missing", re.compile(r"Cannot find any model weights with `([^`]*)`|Weight files referenced in "
                                         r"index but missing: (.*)"), 10, _fixed(
        "the model directory lacks its weight files (*.safetensors, or *.bin): the download stopped or only the "
        "config was copied. Download the whole repository again (huggingface-cli download ID --local-dir DIR) or "
        "point --model at a complete copy; with --load-format, give the format its files are in.")),
    # an optional package a feature or a checkpoint format needs (vllm/config/speculative.py, the torchao, quark
    # MX and INC quantization methods, 0.32.0: "… is required …  pip install X", "Please install X via `pip install
    # X`", "Failed to import X")
    ("package_missing", re.compile(r"^(?:ERROR )?(?:[\w.]+\.)?(?:ImportError|ModuleNotFoundError): .*?(?:pip install "
                                   r"([\w.\-\[\]]+(?:[<>=]=?[\w.]+)?)|Failed to import (\w+))"), 20,
     lambda m, c: (f"vLLM needs the Python package {m.group(1) or m.group(2)} for this feature or checkpoint format "
                   f"and it is not installed in vLLM's environment: install it there (pip install "
                   f"{m.group(1) or m.group(2)}), or serve without the option or checkpoint that needs it.", {})),
    # vllm/platforms/interface.py and cuda.py (0.32.0): CUDA_VISIBLE_DEVICES / --device-ids name a GPU the
    # driver does not show
    ("gpus_not_visible", re.compile(r"Physical device \S+ for logical device \S+ is not visible in (\w+)=|NVML "
                                    r"returned no GPU PCI bus ID rows|Failed to infer device type"), 10, _fixed(
        "a GPU vLLM was told to use is not visible to the driver: CUDA_VISIBLE_DEVICES (or --device-ids) names a "
        "device that is not there, or NVML sees none (a container without the GPUs: --gpus all). `nvidia-smi -L` "
        "lists the devices this process sees.")),
    ("model_not_found", re.compile(
        r"(Repository Not Found|is not a local folder and is not a valid model identifier|"
        r"does not appear to have a file named config\.json|Invalid repository ID or local directory)"), 15, _fixed(
        "the model was not found: check the path or id (offline mode needs the model in the local cache).")),
    ("model_gated", re.compile(r"(gated repo|Access to model .* is restricted)"), 15, _fixed(
        "the model is gated on the Hugging Face Hub: accept its licence and set HF_TOKEN.")),
    ("no_kv_cache_memory", re.compile(r"No available memory for the cache blocks|Cannot auto-fit max_model_len: not "
                                      r"enough GPU memory"), 12, _r_no_kv),
    ("cuda_oom", re.compile(r"(torch\.(?:cuda\.)?OutOfMemoryError|CUDA out of memory|CUDA error: out of memory)"),
     40, _r_oom),
    # config refusals by kind (the generic rules above: CONFIG_KINDS)
    *_config_rules(),
    ("invalid_config", re.compile(r"^(?:[\w.]*ValidationError: )?(\d+) validation errors? for (\w*Config)\s*$"), 60,
     _r_invalid_config),
    ("engine_dead", re.compile(r"(EngineDeadError|EngineCore encountered an issue|Engine core proc \S+ died "
                               r"unexpectedly|Engine core process \S+ died unexpectedly|engine core exited "
                               r"unexpectedly)"), 95, _fixed(
        "the engine process died; no root cause was found in the log shown — look further up for the first "
        "traceback.")),
    ("engine_init_failed", re.compile(r"Engine core initialization failed"), 96, _fixed(
        "the engine failed to start; no root cause was found in the log shown — look further up for the first "
        "error.")),
]

_NONDEFAULT = re.compile(r"non-default args: (\{.*\})\s*$")
_NCCL = re.compile(r"vLLM is using nccl==")
#: uvicorn's line once the API server serves (``/health`` answers 200 from then on)
_READY = re.compile(r"Application startup complete\.")
#: the engine died while serving, in every wording of vLLM 0.10–0.33: the engine's own
#: ``EngineCore encountered a fatal error.`` (vllm/v1/engine/core.py), the
#: ``EngineDeadError`` and its message (vllm/v1/engine/exceptions.py), the client's monitor
#: (core_client.py: ``Engine core proc EngineCore_DP0 died unexpectedly, shutting down
#: client.`` in 0.10.2/0.11, ``[shutdown] MPClient: engine core exited unexpectedly;
#: starting cleanup`` in 0.32/0.33), ``Engine core process … died unexpectedly.``
#: (vllm/v1/utils.py, 0.32/0.33) and the executor's ``Worker proc … died unexpectedly``
#: (vllm/v1/executor/multiproc_executor.py)
_DEATH = re.compile(r"EngineCore encountered a fatal error|EngineDeadError|EngineCore encountered an issue|"
                    r"Engine core proc \S+ died unexpectedly|engine core exited unexpectedly|"
                    r"Engine core process \S+ died unexpectedly|Worker proc \S+ died unexpectedly|"
                    r"RayWorkerProc rank=\S+ died unexpectedly")
#: a traceback of the engine's own failure follows these lines (vllm/v1/engine/core.py
#: ``logger.exception``; a worker's: vllm/v1/executor/multiproc_executor.py)
_FATAL = re.compile(r"^(?:EngineCore encountered a fatal error\.|EngineCore failed to start\.|"
                    r"WorkerProc hit an exception\.)")
#: an exception line of a Python traceback: ``RuntimeError: CUDA error: …``
_EXC = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception)(?::|$)")
_DEAD_EXC = re.compile(r"EngineDeadError|EngineGenerateError")
#: the wrapper or death line shown after a cause
_WRAPPER = re.compile(r"Engine core initialization failed|EngineDeadError|died unexpectedly|exited unexpectedly")


def _context(lines: list[str]) -> _Ctx:
    args: dict[str, Any] = {}
    for l in lines:
        m = _NONDEFAULT.search(l)
        if m:
            try:
                v = ast.literal_eval(m.group(1))
                if isinstance(v, dict):
                    args = v
            except (ValueError, SyntaxError):
                pass
    parser = LogParser()
    for l in lines:
        if parser.facts.version is not None:
            break
        parser.feed(l)
    return _Ctx(args, parser.facts.version)


def _match(msg: str) -> tuple[int, str, re.Match[str], Callable] | None:
    """The most specific rule (lowest rank; ties: the first listed) matching one message;
    pydantic's ``[type=…]`` tail is not part of vLLM's message."""
    text = _PYD_TAIL.sub("", msg)
    hit = None
    for code, rx, rank, fn in RULES:
        m = rx.search(text)
        if m and (hit is None or rank < hit[0]):
            hit = (rank, code, m, fn)
    if hit is not None and CONFIG_RANK <= hit[0] < CONFIG_RANK + len(CONFIG_KINDS):
        # the generic config kinds order the phrases of one line; between lines they rank alike, so the
        # latest refusal is the cause (an earlier one was caught and logged)
        hit = (CONFIG_RANK,) + hit[1:]
    return hit


def _runtime_cause(lines: list[str], msgs: list[str], start: int) -> int | None:
    """Index of the root-cause line of the engine's failure at or after ``start``: the
    first exception line of the traceback vLLM logs after ``EngineCore encountered a fatal
    error.`` (or ``EngineCore failed to start.``, a worker's ``WorkerProc hit an
    exception.``), read in that process's lines only; Python prints a chain's first cause
    first. Not the ``EngineDeadError`` it turns into."""
    for k in range(start, len(msgs)):
        if not _FATAL.match(msgs[k]):
            continue
        proc = _PREFIX.match(lines[k]).group(1)
        for j in range(k + 1, min(len(msgs), k + 400)):
            if proc is not None and _PREFIX.match(lines[j]).group(1) != proc:
                continue
            if _EXC.match(msgs[j]) and not _DEAD_EXC.search(msgs[j]):
                return j
    return None


def diagnose(lines: list[str], silent_for_s: float | None = None,
             after_ready: bool | None = None, *, killed_by: int | None = None, pids: Iterable[int] = (),
             kernel_log: "Callable[[], list[str]] | None" = None) -> Diagnosis | None:
    """Diagnose a vLLM log (lines in order; ANSI colours allowed). ``silent_for_s``:
    how long the server has printed nothing after the last line (a live supervisor
    measures it; for a saved log it is given). ``after_ready``: the server had been
    ready when it failed (the supervisor knows); None = read it from the log (an engine
    death after ``Application startup complete.``). ``killed_by``: the signal that ended
    the server's process (the reaper reports it), then the problem is ``server_killed``
    whatever the log says; ``pids``: the server's processes, whose out-of-memory kill the
    kernel's log (``kernel_log``: a callable returning its lines, raising OSError when it
    cannot be read; default :func:`read_kernel_log`) may record. Returns the most
    specific problem found (ties: the latest line), or None when nothing known is in the
    log — never None after ready: an engine death is a problem even when its cause is
    not in the log."""
    if killed_by is not None:
        return killed_diagnosis(killed_by, pids, kernel_log, after_ready=bool(after_ready))
    clean = [strip_ansi(l) for l in lines if l is not None]
    msgs = [_message(l) for l in clean]
    ctx = _context(clean)
    ctx.lines, ctx.raw = msgs, clean
    ready_at = max((i for i, m in enumerate(msgs) if _READY.search(m)), default=-1)
    died = any(_DEATH.search(m) for m in msgs[ready_at + 1:]) if ready_at >= 0 else False
    post = after_ready if after_ready is not None else died
    start = ready_at + 1 if post else 0  # after ready, the cause comes after the ready line
    best: tuple[int, int, str, re.Match[str], Callable] | None = None
    for i in range(start, len(msgs)):
        hit = _match(msgs[i])
        if hit is not None:
            rank, code, m, fn = hit
            if best is None or rank < best[0] or (rank == best[0] and i > best[1]):
                best = (rank, i, code, m, fn)
    if post:
        return _after_ready(clean, msgs, ctx, best, start)
    if best is not None and best[0] < 90:
        return _made(clean, msgs, ctx, best)
    # NCCL hang: nothing after "vLLM is using nccl" for a long time
    nonblank = [l for l in clean if l.strip()]
    if silent_for_s is not None and silent_for_s >= NCCL_SILENCE_S and nonblank and _NCCL.search(nonblank[-1]):
        ev = [l for l in nonblank if _NCCL.search(l)][-4:]
        return Diagnosis("nccl_hang",
                         f"the server printed nothing for {silent_for_s:.0f} s after NCCL started: the usual NCCL "
                         f"peer-to-peer hang (IOMMU/ACS, consumer cards). Disable P2P and vLLM's custom all-reduce.",
                         dict(_NCCL_FIX), ev)
    if best is not None:  # only a wrapper: the first exception line of the engine's traceback, if any
        cause = _runtime_cause(clean, msgs, 0)
        if cause is not None:
            what = "failed to start" if best[2] == "engine_init_failed" else "died"
            return Diagnosis(best[2], f"the engine {what}: {msgs[cause].strip()} (no rule knows this error; the "
                                      f"traceback above it shows where).", {}, _evidence(clean, msgs, cause))
        return _made(clean, msgs, ctx, best)
    return None


def _made(clean: list[str], msgs: list[str], ctx: _Ctx, best: tuple) -> Diagnosis:
    rank, i, code, m, fn = best
    ctx.at = i
    said = fn(m, ctx)  # (explanation, fix) or (explanation, fix, code) where the figures decide the kind
    text, fix = said[0], said[1]
    return Diagnosis(said[2] if len(said) > 2 else code, text, fix, _evidence(clean, msgs, i))


def _after_ready(clean: list[str], msgs: list[str], ctx: _Ctx, best: tuple | None, start: int) -> Diagnosis:
    """The engine died after the server was ready: the cause a rule knows, else the first
    exception line of the engine's traceback, else the death itself."""
    if best is not None and best[0] < 90 and not CONFIG_RANK <= best[0] < CONFIG_RANK + len(CONFIG_KINDS):
        # (a configuration is refused at start-up: a config phrase after ready is not the cause)
        d = _made(clean, msgs, ctx, best)
        then = "launch again with the fix." if d.fix else "launch again once that is changed."
        d.explanation = (f"the server was ready, then the engine died on a request: {d.explanation} The server "
                         f"cannot serve any more: {then}")
        d.after_ready = True
        return d
    cause = _runtime_cause(clean, msgs, start)
    if cause is not None:
        said = msgs[cause].strip()
        # torch's CUDA errors say "For debugging consider passing CUDA_LAUNCH_BLOCKING=1"
        hint = (" Launch it with --enforce-eager to rule out CUDA graphs, or with CUDA_LAUNCH_BLOCKING=1 to find "
                "the failing kernel." if "CUDA" in said else "")
        return Diagnosis(
            "engine_runtime_error",
            f"the server was ready, then the engine died on a request: {said} The server cannot serve any more. "
            f"No rule knows this error: launch again; if the same request kills it again, this model does not run "
            f"with this vLLM build and these options.{hint}",
            {}, _evidence(clean, msgs, cause), after_ready=True)
    ev = [clean[i] for i in range(start, len(clean)) if _DEATH.search(msgs[i])][:2]
    return Diagnosis("engine_dead", "the server was ready, then its engine died; the log shown has no cause "
                                    "(look further up for the first traceback). The server cannot serve any more: "
                                    "stop it and launch again.", {}, ev, after_ready=True)


def _evidence(lines: list[str], msgs: list[str], i: int) -> list[str]:
    """The cause line; for a pydantic ValidationError (its header matched), every error's
    location line (a field's name) and first message line, then the header naming the
    class; for a message inside one, that line and the header; then a wrapper or death
    line after it, if any."""
    b = validation_block(msgs, i)
    if b is not None:
        own = ([j for e in b.errors for j in (e.loc_line, e.line) if j is not None] if _PYD_HEADER.match(msgs[i])
               else [i])
        ev = [lines[j] for j in own] + [lines[b.header]]
        after = b.end + 1
    else:
        ev, after = [lines[i]], i + 1
    for l in lines[after:]:
        if _WRAPPER.search(l):
            ev.append(l)
            break
    return ev


def diagnose_text(text: str, silent_for_s: float | None = None, after_ready: bool | None = None) -> Diagnosis | None:
    """:func:`diagnose` on a whole log text."""
    return diagnose(text.splitlines(), silent_for_s, after_ready)


# ---------------------------------------------------------------------- killed servers
#: the kernel's records of an out-of-memory kill (linux mm/oom_kill.c, ``__oom_kill_process``:
#: ``"%s: Killed process %d (%s) total-vm:%lukB, anon-rss:…"`` with "Out of memory" or "Memory
#: cgroup out of memory"; ``dump_oom_summary``: ``"oom-kill:constraint=…,task=%s,pid=%d,uid=%d"``)
_OOM_KILLED = re.compile(r"(Out of memory|Memory cgroup out of memory): Killed process (\d+) \(([^)]*)\)")
_OOM_SUMMARY = re.compile(r"oom-kill:.*\btask=([^,]*),pid=(\d+)")
#: the kernel log device (printk records, one per read(2); Documentation/ABI/testing/dev-kmsg)
KMSG = "/dev/kmsg"


def read_kernel_log(path: str = KMSG) -> list[str]:
    """The kernel's log as lines (the text of each record): read from ``path``
    (``/dev/kmsg``, without blocking) or, where that is not allowed
    (``kernel.dmesg_restrict``), from ``journalctl -k``. Raises OSError saying why when
    neither can be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        first = e
    else:
        out: list[str] = []
        try:
            while True:
                try:
                    rec = os.read(fd, 8192)
                except BlockingIOError:
                    break
                except OSError as e:
                    if e.errno == errno.EPIPE:  # a record was overwritten while reading: go on
                        continue
                    raise
                if not rec:
                    break
                text = rec.decode("utf-8", "replace")
                out.append(text.split(";", 1)[-1].split("\n", 1)[0])
        finally:
            os.close(fd)
        return out
    jc = shutil.which("journalctl")
    if jc:
        try:
            r = subprocess.run([jc, "-k", "-q", "--no-pager", "-o", "cat", "-n", "20000"], capture_output=True,
                               text=True, timeout=10)
            if r.returncode == 0 and r.stdout.strip():
                return r.stdout.splitlines()
        except (OSError, subprocess.SubprocessError):
            pass
    why = ("only root may read it here (kernel.dmesg_restrict = 1)" if first.errno in (errno.EPERM, errno.EACCES)
           else first.strerror or str(first))
    raise OSError(first.errno, f"the kernel's log ({path}, journalctl -k) cannot be read: {why}")


def oom_records(lines: Iterable[str], pids: Iterable[int]) -> list[str]:
    """The kernel's out-of-memory kill records (:data:`_OOM_KILLED`, :data:`_OOM_SUMMARY`)
    that name one of ``pids``, in log order."""
    want = {int(p) for p in pids}
    out = []
    for line in lines:
        m = _OOM_KILLED.search(line)
        pid = int(m.group(2)) if m else None
        if m is None:
            m2 = _OOM_SUMMARY.search(line)
            pid = int(m2.group(2)) if m2 else None
        if pid is not None and pid in want:
            out.append(line.strip())
    return out



def killed_diagnosis(sig: int, pids: Iterable[int] = (), kernel_log: "Callable[[], list[str]] | None" = None,
                     after_ready: bool = False) -> Diagnosis:
    """``server_killed``: the server's process was ended by signal ``sig`` from outside
    (its log has no cause: a line it printed before is not one). For SIGKILL the kernel's
    log (``kernel_log``, default :func:`read_kernel_log`) is searched for an
    out-of-memory kill of one of ``pids``; the evidence is that record, and the
    explanation says when the log holds none or cannot be read."""
    pids = sorted({int(p) for p in pids})
    when = " after it was ready" if after_ready else ""
    if sig != signal.SIGKILL:
        return Diagnosis("server_killed", f"the server was ended by signal {sig} ({signal_name(sig)}){when}, from "
                                          f"outside vLLM Dyno (a user, a service manager); launch it again.",
                         {}, [], after_ready)
    head = f"the server was killed (signal 9 — out of memory?){when}"
    try:
        records = oom_records((kernel_log or read_kernel_log)(), pids)
    except OSError as e:
        where = f"'Killed process {pids[0]}'" if pids else "'Out of memory: Killed process'"
        return Diagnosis("server_killed",
                         f"{head}: {e.strerror or e}. Look for {where} in `journalctl -k` or `sudo dmesg`; if it is "
                         "there, the machine ran out of memory.", {}, [], after_ready)
    if records:
        return Diagnosis("server_killed",
                         f"{head}: yes — the kernel's out-of-memory killer ended it ({records[-1]}). Free memory on "
                         "this machine, or make the server use less of it (on the CPU build a smaller "
                         "VLLM_CPU_KVCACHE_SPACE), then launch again.", {}, records, after_ready)
    return Diagnosis("server_killed",
                     f"{head}: the kernel's log has no out-of-memory record of its processes"
                     f"{' (pids ' + ', '.join(map(str, pids)) + ')' if pids else ''}, so something else sent "
                     "SIGKILL (a user, a service manager, a container limit); launch it again.", {}, [], after_ready)


def undiagnosed_note(reason: str, diagnosis: "Diagnosis | None") -> str:
    """What a failure banner says under a failure without a diagnosis: "No known cause
    found in the log" only for a server process that ended by itself (its reason opens
    with one of :data:`app.server.supervisor.EXIT_REASONS`: the cause would be in its log);
    any other failure (a bad input refused before anything started, a lost host, leftover
    processes) names its cause itself — its lines after the first, or nothing more (issue
    37: the banner said "No known cause" right under an exact cause). Empty with a
    diagnosis."""
    if diagnosis is not None:
        return ""
    first, _, rest = (reason or "").strip().partition("\n")
    if first.startswith(EXIT_REASONS):
        return "No known cause found in the log; see the Log tab."
    return rest.strip()
