"""The library of real, published vLLM GPU measurements (issue 34, item 1):
``benchmarks/data/realgpu/<set-id>.yaml``, one file per published set of runs, read into
:class:`RealRunSet` by :func:`load_sets`.

A *set* is what one source published for one machine: the hardware (a card of
``data/gpus.yaml`` × count), the model (an id the built-in catalog ``data/models.yaml``
resolves, as ``vllm serve`` was given it), the vLLM version, the server's options under
``vllm serve``'s own names (``tensor_parallel_size``, ``max_num_seqs``,
``quantization``, ``kv_cache_dtype`` …: the flag without its dashes, ``-`` as ``_``),
the workload under ``vllm bench serve``'s own option names (``dataset_name``,
``random_input_len``, ``num_prompts``, ``request_rate``, ``max_concurrency`` …), and
its *points*: each a run with its overrides of those options and every figure the
source published, under the keys ``vllm bench serve --save-result`` writes
(:data:`MEASURED_KEYS`; times in ms, throughputs per second of the benchmark's wall
clock). What the source does not state goes to ``assumed`` with a range and the
reason; a measured value is never estimated. ``comparisons`` name the points a source
compares on one machine (a flag, a parallel layout) and the measured figure that
decides the winner (``per_gpu``: divided by the card count, where counts differ).

``role`` is ``fit`` (the performance model may be fitted to it) or ``validation``
(kept aside: never fitted). Two sources are kept aside by the project for its own
validation and appear in no file: GPUStack's performance-lab pages and the vLLM results
of MLPerf Inference v5.0's open division (:data:`FORBIDDEN_SOURCES`).

Errors: :class:`RealRunError` names the file and the field (``set.yaml: points[2].measured.mean_ttft_ms: …``).
"""
from __future__ import annotations

import datetime as _dt
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from app.fileio import YamlError, load_yaml

__all__ = ["FORBIDDEN_SOURCES", "MEASURED_KEYS", "BENCH_OPTIONS", "RealRunError", "RealRunSet", "Point",
           "Comparison", "Source", "Hardware", "Assumed", "load_set", "load_sets", "is_known_measured_key",
           "forbidden_reason", "DEFAULT_FOLDER"]

#: where the library lives, relative to a checkout's root
DEFAULT_FOLDER = Path("benchmarks") / "data" / "realgpu"

#: the keys of ``vllm bench serve --save-result`` (vllm/benchmarks/serve.py, 0.10–0.32; before it
#: benchmarks/benchmark_serving.py, whose ``input_throughput`` is kept) that a point may publish:
#: counts, ``duration`` (s), throughputs (requests/s, tokens/s); latencies
#: (ms) are matched by :data:`_LATENCY_KEY` (``mean_``/``median_``/``std_``/``pNN_`` of
#: ttft, tpot, itl, e2el)
MEASURED_KEYS = frozenset({
    "completed", "failed", "duration", "total_input_tokens", "total_output_tokens",
    "request_throughput", "request_goodput", "input_throughput", "output_throughput", "total_token_throughput",
    "max_output_tokens_per_s", "max_concurrent_requests",
})
_LATENCY_KEY = re.compile(r"(mean|median|std|p\d{1,2}(\.\d+)?)_(ttft|tpot|itl|e2el)_ms")

#: ``vllm bench serve`` options a set's ``bench`` may name (the flag without dashes, ``-`` as
#: ``_``; vllm/benchmarks/serve.py and datasets.py, 0.10–0.32). ``backend``/``endpoint_type``
#: and ``endpoint`` say which API was driven; ``ignore_eos`` that every request ran to its
#: output length
BENCH_OPTIONS = frozenset({
    "backend", "endpoint_type", "endpoint", "dataset_name", "dataset_path", "num_prompts", "request_rate",
    "burstiness", "max_concurrency", "seed", "ignore_eos", "temperature", "top_p", "top_k", "num_warmups",
    "random_input_len", "random_output_len", "random_range_ratio", "random_prefix_len", "random_batch_size",
    "sharegpt_output_len", "sonnet_input_len", "sonnet_output_len", "sonnet_prefix_len", "hf_subset",
    "hf_split", "hf_output_len", "custom_output_len", "prefix_repetition_prefix_len",
    "prefix_repetition_suffix_len", "prefix_repetition_num_prefixes", "prefix_repetition_output_len",
    "percentile_metrics", "metric_percentiles", "goodput", "tokenizer", "use_beam_search", "logprobs",
    "disable_shuffle", "multi_turn", "multi_turn_num_turns", "per_turn_input_len", "multi_turn_concurrency",
})

