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
The rules match vLLM's message inside it; an error no rule knows is ``invalid_config``
with vLLM's own words as the cause.

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

NCCL_SILENCE_S = 300.0
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
    at: int = 0  # index of the line the rule matched

    def get(self, *names: str, default: Any = None) -> Any:
        for n in names:
            if n in self.args:
                return self.args[n]
        return default


Rule = tuple[str, re.Pattern[str], int, Callable[[re.Match[str], _Ctx], tuple[str, dict[str, Any]]]]


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


def _r_no_kv(m: re.Match[str], c: _Ctx) -> tuple[str, dict[str, Any]]:
    u = c.get("gpu_memory_utilization")
    fix = {"gpu_memory_utilization": min(0.95, round(float(u) + 0.03, 2))} if u and float(u) < 0.95 else {}
    return ("weights and activations take the whole memory budget, nothing is left for the KV cache: raise "
            "gpu_memory_utilization, quantize, or spread the model over more GPUs.", fix)


def _r_oom(m: re.Match[str], c: _Ctx) -> tuple[str, dict[str, Any]]:
    u = float(c.get("gpu_memory_utilization", default=0.92) or 0.92)
    return ("the GPU ran out of memory while loading, profiling or capturing CUDA graphs: lower "
            "gpu_memory_utilization (CUDA graphs live outside it), or --enforce-eager, quantize or use more GPUs.",
            {"gpu_memory_utilization": round(max(0.5, u - 0.05), 2)})


def _r_graph_oom(m: re.Match[str], c: _Ctx) -> tuple[str, dict[str, Any]]:
    return ("the GPU ran out of memory while capturing CUDA graphs, which live outside gpu_memory_utilization.",
            {"enforce_eager": True})


def _r_maxlen(m: re.Match[str], c: _Ctx) -> tuple[str, dict[str, Any]]:
    return (f"max_model_len {int(_num(m.group(1))):,} is longer than the model allows ({int(_num(m.group(2))):,}).",
            {"max_model_len": int(_num(m.group(2)))})


def _r_batched(m: re.Match[str], c: _Ctx) -> tuple[str, dict[str, Any]]:
    return ("max_num_batched_tokens must be at least max_num_seqs.", {"max_num_batched_tokens": int(_num(m.group(2)))})


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
    ("shm_too_small", re.compile(r"Error while creating shared memory segment /dev/shm"), 10, _fixed(
        "/dev/shm is too small for NCCL (usual in containers): run the container with --ipc=host or a larger "
        "--shm-size.")),
    ("port_in_use", re.compile(r"Address already in use"), 20, _fixed(
        "the port is taken by another program: launch on another port (vLLM Dyno picks a free one).")),
    ("attention_unsupported", re.compile(r"Unsupported CPU attention configuration: (head_dim=\d+)"), 10,
     _r_attention),
    ("model_not_found", re.compile(
        r"(Repository Not Found|is not a local folder and is not a valid model identifier|"
        r"does not appear to have a file named config\.json|Invalid repository ID or local directory)"), 15, _fixed(
        "the model was not found: check the path or id (offline mode needs the model in the local cache).")),
    ("model_gated", re.compile(r"(gated repo|Access to model .* is restricted)"), 15, _fixed(
        "the model is gated on the Hugging Face Hub: accept its licence and set HF_TOKEN.")),
    ("no_kv_cache_memory", re.compile(r"No available memory for the cache blocks"), 12, _r_no_kv),
    ("cuda_graph_oom_risk", re.compile(r"CUDA out of memory.*(?:graph|Graph)|(?:capturing|Capturing) CUDA graph.*out of memory"),
     30, _r_graph_oom),
    ("cuda_oom", re.compile(r"(torch\.(?:cuda\.)?OutOfMemoryError|CUDA out of memory|CUDA error: out of memory)"),
     40, _r_oom),
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
    ctx.lines = msgs
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
    text, fix = fn(m, ctx)
    return Diagnosis(code, text, fix, _evidence(clean, msgs, i))


def _after_ready(clean: list[str], msgs: list[str], ctx: _Ctx, best: tuple | None, start: int) -> Diagnosis:
    """The engine died after the server was ready: the cause a rule knows, else the first
    exception line of the engine's traceback, else the death itself."""
    if best is not None and best[0] < 90:
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
