"""RampSpec: what a ramp does — levels, step length, request shape, SLO, stop rules.

Units: seconds for every time, tokens for lengths, requests/s for rates, fractions
(0–1) for failure rates. Validation errors name the field and say what is allowed.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from app.loadgen.datasets import Dataset, DatasetFormat, load_dataset
from app.settings import DEFAULT_MAX_FAILURE_RATE

Length = Union[int, tuple[int, int]]
"""A token length: fixed ``n`` or a uniform range ``(lo, hi)`` inclusive."""

ENDPOINTS = ("/v1/completions", "/v1/chat/completions")


def parse_length(text: str) -> Length:
    """CLI form of a length: ``"512"`` → 512, ``"256-1024"`` → (256, 1024).

    Raises ValueError naming the text when it is neither.
    """
    s = str(text).strip()
    try:
        if "-" in s.lstrip("-"):
            lo, hi = s.split("-", 1)
            return (int(lo), int(hi))
        return int(s)
    except ValueError:
        raise ValueError(f"length {text!r}: write a token count like 512 or a range like 256-1024") from None


#: the failure-rate bound of an SLO that sets latency bounds and none for failures
#: (a fraction): failed requests count against an SLO — a level that failed more than 1 %
#: of its measured requests does not meet it, however fast the rest were (issue 15, item 11)
DEFAULT_FAILURE_RATE = 0.01


class SLO(BaseModel):
    """Service-level objective; any subset of the three p99 bounds (seconds) and a
    failure-rate bound (fraction of a level's measured requests, 0–1).

    Broken at a level when that level's p99 exceeds a bound or its failure rate exceeds
    :attr:`failure_bound` (``failure_rate``, or :data:`DEFAULT_FAILURE_RATE` when only
    latency bounds are set); a request "meets" the SLO (for goodput) when it succeeded and
    its own TTFT, TPOT and e2e are within every bound set.
    """

    model_config = ConfigDict(extra="forbid")
    ttft_p99: Optional[float] = Field(None, gt=0, description="TTFT p99 bound, s")
    tpot_p99: Optional[float] = Field(None, gt=0, description="TPOT p99 bound, s per token")
    e2e_p99: Optional[float] = Field(None, gt=0, description="end-to-end latency p99 bound, s")
    failure_rate: Optional[float] = Field(None, ge=0, le=1, description="failure-rate bound, fraction 0–1")

    def is_empty(self) -> bool:
        return self.ttft_p99 is None and self.tpot_p99 is None and self.e2e_p99 is None and self.failure_rate is None

    @property
    def failure_bound(self) -> float | None:
        """The failure-rate bound a level is judged with (fraction): ``failure_rate`` when
        set, :data:`DEFAULT_FAILURE_RATE` when the SLO sets latency bounds only, None for
        an empty SLO (nothing is judged)."""
        if self.failure_rate is not None:
            return self.failure_rate
        return None if self.is_empty() else DEFAULT_FAILURE_RATE


class CapacitySearch(BaseModel):
    """How a capacity search probes. ``start``: the first level (1, or the planner's
    predicted users at SLO); ``max_level``: the highest level it may probe;
    ``resolution``: stop when the bracket is within this fraction of ``lo``;
    ``min_step``: … or within this many users (req/s in rate mode; None → 1 user or
    0.1 req/s); ``repeat``: how many times the whole search runs."""

    model_config = ConfigDict(extra="forbid")
    start: float = Field(1.0, gt=0)
    max_level: float = Field(1024.0, gt=0)
    resolution: float = Field(0.10, ge=0, lt=1)
    min_step: Optional[float] = Field(None, gt=0)
    repeat: int = Field(1, ge=1, le=20)

    def step(self, mode: str) -> float:
        if self.min_step is not None:
            return self.min_step
        return 1.0 if mode == "concurrency" else 0.1


class MultiTurn(BaseModel):
    """Multi-turn conversations (issue 20, item 2): each closed-loop user holds a
    conversation and sends its growing history each turn.

    ``turns``: the mean number of turns (user messages) of a conversation; each
    conversation's count K is drawn uniformly within ±``RampSpec.length_spread`` of it
    (rounded, at least 1; exactly ``turns`` with ``--fixed-lengths``) — the ramp's own
    length rule (:meth:`RampSpec.length_range`), so every conversation reaches the later
    turns that per-turn TTFT is measured on (a geometric count with the same mean would
    end a quarter of 4-turn conversations after one turn). ``think_s``: the mean think
    time between a reply and the user's next turn, s (exponential, as a memoryless user:
    0 = none); a thinking user holds no request in flight."""

    model_config = ConfigDict(extra="forbid")
    turns: float = Field(..., ge=1, le=10000, allow_inf_nan=False, description="mean turns per conversation")
    think_s: float = Field(0.0, ge=0, allow_inf_nan=False, description="mean think time between turns, s (exponential)")


class SharedPrefix(BaseModel):
    """Shared-prefix workload (issue 20, item 3), as vLLM's ``prefix_repetition``
    benchmark dataset (``--prefix-repetition-prefix-len``/``-num-prefixes``:
    vllm/benchmarks/datasets/datasets.py ``PrefixRepetitionRandomDataset``, 0.32.0) and
    GuideLLM's synthetic ``prefix_tokens``/``prefix_count``
    (guidellm src/guidellm/dataset/synthetic.py ``PrefixBucketConfig``): ``count``
    distinct prefixes (system prompts, documents) of ``tokens`` tokens each; a
    ``fraction`` (0–1] of the requests starts with one of them, chosen uniformly with the
    ramp's seed, followed by the ramp's usual fresh prompt of ``prompt_tokens`` (so such
    a request's prompt is ``tokens`` + ``prompt_tokens`` long, as GuideLLM counts it)."""

    model_config = ConfigDict(extra="forbid")
    tokens: int = Field(..., ge=1, description="tokens of each shared prefix")
    fraction: float = Field(..., gt=0, le=1, allow_inf_nan=False,
                            description="fraction of requests that start with a shared prefix")
    count: int = Field(1, ge=1, description="distinct prefixes")


def parse_multi_turn(text: str) -> MultiTurn:
    """CLI form ``TURNS[:THINK_S]``: ``"4"`` → 4 turns, no think time; ``"4:2.5"`` → 4
    turns, 2.5 s mean think time. Raises ValueError naming the text."""
    parts = str(text).strip().split(":")
    try:
        if len(parts) > 2:
            raise ValueError
        return MultiTurn(turns=float(parts[0]), think_s=float(parts[1]) if len(parts) > 1 else 0.0)
    except (ValueError, TypeError):
        raise ValueError(f"multi-turn {text!r}: write TURNS[:THINK_S], e.g. 4 or 4:2.5 (mean turns ≥ 1, "
                         "mean think time ≥ 0 s)") from None


def parse_shared_prefix(text: str) -> SharedPrefix:
    """CLI form ``TOKENS:FRACTION[:COUNT]``: ``"1024:0.5"`` → one 1024-token prefix on half
    the requests; ``"1024:0.5:4"`` → four of them. Raises ValueError naming the text."""
    parts = str(text).strip().split(":")
    try:
        if len(parts) not in (2, 3):
            raise ValueError
        return SharedPrefix(tokens=int(parts[0]), fraction=float(parts[1]),
                            count=int(parts[2]) if len(parts) > 2 else 1)
    except (ValueError, TypeError):
        raise ValueError(f"shared prefix {text!r}: write TOKENS:FRACTION[:COUNT], e.g. 1024:0.5 or 1024:0.5:4 "
                         "(tokens ≥ 1, fraction in (0, 1], count ≥ 1)") from None


class RampSpec(BaseModel):
    """A load ramp.

    Levels: ``levels`` (explicit) or ``max_level`` (geometric 1, 2, 4 … up to it, with
    ``max_level`` itself last). In ``concurrency`` mode a level is the number of
    requests kept in flight (closed loop, integer ≥ 1); in ``rate`` mode it is an
    arrival rate in requests/s (> 0), optionally capped at ``max_concurrency``: requests
    arrive with gamma-distributed gaps of shape ``burstiness`` (1: a Poisson process; the
    rule of ``vllm bench serve --burstiness``, :mod:`app.loadgen.arrivals`).

    Each level runs ``warmup_seconds`` (excluded from statistics) and then until
    ``step_seconds`` have passed and/or ``requests_per_level`` measured requests were
    sent — whichever comes first when both are set; then it drains its in-flight
    requests (bounded by ``request_timeout``).

    Stop rules: a level is aborted, and the ramp stopped, when its failure rate passes
    ``max_failure_rate`` (after at least ``min_requests_for_abort`` finished); the ramp
    stops after a level that breaks the ``slo``; ``max_total_seconds`` caps the ramp.
    Knee rule: :func:`app.loadgen.stats.find_knee` with ``knee_gain`` and
    ``knee_ttft_ratio``.

    Capacity search (``search`` set): the levels are chosen as the ramp goes
    (:func:`app.loadgen.capacity.next_level`) — a level that breaks the SLO or passes
    the failure rate does not stop it; ``requests_per_level`` is then the floor of
    measured requests each level is judged on and ``step_seconds`` its time cap, and a
    level measures only once each of its users has finished one request (``settle``).
    """

    model_config = ConfigDict(extra="forbid")

    url: str = "http://127.0.0.1:8000"
    endpoint: Literal["/v1/completions", "/v1/chat/completions"] = "/v1/completions"
    model: Optional[str] = Field(None, description="served model name; None → the first one /v1/models lists")
    mode: Literal["concurrency", "rate"] = "concurrency"
    levels: Optional[list[float]] = None
    max_level: Optional[int] = Field(None, ge=1)
    max_concurrency: Optional[int] = Field(None, ge=1, description="rate mode: cap on requests in flight")
    burstiness: float = Field(1.0, gt=0, allow_inf_nan=False, description=(
        "rate mode: gamma shape of the gaps between arrivals, as vllm bench serve --burstiness "
        "(1 = Poisson; < 1 burstier, > 1 more uniform; app.loadgen.arrivals)"))
    step_seconds: Optional[float] = Field(20.0, gt=0)
    requests_per_level: Optional[int] = Field(None, ge=1)
    warmup_seconds: float = Field(0.0, ge=0)
    prompt_tokens: Length = 512
    output_tokens: Length = 128
    length_spread: float = Field(0.25, ge=0, lt=1, description=(
        "a single-number length is drawn uniformly within ±this fraction of it (0: fixed); "
        "a LOW-HIGH range is used as given"))
    prompts_file: Optional[Path] = Field(None, description=(
        "a dataset (app.loadgen.datasets): a ShareGPT/chat/{\"prompt\": …} JSON(L), CSV or Parquet file, "
        "builtin:chat, or hf:OWNER/NAME from the Hugging Face cache; sampled with the seed"))
    prompts_format: Optional[DatasetFormat] = Field(None, description="the dataset's format; None → detected")
    prompts_column: Optional[str] = Field(None, min_length=1, description="CSV/Parquet: the text column")
    output_cap: Optional[int] = Field(None, ge=1, description=(
        "a dataset with answers: max_tokens is the answer's length, at most this (None: uncapped)"))
    ignore_eos: bool = True
    temperature: float = Field(0.0, ge=0)
    request_timeout: float = Field(300.0, gt=0)
    max_failure_rate: float = Field(DEFAULT_MAX_FAILURE_RATE, ge=0, le=1, description=(
        "a level whose failed requests pass this fraction (0–1) is aborted and the ramp stopped; the run "
        "controller sets it from the user's Settings (app.run.safety)"))
    min_requests_for_abort: int = Field(5, ge=1)
    slo: SLO = Field(default_factory=SLO)
    max_total_seconds: Optional[float] = Field(None, gt=0)
    knee_gain: float = Field(0.15, ge=0, description="knee: throughput growth per doubling below this")
    knee_ttft_ratio: float = Field(1.5, ge=1, description="knee: TTFT p99 growth at least this")
    seed: int = 0
    search: Optional[CapacitySearch] = Field(None, description="find the capacity instead of running fixed levels")
    multi_turn: Optional[MultiTurn] = Field(None, description=(
        "closed loop: each user holds a conversation, sending its history each turn (a level's users = "
        "conversations in progress)"))
    shared_prefix: Optional[SharedPrefix] = Field(None, description="a fraction of requests starts with a shared prefix")
    settle: Optional[bool] = Field(None, description=(
        "closed loop: a level's warm-up lasts until each user has finished one request (at least "
        "warmup_seconds); None → on for a capacity search, off for fixed levels"))

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        v = v.strip().rstrip("/")
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"url {v!r}: write the server's base URL, e.g. http://127.0.0.1:8000")
        if v.endswith("/v1"):
            v = v[:-3]
        return v

    @field_validator("prompt_tokens", "output_tokens")
    @classmethod
    def _length(cls, v: Length, info: ValidationInfo) -> Length:
        if isinstance(v, tuple):
            lo, hi = v
            if lo < 1 or hi < lo:
                raise ValueError(f"{info.field_name} range {lo}-{hi}: need 1 ≤ low ≤ high")
        elif v < 1:
            raise ValueError(f"{info.field_name} = {v}: need at least 1 token")
        return v

    @model_validator(mode="after")
    def _check(self) -> "RampSpec":
        if self.search is not None:
            # the levels come from the search as it goes (app.loadgen.capacity.next_level)
            if self.mode == "concurrency" and (self.search.start != int(self.search.start)
                                               or self.search.max_level != int(self.search.max_level)):
                raise ValueError("search: a concurrency search starts and ends at whole numbers of users")
            if self.search.start > self.search.max_level:
                raise ValueError(f"search: start {self.search.start:g} is above max_level {self.search.max_level:g}")
            self.levels = []
        elif self.levels is None:
            if self.max_level is None:
                raise ValueError("no levels: give levels (e.g. [1, 2, 4, 8]) or max_level (geometric 1, 2, 4 … N)")
            n, lv = 1, []
            while n < self.max_level:
                lv.append(float(n))
                n *= 2
            lv.append(float(self.max_level))
            self.levels = lv
        if not self.levels and self.search is None:
            raise ValueError("levels is empty: give at least one level")
        for x in self.levels:
            if self.mode == "concurrency" and (x < 1 or x != int(x)):
                raise ValueError(f"level {x}: a concurrency level is a whole number ≥ 1")
            if self.mode == "rate" and not x > 0:
                raise ValueError(f"level {x}: a rate level is a request rate > 0 req/s")
        if self.mode == "concurrency" and self.burstiness != 1.0:
            raise ValueError(f"burstiness {self.burstiness:g}: it shapes request-rate arrivals; give request rates "
                             "(mode: rate, --rate) or leave burstiness at 1")
        if self.step_seconds is None and self.requests_per_level is None:
            raise ValueError("set step_seconds and/or requests_per_level: a level needs an end")
        if self.prompts_file is not None:
            self.dataset()  # raises naming the file, the line and the fix
        elif self.prompts_format is not None or self.prompts_column is not None:
            raise ValueError("prompts_format/prompts_column describe a prompts_file: give one")
        if self.multi_turn is not None and self.mode != "concurrency":
            raise ValueError("multi_turn: conversations are held by closed-loop users — use concurrency levels "
                             "(--levels/--max-level), not request rates")
        for name in ("multi_turn", "shared_prefix"):
            if getattr(self, name) is not None and self.prompts_file is not None:
                raise ValueError(f"{name}: works on synthetic prompts; drop prompts_file (--prompts-file) or it")
        return self

    def turns_range(self) -> tuple[int, int]:
        """The uniform range (inclusive) a conversation's turn count is drawn from:
        ``multi_turn.turns`` · (1 ± ``length_spread``), rounded, at least 1 (the rule of
        :meth:`length_range`); (1, 1) without ``multi_turn``."""
        if self.multi_turn is None:
            return 1, 1
        t = self.multi_turn.turns
        lo = max(1, round(t * (1 - self.length_spread)))
        return lo, max(lo, round(t * (1 + self.length_spread)))

    def dataset(self) -> Dataset | None:
        """The :class:`app.loadgen.datasets.Dataset` of ``prompts_file`` (cached), None
        without one. Raises DatasetError (a ValueError) for a bad file."""
        if self.prompts_file is None:
            return None
        return load_dataset(self.prompts_file, self.prompts_format, self.prompts_column)

    @property
    def prompts_name(self) -> str | None:
        """``prompts_file`` as the user wrote it (``builtin:chat``, ``hf:…``) or a file's name."""
        if self.prompts_file is None:
            return None
        s = str(self.prompts_file)
        return s if s.startswith(("builtin:", "hf:")) else Path(s).name

    @property
    def settles(self) -> bool:
        """Whether a closed-loop level waits for each user's first request to finish before
        it measures (``settle``; by default only a capacity search does)."""
        return self.search is not None if self.settle is None else self.settle

    def length_range(self, name: str) -> tuple[int, int]:
        """The uniform range (inclusive, tokens) that ``prompt_tokens`` or
        ``output_tokens`` (``name``) is drawn from: a LOW-HIGH range as given; a single
        number n → n·(1 ± length_spread), rounded, at least 1 (n itself when the spread
        is 0). Closed-loop users with equal lengths march in lockstep — every request
        prefills and ends together — which no real workload does."""
        v = getattr(self, name)
        if isinstance(v, tuple):
            return v
        lo = max(1, round(v * (1 - self.length_spread)))
        return lo, max(lo, round(v * (1 + self.length_spread)))

    def level_quota(self, level: float) -> int | None:
        """The measured requests a level sends before it stops (None: time only):
        ``requests_per_level``; in a concurrency search at least twice the level's users
        — a search judges a level at full load, and with fewer requests than twice its
        users most would run while the level drains."""
        quota = self.requests_per_level
        if quota is not None and self.search is not None and self.mode == "concurrency":
            quota = max(quota, 2 * int(level))
        return quota

    @property
    def shape(self) -> str:
        """The request shape in words, recorded with every result: ``prompt 384–640,
        output 96–160 tokens (uniform, seed 0)``, ``… (fixed)`` or ``prompts from FILE``."""
        def one(name: str) -> str:
            lo, hi = self.length_range(name)
            return f"{lo}" if lo == hi else f"{lo}–{hi}"

        fixed = all(lo == hi for lo, hi in (self.length_range("prompt_tokens"), self.length_range("output_tokens")))
        how = "fixed" if fixed else f"uniform, seed {self.seed}"
        if self.prompts_file is not None:
            try:
                ds = self.dataset()  # a Dataset: prompts_file is set
                answers = ds is not None and ds.has_answers
            except ValueError:
                answers = False
            if answers:  # app.loadgen.prompts.LengthSampler: the answers' lengths, capped
                cap = f" (≤ {self.output_cap} tokens)" if self.output_cap is not None else ""
                return f"prompts from {self.prompts_name}, output from its answers{cap} (sampled, seed {self.seed})"
            return (f"prompts from {self.prompts_name} (sampled, seed {self.seed}), "
                    f"output {one('output_tokens')} tokens ({how})")
        out = f"prompt {one('prompt_tokens')}, output {one('output_tokens')} tokens ({how})"
        if self.shared_prefix is not None:
            sp = self.shared_prefix
            out += (f"; {sp.fraction:.0%} start with one of {sp.count} shared prefix{'es' if sp.count > 1 else ''} "
                    f"of {sp.tokens} tokens")
        if self.multi_turn is not None:
            lo, hi = self.turns_range()
            out += (f"; conversations of {lo if lo == hi else f'{lo}–{hi}'} turns"
                    + (f", think {self.multi_turn.think_s:g} s (mean)" if self.multi_turn.think_s else ""))
        return out

    @property
    def largest_level(self) -> int:
        """The most requests ever in flight (concurrency) or the cap (rate; 1024 if none)."""
        if self.search is not None:
            top = self.search.max_level
            return int(top) if self.mode == "concurrency" else (self.max_concurrency or 1024)
        if self.mode == "concurrency":
            return int(max(self.level_values))
        return self.max_concurrency or 1024

    @property
    def level_values(self) -> list[float]:
        """``levels`` as validation leaves them: never None (``max_level``'s, or [] for a search)."""
        if self.levels is None:
            raise ValueError("a RampSpec built without validation has no levels")
        return self.levels

    @property
    def chat(self) -> bool:
        return self.endpoint == "/v1/chat/completions"

    @property
    def planned_seconds(self) -> float | None:
        """How long the ramp runs if no level stops early: levels × (warm-up + step), s,
        capped by ``max_total_seconds``; the drain of in-flight requests at each level's
        end comes on top. None when levels end by request count (``step_seconds`` None)
        or a capacity search chooses them (``search``): then the cap, if any."""
        if self.step_seconds is None or self.search is not None:
            return self.max_total_seconds
        total = len(self.level_values) * (self.warmup_seconds + self.step_seconds)
        return min(total, self.max_total_seconds) if self.max_total_seconds else total