#: sources the project keeps aside for its own validation (issue 34): (what, substring of a
#: source's repo/path/url, lower case). A set naming any of them is refused.
FORBIDDEN_SOURCES: tuple[tuple[str, str], ...] = (
    ("GPUStack's performance-lab pages", "gpustack/gpustack"),
    ("GPUStack's performance-lab pages", "performance-lab"),
    ("GPUStack's performance-lab pages", "docs.gpustack.ai"),
    ("MLPerf Inference v5.0 (open division kept aside)", "inference_results_v5.0"),
    ("MLPerf Inference v5.0 (open division kept aside)", "inference-results-v5.0"),
    ("MLPerf Inference v5.0 (open division kept aside)", "mlperf-inference-v5-0"),
    ("MLPerf Inference v5.0 (open division kept aside)", "inference/v5.0"),
)

_SNAKE = re.compile(r"[a-z][a-z0-9_]*")
_HEX40 = re.compile(r"[0-9a-f]{40}")


def is_known_measured_key(key: str) -> bool:
    """Whether ``key`` is one ``vllm bench serve --save-result`` writes (see :data:`MEASURED_KEYS`)."""
    return key in MEASURED_KEYS or _LATENCY_KEY.fullmatch(key) is not None


def forbidden_reason(*texts: str | None) -> str | None:
    """The kept-aside source any of ``texts`` (a repo, path or URL) names, else None."""
    for text in texts:
        low = (text or "").lower()
        for what, needle in FORBIDDEN_SOURCES:
            if needle in low:
                return what
    return None


class RealRunError(ValueError):
    """A set file that does not load: ``file`` (its path), ``field`` (dotted path of the
    field, None for the whole file) and ``reason``. ``str()``: ``FILE: FIELD: REASON``."""

    def __init__(self, file: str | Path, field: str | None, reason: str) -> None:
        self.file, self.field, self.reason = str(file), field, reason
        super().__init__(f"{self.file}: " + (f"{field}: " if field else "") + reason)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Source(_Strict):
    """Where the figures were published. ``kind``: ``repo`` (``repo`` owner/name, ``path``,
    ``commit`` 40 hex digits), ``url`` (a web page, ``url``) or ``paper`` (``url`` and the
    title in ``where``); ``where``: the section, table or lines the numbers come from;
    ``retrieved``: when they were read."""

    kind: Literal["repo", "url", "paper"]
    repo: str | None = None
    path: str | None = None
    commit: str | None = None
    url: str | None = None
    where: str = Field(min_length=1)
    retrieved: _dt.date

    @field_validator("commit")
    @classmethod
    def _commit(cls, v: str | None) -> str | None:
        if v is not None and not _HEX40.fullmatch(v):
            raise ValueError(f"{v!r} is not a commit: give the 40 hex digits (lower case)")
        return v

    @model_validator(mode="after")
    def _complete(self) -> "Source":
        if self.kind == "repo":
            missing = [k for k in ("repo", "path", "commit") if not getattr(self, k)]
            if missing:
                raise ValueError(f"a repo source needs {', '.join(missing)}")
            if not re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", self.repo or ""):
                raise ValueError(f"repo {self.repo!r} is not owner/name")
        elif not self.url:
            raise ValueError(f"a {self.kind} source needs url")
        what = forbidden_reason(self.repo, self.path, self.url)
        if what:
            raise ValueError(f"cites {what}, which the project keeps aside for its own validation (issue 34)")
        return self


class Hardware(_Strict):
    """The cards of the run: ``gpu`` a name of ``app/planner/data/gpus.yaml`` (or one it
    resolves), ``count`` how many the server used (all ranks: TP × PP × DP); ``p2p``
    false where the source says the cards could not reach each other directly although
    the card can (each in its own container or VM, P2P off: NCCL goes through the host),
    None: the card's own."""

    gpu: str = Field(min_length=1)
    count: int = Field(ge=1, le=1024)
    p2p: bool | None = None


