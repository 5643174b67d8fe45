"""Parse vLLM's startup and stats log lines (vLLM 0.10 → 0.33 formats).

Lines look like ``(APIServer pid=N) INFO 01-28 21:40:02 [file.py:L] message``; 0.10.x
colours the prefix with ANSI escapes, stripped first. Numbers may carry thousands
separators. Source of the patterns: docs/vllm-facts.md, "Startup log lines".
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Any

ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_NUM = r"([0-9][0-9,]*(?:\.[0-9]+)?)"


def strip_ansi(line: str) -> str:
    """Remove ANSI colour/cursor escapes and trailing newline/carriage return."""
    return ANSI_RE.sub("", line).rstrip("\r\n")


def _f(s: str) -> float:
    return float(s.replace(",", ""))


@dataclass
class EngineStats:
    """One periodic ``Engine 000: Avg prompt throughput …`` line (tokens/s, counts, %)."""

    engine: int
    prompt_tps: float
    generation_tps: float
    running: int
    waiting: int
    kv_cache_usage_pct: float | None
    prefix_cache_hit_pct: float | None


@dataclass
class CapacityFacts:
    """What the server said about itself while starting. Units in the field names."""

    version: str | None = None
    non_default_args: dict[str, Any] | None = None
    model_loading_gib: float | None = None
    model_loading_s: float | None = None
    available_kv_cache_gib: float | None = None
    kv_cache_tokens: int | None = None
    kv_cache_device: str | None = None  # "GPU" or "CPU"
    max_concurrency: float | None = None
    max_concurrency_tokens_per_request: int | None = None
    cuda_graph_gib: float | None = None
    cuda_graph_s: float | None = None
    engine_init_s: float | None = None
    ready: bool = False
    last_stats: EngineStats | None = None
    stats_lines: int = 0
    #: the launch phase the log has reached (a key of :data:`LAUNCH_PHASES`), or None
    phase: str | None = None
    #: phase key → the ``t`` of the line that began it (the caller's clock, seconds)
    phase_times: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["last_stats"] = None if self.last_stats is None else dict(self.last_stats.__dict__)
        return d


_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("version", re.compile(r"vLLM (?:API )?server version:? ?v?([0-9][\w.+-]*)")),
    ("version", re.compile(r"Initializing a V\d LLM engine \(v([0-9][\w.+-]*)\)")),
    ("non_default", re.compile(r"non-default args: (\{.*\})\s*$")),
    ("loading", re.compile(r"Model loading took " + _NUM + r" ?GiB(?: memory)? and " + _NUM + r" ?s")),
    ("kv_mem", re.compile(r"Available KV cache memory: " + _NUM + r" ?GiB")),
    ("kv_tokens", re.compile(r"\b(GPU|CPU) KV cache size: " + _NUM + r" tokens")),
    ("max_conc", re.compile(r"Maximum concurrency for " + _NUM + r" tokens per request: " + _NUM + r"x")),
    ("graphs", re.compile(r"Graph capturing finished in " + _NUM + r" secs?, took (-?[0-9.]+) GiB")),
    ("init", re.compile(r"init engine \(profile, create kv cache, warmup model\) took " + _NUM + r" s")),
    ("ready", re.compile(r"Application startup complete\.")),
    (
        "stats",
        re.compile(
            r"(?:Engine (\d+): )?Avg prompt throughput: " + _NUM + r" tokens/s, "
            r"Avg generation throughput: " + _NUM + r" tokens/s, Running: (\d+) reqs?,"
            r"(?: Swapped: \d+ reqs?,)? Waiting: (\d+) reqs?"
            r"(?:, (?:GPU |CPU )?KV cache usage: " + _NUM + r"%)?"
            r"(?:, Prefix cache hit rate: " + _NUM + r"%)?"
        ),
    ),
]


#: The phases of a launch, in order: (key, what the server is doing, the lines that begin
#: it). Each pattern is a log line vLLM prints when it enters the phase (vLLM 0.32.0 file
#: given; the same wording since 0.10 unless noted); a later phase's line also ends the
#: earlier ones (a phase a version does not print is skipped, never waited for).
LAUNCH_PHASES: tuple[tuple[str, str, tuple[re.Pattern[str], ...]], ...] = (
    # v1/engine/core.py: "Initializing a V1 LLM engine (v%s) with config: %s"
    ("engine", "starting the engine", (re.compile(r"Initializing a V\d LLM engine"),)),
    # v1/worker/gpu_model_runner.py, v1/worker/cpu_model_runner.py: "Starting to load model %s..."
    ("weights", "loading weights", (re.compile(r"Starting to load model\b"),)),
    # gpu_model_runner.py "Model loading took %s GiB memory and %.6f seconds" ends the load;
    # then torch.compile (compilation/backends.py "Dynamo bytecode transform time",
    # "Compiling a graph for …", "Directly load the compiled graph(s)…"; compilation/
    # monitor.py "torch.compile took %.2f s in total") inside the memory profile run
    # (utils/mem_utils.py "Memory profiling takes %.2f seconds", 0.10/0.11)
    # — and on the CPU build cpu_model_runner.py "Warming up model for the compilation...",
    # printed before its KV cache is sized (it compiles there; it captures no CUDA graphs)
    ("profile", "compiling and profiling memory",
     (re.compile(r"Model loading took "), re.compile(r"Dynamo bytecode transform time"),
      re.compile(r"Compiling a graph for "), re.compile(r"Directly load the compiled graph"),
      re.compile(r"torch\.compile t(?:ook|akes) "), re.compile(r"Memory profiling takes "),
      re.compile(r"Warming up model for the compilation"))),
    # v1/worker/gpu_worker.py "Available KV cache memory: %s GiB"; v1/core/kv_cache_utils.py
    # "GPU KV cache size: N tokens" ("CPU KV cache size" on the CPU build)
    ("kv_cache", "allocating the KV cache",
     (re.compile(r"Available KV cache memory: "), re.compile(r"\b(?:GPU|CPU) KV cache size: "))),
    # gpu_model_runner.py: tqdm "Capturing CUDA graphs (…)" (0.10: "Capturing CUDA graph
    # shapes"), after the KV cache is allocated
    ("graphs", "capturing CUDA graphs",
     (re.compile(r"Capturing CUDA graph"),)),
    # v1/engine/core.py "init engine (profile, create kv cache, warmup model) took …";
    # entrypoints/launchers/api_server/entry.py "Starting vLLM server on %s" (0.32;
    # "Starting vLLM API server %d on %s" in 0.10/0.11 entrypoints/openai/api_server.py)
    ("api", "starting the API server",
     (re.compile(r"init engine \(profile, create kv cache, warmup model\) took"),
      re.compile(r"Starting vLLM (?:API )?server\b"))),
    # uvicorn: "Application startup complete."
    ("ready", "ready", (re.compile(r"Application startup complete\."),)),
)
PHASE_KEYS = tuple(k for k, _, _ in LAUNCH_PHASES)
PHASE_LABELS = {k: label for k, label, _ in LAUNCH_PHASES}


class LogParser:
    """Feed lines one by one; :attr:`facts` accumulates. ``feed`` returns the kinds matched
    (e.g. ``["kv_tokens", "max_conc"]``) so callers can react (readiness, stats)."""

    def __init__(self) -> None:
        self.facts = CapacityFacts()

    def feed(self, raw: str, t: float | None = None) -> list[str]:
        """Parse one line; ``t`` (any clock, seconds) dates a launch phase it begins."""
        line = strip_ansi(raw)
        hits: list[str] = []
        f = self.facts
        if not f.ready:
            self._phase(line, t)
        for kind, rx in _PATTERNS:
            m = rx.search(line)
            if not m:
                continue
            if kind == "version" and f.version is None:
                f.version = m.group(1)
            elif kind == "non_default":
                try:
                    v = ast.literal_eval(m.group(1))
                    f.non_default_args = v if isinstance(v, dict) else None
                except (ValueError, SyntaxError):
                    f.non_default_args = None
            elif kind == "loading":
                f.model_loading_gib, f.model_loading_s = _f(m.group(1)), _f(m.group(2))
            elif kind == "kv_mem":
                f.available_kv_cache_gib = _f(m.group(1))
            elif kind == "kv_tokens":
                f.kv_cache_device, f.kv_cache_tokens = m.group(1), int(_f(m.group(2)))
            elif kind == "max_conc":
                f.max_concurrency_tokens_per_request = int(_f(m.group(1)))
                f.max_concurrency = _f(m.group(2))
            elif kind == "graphs":
                f.cuda_graph_s, f.cuda_graph_gib = _f(m.group(1)), float(m.group(2))
            elif kind == "init":
                f.engine_init_s = _f(m.group(1))
            elif kind == "ready":
                f.ready = True
            elif kind == "stats":
                f.last_stats = EngineStats(
                    engine=int(m.group(1) or 0),
                    prompt_tps=_f(m.group(2)),
                    generation_tps=_f(m.group(3)),
                    running=int(m.group(4)),
                    waiting=int(m.group(5)),
                    kv_cache_usage_pct=_f(m.group(6)) if m.group(6) else None,
                    prefix_cache_hit_pct=_f(m.group(7)) if m.group(7) else None,
                )
                f.stats_lines += 1
            hits.append(kind)
        return hits

    def _phase(self, line: str, t: float | None) -> None:
        f = self.facts
        at = -1 if f.phase is None else PHASE_KEYS.index(f.phase)
        for i in range(len(LAUNCH_PHASES) - 1, at, -1):  # the latest phase the line begins
            key, _, rxs = LAUNCH_PHASES[i]
            if any(rx.search(line) for rx in rxs):
                f.phase = key
                if t is not None:
                    f.phase_times.setdefault(key, t)
                return

    def feed_text(self, text: str) -> CapacityFacts:
        for line in text.splitlines():
            self.feed(line)
        return self.facts