def slo_to_wall(slo: SLO, k: float) -> SLO:
    """An SLO written in rig seconds → wall seconds for a sim running ``k``× faster than
    the wall clock (every bound ÷ k; docs/design.md "Sim time"). ``k == 1`` returns
    ``slo`` unchanged. Raises ValueError for ``k`` ≤ 0."""
    if not k > 0:
        raise ValueError(f"time scale {k}: a sim's time scale is > 0")
    if k == 1.0:
        return slo
    return slo.model_copy(update={f: getattr(slo, f) / k for f in ("ttft_p99", "tpot_p99", "e2e_p99")
                                  if getattr(slo, f) is not None})


def spec_to_wall(spec: RampSpec, k: float, *, durations: bool = True) -> RampSpec:
    """A RampSpec written in rig seconds → the one the load generator runs against a sim
    ``k``× faster than the wall clock: the SLO bounds ÷ k (:func:`slo_to_wall`) and, with
    ``durations``, ``step_seconds``, ``warmup_seconds``, ``request_timeout`` and
    ``max_total_seconds`` ÷ k too (every front end writes its spec in rig seconds; the run
    controller converts it). In rate mode the levels, and a search's levels, × k: they are
    requests per rig second. ``k == 1`` returns ``spec`` unchanged."""
    if k == 1.0:
        return spec
    upd: dict = {"slo": slo_to_wall(spec.slo, k)}
    if spec.mode == "rate":  # a rig rate of r req/s is r·k req/s of wall time
        upd["levels"] = [x * k for x in spec.level_values]
        if spec.search is not None:
            sr = spec.search
            upd["search"] = sr.model_copy(update={"start": sr.start * k, "max_level": sr.max_level * k,
                                                  "min_step": sr.step("rate") * k})
    if durations:
        upd.update(warmup_seconds=spec.warmup_seconds / k, request_timeout=spec.request_timeout / k)
        for f in ("step_seconds", "max_total_seconds"):
            if getattr(spec, f) is not None:
                upd[f] = getattr(spec, f) / k
        if spec.multi_turn is not None and spec.multi_turn.think_s:
            upd["multi_turn"] = spec.multi_turn.model_copy(update={"think_s": spec.multi_turn.think_s / k})
    return spec.model_copy(update=upd)