class Assumed(_Strict):
    """A value the source does not state: ``field`` (dotted path, e.g. ``bench.random_range_ratio``,
    ``hardware.gpu``, ``points[busy].bench.num_prompts``), the ``value`` used, the range
    ``low``…``high`` it may take (numbers, or the alternatives for a name) and ``why``."""

    field: str = Field(min_length=1)
    value: Any
    low: Any = None
    high: Any = None
    why: str = Field(min_length=1)


def _option_names(v: dict[str, Any], what: str) -> dict[str, Any]:
    for k in v:
        if not isinstance(k, str) or not _SNAKE.fullmatch(k):
            raise ValueError(f"{k!r}: write {what}'s option name without dashes, '-' as '_' (e.g. max_num_seqs)")
    return v


class _Options(_Strict):
    """What a set and each of its points may give: ``serve`` (``vllm serve`` options by
    their names), ``env`` (the server's environment) and ``bench`` (``vllm bench serve``
    options); a point's override the set's."""

    serve: dict[str, Any] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    bench: dict[str, Any] = Field(default_factory=dict)

    @field_validator("serve")
    @classmethod
    def _serve(cls, v: dict[str, Any]) -> dict[str, Any]:
        return _option_names(v, "vllm serve")

    @field_validator("bench")
    @classmethod
    def _bench(cls, v: dict[str, Any]) -> dict[str, Any]:
        return _bench_names(v)


class Point(_Options):
    """One published run: ``label`` (unique in the set), ``model``/``vllm_version`` when
    they differ from the set's, ``serve``/``bench`` overrides of the set's options (``env``:
    the server's environment variables, e.g. ``VLLM_ATTENTION_BACKEND``, where a choice has
    no flag), and
    ``measured``: every figure published for it under ``vllm bench serve --save-result``'s
    keys (ms, s, requests/s, tokens/s), exactly as published."""

    label: str = Field(min_length=1)
    model: str | None = None
    vllm_version: str | None = None
    measured: dict[str, float]
    note: str = ""

    @field_validator("measured")
    @classmethod
    def _measured(cls, v: dict[str, float]) -> dict[str, float]:
        if not v:
            raise ValueError("a point needs at least one published figure")
        for k, x in v.items():
            if not is_known_measured_key(k):
                raise ValueError(f"{k!r} is not a key of vllm bench serve --save-result (e.g. output_throughput, "
                                 f"mean_ttft_ms, p99_tpot_ms)")
            if not x >= 0:  # NaN too
                raise ValueError(f"{k}: {x} is not a published figure (≥ 0)")
        return v


def _bench_names(v: dict[str, Any]) -> dict[str, Any]:
    _option_names(v, "vllm bench serve")
    for k in v:
        if k not in BENCH_OPTIONS:
            raise ValueError(f"{k!r} is not a vllm bench serve option this library knows "
                             f"(e.g. dataset_name, random_input_len, num_prompts, request_rate, max_concurrency)")
    return v


#: measured keys where a lower value wins (latencies, duration, failures); the rest: higher
def lower_is_better(key: str) -> bool:
    return key.endswith("_ms") or key in ("duration", "failed")


class Comparison(_Strict):
    """Points of the set that the source compares on one machine: ``figure`` (a measured
    key) decides the winner — the higher throughput, the lower latency; ``per_gpu``:
    divide by each point's card count first (where counts differ)."""

    name: str = Field(min_length=1)
    points: list[str] = Field(min_length=2)
    figure: str
    per_gpu: bool = False

    @field_validator("figure")
    @classmethod
    def _figure(cls, v: str) -> str:
        if not is_known_measured_key(v):
            raise ValueError(f"{v!r} is not a measured key (e.g. output_throughput, mean_tpot_ms)")
        return v


class RealRunSet(_Options):
    """One published set of vLLM GPU runs (see the module docstring)."""

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    role: Literal["fit", "validation"]
    title: str = Field(min_length=1)
    source: Source
    hardware: Hardware
    model: str = Field(min_length=1)
    vllm_version: str = Field(pattern=r"^\d+\.\d+(\.\d+)?([.+-]?[A-Za-z0-9.]+)?$")
    assumed: list[Assumed] = Field(default_factory=list)
    points: list[Point] = Field(min_length=1)
    comparisons: list[Comparison] = Field(default_factory=list)
    notes: str = ""

    @model_validator(mode="after")
    def _consistent(self) -> "RealRunSet":
        labels = [p.label for p in self.points]
        dup = sorted({x for x in labels if labels.count(x) > 1})
        if dup:
            raise ValueError(f"points: labels {', '.join(dup)} appear more than once")
        for i, c in enumerate(self.comparisons):
            for lab in c.points:
                if lab not in labels:
                    raise ValueError(f"comparisons[{i}].points: {lab!r} is not a point of this set")
                p = self.points[labels.index(lab)]
                if c.figure not in p.measured:
                    raise ValueError(f"comparisons[{i}].figure: point {lab!r} has no {c.figure}")
        return self

    # ---- the configuration of each point (the set's options with the point's overrides)
    def point(self, label: str) -> Point:
        for p in self.points:
            if p.label == label:
                return p
        raise KeyError(label)

    def serve_of(self, p: Point) -> dict[str, Any]:
        """``vllm serve`` options of point ``p``: the set's, then the point's."""
        return {**self.serve, **p.serve}

    def env_of(self, p: Point) -> dict[str, str]:
        """The server's environment variables for point ``p``: the set's, then the point's."""
        return {**self.env, **p.env}

    def bench_of(self, p: Point) -> dict[str, Any]:
        """``vllm bench serve`` options of point ``p``: the set's, then the point's."""
        return {**self.bench, **p.bench}

    def model_of(self, p: Point) -> str:
        return p.model or self.model

    def version_of(self, p: Point) -> str:
        return p.vllm_version or self.vllm_version

    def gpus_of(self, p: Point) -> int:
        """Cards point ``p`` ran on: TP × PP × DP of its options (the set's ``hardware.count``
        when none are given)."""
        s = self.serve_of(p)
        ranks = 1
        for k in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
            ranks *= int(s.get(k, 1))
        return ranks if any(k in s for k in ("tensor_parallel_size", "pipeline_parallel_size",
                                              "data_parallel_size")) else self.hardware.count


def _field_path(loc: tuple[Any, ...]) -> str:
    """pydantic's error location as a dotted path, list entries by index (``points[2].measured.x``)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def load_set(path: str | Path) -> RealRunSet:
    """One set file. Raises :class:`RealRunError` naming the file and the field: broken
    YAML, a field that does not validate, or an ``id`` other than the file's stem."""
    path = Path(path)
    try:
        data = load_yaml(path.read_bytes())
    except YamlError as e:
        raise RealRunError(path, e.key, e.located) from None
    except OSError as e:
        raise RealRunError(path, None, f"cannot be read: {e.strerror or e}") from None
    if not isinstance(data, dict):
        raise RealRunError(path, None, "is not a mapping of a set's fields (id, role, title, source, …)")
    try:
        rs = RealRunSet.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        field = _field_path(tuple(err["loc"])) or None
        msg = err["msg"].removeprefix("Value error, ")
        m = re.match(r"([\w.\[\]]+): (.*)", msg, re.S)
        if field is None and m:  # a whole-set check names its field first
            field, msg = m.group(1), m.group(2)
        if err["type"] == "extra_forbidden":
            msg = "is not a field of a set (see benchmarks/data/realgpu/README.md)"
        more = f" (and {len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
        raise RealRunError(path, field, msg + more) from None
    if rs.id != path.stem:
        raise RealRunError(path, "id", f"{rs.id!r} differs from the file's name: the id is the file stem {path.stem!r}")
    return rs


def load_sets(folder: str | Path = DEFAULT_FOLDER) -> list[RealRunSet]:
    """Every ``*.yaml`` set of ``folder``, sorted by id. Raises :class:`RealRunError`
    for the first file that does not load, and for two files of one id."""
    folder = Path(folder)
    out: list[RealRunSet] = []
    for f in sorted(folder.glob("*.yaml")):
        out.append(load_set(f))
    return out
