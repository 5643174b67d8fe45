"""The one workload model: what requests a ramp, a tune and a plan send (issue 33, item 2).

A :class:`Workload` is made of *kinds*, one class each (:data:`KINDS`): the synthetic
lengths, a dataset, shared prefixes, multi-turn conversations and request-rate arrivals.
A kind is a pydantic model of its own fields that declares, beside them,

- ``CLI``: its command-line options (:class:`CliOption`; ``app.cli.common`` adds them to
  ``ramp``, ``run``, ``plan`` and ``tune`` and reads them back with :func:`fields_from_args`),
- ``FORM``: its rows of the Ramp form (:class:`FormRow`; ``widgets.workload_form`` builds them),
- ``PREDICTION``: how the planner's step-level engine predicts it (:class:`Prediction`,
  read by ``app.planner.predict``),
- :meth:`WorkloadKind.kind_check`: its rules against the ramp's mode and the other kinds,
- :meth:`WorkloadKind.kind_shape`: its words in the request shape recorded with every run,
- its request stream: the methods the load generator (``app.loadgen.prompts``,
  ``app.loadgen.runner``) and the planner (``app.planner.predict``) both draw with —
  :meth:`SyntheticLengths.length_range`, :meth:`DatasetSource.dataset`,
  :attr:`SharedPrefixKind.shared_prefix` (``SharedPrefixes``), :meth:`MultiTurnKind.turns_range`,
  :meth:`RequestRate.arrivals`.

``RampSpec`` (app.loadgen.spec) and ``TuneSpec`` (app.tuner.tune) *are* a Workload (they
inherit it: its fields are theirs, so the JSON of ``ramp --json``, the store's spec and the
profile YAML's ``ramp:`` keys are the Workload's, flat, as they always were); the planner's
``Workload`` (app.planner.plan) holds one unchanged (``requests``). Adding a kind: one class
here, added to :class:`Workload`'s bases, plus its own logic;
``tests/unit/test_workload_kinds.py`` names a kind without a predictor, a CLI flag or a
form row. Units: tokens for lengths, seconds for times, requests/s for rates.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from app.config import number_parser
from app.loadgen.arrivals import arrival_times
from app.loadgen.datasets import FORMATS, Dataset, DatasetFormat, load_dataset

Length = Union[int, tuple[int, int]]
"""A token length: fixed ``n`` or a uniform range ``(lo, hi)`` inclusive."""

#: a single-number length is drawn uniformly within ±this fraction of it (0: fixed) — the
#: one default of the ramp, the tune, the plan, their CLI flags and the form's Vary box:
#: closed-loop users with equal lengths march in lockstep, which no real workload does
DEFAULT_LENGTH_SPREAD = 0.25
#: the default spread in words, for the help and the form ("±25 %")
SPREAD_TEXT = f"±{DEFAULT_LENGTH_SPREAD * 100:g} %"

#: the commands whose flags the kinds declare (``app.cli``: ramp, run, plan, tune)
COMMANDS = frozenset({"ramp", "run", "plan", "tune"})
#: the closed-loop commands: a plan's curve and a tune's search are concurrency ramps
CLOSED_LOOP_COMMANDS = frozenset({"plan", "tune"})


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


def parse_tokens(text: str) -> Length:
    """A length the user typed (an option, a form field): :func:`parse_length`, at least
    1 token, a range's low end at most its high end. Raises ValueError saying the rule."""
    v = parse_length(text)
    lo, hi = v if isinstance(v, tuple) else (v, v)
    if lo < 1 or hi < lo:
        raise ValueError(f"length {text!r}: need at least 1 token (a range LOW-HIGH with 1 ≤ LOW ≤ HIGH)")
    return v


def length_text(v: Any) -> str:
    """A length as the form and the CLI write it: ``512`` or ``256-1024``."""
    return f"{v[0]}-{v[1]}" if isinstance(v, (list, tuple)) else str(v)


class MultiTurn(BaseModel):
    """Multi-turn conversations (issue 20, item 2): each closed-loop user holds a
    conversation and sends its growing history each turn.

    ``turns``: the mean number of turns (user messages) of a conversation; each
    conversation's count K is drawn uniformly within ±``length_spread`` of it
    (rounded, at least 1; exactly ``turns`` with ``--fixed-lengths``) — the workload's own
    length rule (:meth:`MultiTurnKind.turns_range`), so every conversation reaches the later
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


def multi_turn_text(v: Any) -> str:
    """A multi-turn workload (model or dict) in its CLI form ``TURNS[:THINK_S]``; "" for None."""
    if not v:
        return ""
    d = v.model_dump() if isinstance(v, BaseModel) else dict(v)
    return f"{float(d['turns']):g}" + (f":{float(d['think_s']):g}" if d.get("think_s") else "")


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


def shared_prefix_text(v: Any) -> str:
    """A shared-prefix workload (model or dict) in its CLI form; "" for None."""
    if not v:
        return ""
    d = v.model_dump() if isinstance(v, BaseModel) else dict(v)
    return f"{int(d['tokens'])}:{float(d['fraction']):g}:{int(d.get('count', 1))}"


# ------------------------------------------------------------------------------ declarations
@dataclass(frozen=True)
class CliOption:
    """One command-line option of a kind. ``flag`` (``--multi-turn``), ``field`` the
    Workload field it sets (None: the kind's :meth:`WorkloadKind.from_args` reads it),
    ``help`` (the unit and the default in words; ``%`` as is), ``parse`` the text → the
    value (raises ValueError saying what is wanted; None: the text as is), ``switch`` an
    option without a value (``store_true``),
    ``metavar``, ``choices``, ``commands`` the commands that take it (:data:`COMMANDS`),
    ``source`` a dataset source (the CLI checks that a file exists).
    Every option defaults to "not given" (None): a value not given is the base workload's —
    the Workload's default in ``ramp`` and ``plan``, the profile's ramp in ``run`` and
    ``tune``."""

    flag: str
    help: str
    field: str | None = None
    parse: Callable[[str], Any] | None = None
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    commands: frozenset[str] = COMMANDS
    #: a switch (``store_true``): no value
    switch: bool = False
    #: a dataset source: ``builtin:NAME``, ``hf:OWNER/NAME`` or an existing readable file (the CLI checks it)
    source: bool = False

    @property
    def dest(self) -> str:
        """The argparse attribute: ``--multi-turn`` → ``multi_turn``."""
        return self.flag.lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class FormRow:
    """One row of the Ramp form for a Workload ``field``. ``widget``: ``text`` (a line
    edit; ``parse`` the text → the field's value, "" → None/default; ``text`` the value →
    the text), ``file`` (the same with a browse button), ``check`` (a box: ``on`` when
    ticked, ``off`` when not), ``number`` (a spin box of floats) or ``count`` (a spin box of
    whole numbers, 0 shown as ``special`` and meaning None); ``placeholder`` is a line
    edit's grey hint and a check box's text. ``section``: ``requests`` (the
    request shape) or ``arrivals`` (shown for request rates only)."""

    field: str
    label: str
    widget: Literal["text", "file", "check", "number", "count"]
    tooltip: str
    placeholder: str = ""
    section: Literal["requests", "arrivals"] = "requests"
    parse: Callable[[str], Any] | None = None
    text: Callable[[Any], str] = str
    on: Any = None
    off: Any = None
    minimum: float = 0.0
    maximum: float = 1e6
    step: float = 1.0
    decimals: int = 0
    special: str = ""


@dataclass(frozen=True)
class Prediction:
    """How the planner's step-level engine predicts a kind (app.planner.predict).
    ``per_user_stream``: its requests are drawn one user at a time (``RequestStream``:
    blocks identified for the prefix cache, conversations, think times);
    ``arrivals``: requests are sent at the load generator's arrival times
    (:meth:`RequestRate.arrivals`), the closed-loop plan curve leaves them out
    (:meth:`Workload.closed_loop`); ``how``: the rule in words (docs, the coverage test)."""

    how: str
    per_user_stream: bool = False
    arrivals: bool = False


class WorkloadKind(BaseModel):
    """A kind of workload: its fields plus the declarations above. A subclass sets
    ``TITLE`` (its name in words), ``CLI``, ``FORM`` and ``PREDICTION``, and overrides
    :meth:`kind_on`; :meth:`kind_check` and :meth:`kind_shape` when it has rules or words."""

    model_config = ConfigDict(extra="forbid")

    TITLE: ClassVar[str] = ""
    CLI: ClassVar[tuple[CliOption, ...]] = ()
    FORM: ClassVar[tuple[FormRow, ...]] = ()
    PREDICTION: ClassVar[Optional[Prediction]] = None
    #: fields :meth:`from_args` sets from other options (no option or row of their own)
    DERIVED: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def own_fields(cls) -> tuple[str, ...]:
        """The Workload fields this kind declares (those of its class body)."""
        return tuple(k for k in cls.__annotations__ if k in cls.model_fields)

    def kind_on(self) -> bool:
        """Whether this workload uses the kind (a field set off its default)."""
        raise NotImplementedError(f"{type(self).__name__}.kind_on")

    def kind_check(self, mode: str) -> None:
        """Raise ValueError (naming the field and the fix) when the kind cannot run in a
        ramp of ``mode`` (``concurrency`` or ``rate``) with the other kinds set."""

    def kind_shape(self) -> str | None:
        """The kind's words in the request shape (None: nothing to say)."""
        return None

    @classmethod
    def from_args(cls, a: Any) -> dict[str, Any]:
        """The fields its command-line options set (those given), from an argparse
        namespace: each option with a ``field`` whose value is not None."""
        return {o.field: v for o in cls.CLI if o.field is not None and (v := getattr(a, o.dest, None)) is not None}


# ------------------------------------------------------------------------------ the kinds
_positive_float = number_parser(float, low=0, low_open=True, what="a number", example="1")
_positive_int = number_parser(int, low=1, what="a whole number", example="8")


class SyntheticLengths(WorkloadKind):
    """Synthetic prompts of ``prompt_tokens`` and ``max_tokens`` of ``output_tokens``: a
    single number n drawn uniformly within n·(1 ± ``length_spread``), a LOW-HIGH range
    as given (:meth:`length_range`; the load generator's and the planner's
    ``LengthSampler``)."""

    TITLE: ClassVar[str] = "synthetic lengths"
    prompt_tokens: Length = 512
    output_tokens: Length = 128
    length_spread: float = Field(DEFAULT_LENGTH_SPREAD, ge=0, lt=1, description=(
        "a single-number length is drawn uniformly within ±this fraction of it (0: fixed); "
        "a LOW-HIGH range is used as given"))

    CLI: ClassVar[tuple[CliOption, ...]] = (
        CliOption("--prompt-tokens", f"prompt length in tokens: N (varied {SPREAD_TEXT}, see --fixed-lengths) or "
                  "LOW-HIGH (default 512, or the profile's ramp)", "prompt_tokens", parse_tokens, "TOKENS"),
        CliOption("--output-tokens", f"output length in tokens: N (varied {SPREAD_TEXT}) or LOW-HIGH (default 128, "
                  "or the profile's ramp); with a --prompts-file whose records carry answers: the cap on the "
                  "answers' lengths", "output_tokens", parse_tokens, "TOKENS"),
        CliOption("--fixed-lengths", "send exactly --prompt-tokens/--output-tokens (default: a single number N "
                  f"varies uniformly within {SPREAD_TEXT} of N, seeded, so users do not march in lockstep)",
                  switch=True),
    )
    FORM: ClassVar[tuple[FormRow, ...]] = (
        FormRow("prompt_tokens", "Prompt tokens", "text", "Prompt tokens: a count (512) or a uniform range (256-1024)",
                parse=parse_length, text=length_text),
        FormRow("output_tokens", "Output tokens", "text",
                "Output tokens: a count (128) or a uniform range (64-256); ignore_eos is on. With a prompts file "
                "whose records carry answers the answers' lengths are sent instead", parse=parse_length,
                text=length_text),
        FormRow("length_spread", "", "check",
                f"A single count N is drawn uniformly from N·{1 - DEFAULT_LENGTH_SPREAD:g} … "
                f"N·{1 + DEFAULT_LENGTH_SPREAD:g} (seeded), so users do not all prefill and finish together; "
                "unchecked: exactly N", placeholder=f"Vary single lengths {SPREAD_TEXT}",
                on=DEFAULT_LENGTH_SPREAD, off=0.0),
    )
    PREDICTION: ClassVar[Optional[Prediction]] = Prediction(
        "the engine's requests draw their lengths from the ramp's LengthSampler (same ranges, same seed)")

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

    def kind_on(self) -> bool:
        return True  # every workload has lengths (a dataset's entries without answers draw their outputs here)

    @classmethod
    def from_args(cls, a: Any) -> dict[str, Any]:
        out = super().from_args(a)
        if getattr(a, "fixed_lengths", False):
            out["length_spread"] = 0.0
        return out

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


class DatasetSource(WorkloadKind):
    """A dataset's requests (:mod:`app.loadgen.datasets`): ``prompts_file`` sampled with the
    seed, its ``prompts_format`` and ``prompts_column``; ``output_cap`` caps the answers'
    lengths."""

    TITLE: ClassVar[str] = "dataset"
    #: set by :meth:`from_args` (``--output-tokens`` with a dataset caps its answers)
    DERIVED: ClassVar[tuple[str, ...]] = ("output_cap",)
    prompts_file: Optional[Path] = Field(None, description=(
        "a dataset (app.loadgen.datasets): a ShareGPT/chat/{\"prompt\": …} JSON(L), CSV or Parquet file, "
        "builtin:chat, or hf:OWNER/NAME from the Hugging Face cache; sampled with the seed"))
    prompts_format: Optional[DatasetFormat] = Field(None, description="the dataset's format; None → detected")
    prompts_column: Optional[str] = Field(None, min_length=1, description="CSV/Parquet: the text column")
    output_cap: Optional[int] = Field(None, ge=1, description=(
        "a dataset with answers: max_tokens is the answer's length, at most this (None: uncapped)"))

    CLI: ClassVar[tuple[CliOption, ...]] = (
        CliOption("--prompts-file", "a dataset, sampled with --seed: ShareGPT JSON/JSONL, OpenAI chat JSONL "
                  "({\"messages\"}), {\"prompt\": …} JSONL, CSV or Parquet; builtin:chat (synthetic, ShareGPT's "
                  "lengths); hf:OWNER/NAME[/FILE] from the Hugging Face cache (never downloaded). max_tokens comes "
                  "from the answers when the records have them", "prompts_file", metavar="FILE", source=True),
        CliOption("--prompts-format", "the --prompts-file format (default: detected)", "prompts_format",
                  choices=tuple(FORMATS)),
        CliOption("--prompts-column", "CSV/Parquet: the text column (default: prompt, text or question)",
                  "prompts_column"),
    )
    FORM: ClassVar[tuple[FormRow, ...]] = (
        FormRow("prompts_file", "Prompts file", "file",
                "A dataset, sampled with the seed: ShareGPT JSON/JSONL (\"conversations\"), OpenAI chat JSONL "
                "(\"messages\"), {\"prompt\": …} JSONL, CSV or Parquet with a prompt/text/question column; "
                "builtin:chat (synthetic, ShareGPT's lengths); hf:OWNER/NAME from the Hugging Face cache (never "
                "downloaded). Output lengths come from the dataset's answers; without answers from Output tokens.",
                placeholder="optional dataset: JSON(L), CSV, Parquet, builtin:chat, hf:OWNER/NAME",
                parse=lambda t: t or None, text=lambda v: "" if v is None else str(v)),
    )
    PREDICTION: ClassVar[Optional[Prediction]] = Prediction(
        "the engine's requests are the dataset's entries in the LengthSampler's seeded order (estimated prompt "
        "tokens, the answers' lengths capped at output_cap)")

    def kind_on(self) -> bool:
        return self.prompts_file is not None

    @classmethod
    def from_args(cls, a: Any) -> dict[str, Any]:
        """The dataset's fields, the dataset read here so that a bad one is an error naming
        ``--prompts-file`` (ValueError); ``--output-tokens`` with a dataset also caps its
        answers (``output_cap``)."""
        if not getattr(a, "prompts_file", None):
            if getattr(a, "prompts_format", None) or getattr(a, "prompts_column", None):
                raise ValueError("--prompts-format/--prompts-column describe a --prompts-file: give one")
            return {}
        try:  # read here so that the message names the option (the spec reads it again, from the cache)
            load_dataset(a.prompts_file, a.prompts_format, a.prompts_column)
        except ValueError as e:
            raise ValueError(f"--prompts-file: {e}") from None
        out: dict[str, Any] = {"prompts_file": a.prompts_file, "prompts_format": a.prompts_format,
                               "prompts_column": a.prompts_column}
        ot = getattr(a, "output_tokens", None)
        if ot is not None:  # a cap on the answers' lengths (and the draw for records without one)
            out["output_cap"] = ot[1] if isinstance(ot, tuple) else ot
        return out

    def kind_check(self, mode: str) -> None:
        if self.prompts_file is None and (self.prompts_format is not None or self.prompts_column is not None):
            raise ValueError("prompts_format/prompts_column describe a prompts_file: give one")

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


class SharedPrefixKind(WorkloadKind):
    """Shared prefixes (:class:`SharedPrefix`): the load generator's and the planner's
    ``app.loadgen.prompts.SharedPrefixes`` choose them with the same seeded rule."""

    TITLE: ClassVar[str] = "shared prefix"
    shared_prefix: Optional[SharedPrefix] = Field(None, description="a fraction of requests starts with a shared prefix")

    CLI: ClassVar[tuple[CliOption, ...]] = (
        CliOption("--shared-prefix", "COUNT (default 1) shared prefixes of TOKENS tokens; a FRACTION of requests "
                  "starts with one of them (as vllm bench's prefix_repetition dataset)", "shared_prefix",
                  parse_shared_prefix, "TOKENS:FRACTION[:COUNT]"),
    )
    FORM: ClassVar[tuple[FormRow, ...]] = (
        FormRow("shared_prefix", "Shared prefix", "text",
                "Shared prefixes: COUNT (default 1) system prompts/documents of TOKENS tokens; a FRACTION of requests "
                "starts with one of them (seeded), the rest are fresh — as vllm bench's prefix_repetition dataset. "
                "Empty: off", placeholder="off — tokens:fraction[:count], e.g. 1024:0.5:4",
                parse=lambda t: parse_shared_prefix(t).model_dump() if t else None, text=shared_prefix_text),
    )
    PREDICTION: ClassVar[Optional[Prediction]] = Prediction(
        "the engine's requests carry the prefix's blocks, chosen by SharedPrefixes' seeded rule, so the prefix "
        "cache skips their prefill", per_user_stream=True)

    def kind_on(self) -> bool:
        return self.shared_prefix is not None

    def kind_shape(self) -> str | None:
        sp = self.shared_prefix
        if sp is None:
            return None
        return (f"{sp.fraction:.0%} start with one of {sp.count} shared prefix{'es' if sp.count > 1 else ''} "
                f"of {sp.tokens} tokens")


class MultiTurnKind(WorkloadKind):
    """Multi-turn conversations (:class:`MultiTurn`): closed-loop users only; the turn
    counts from :meth:`turns_range`, the think times exponential."""

    TITLE: ClassVar[str] = "multi-turn"
    multi_turn: Optional[MultiTurn] = Field(None, description=(
        "closed loop: each user holds a conversation, sending its history each turn (a level's users = "
        "conversations in progress)"))

    CLI: ClassVar[tuple[CliOption, ...]] = (
        CliOption("--multi-turn", f"each user holds a conversation of about TURNS turns ({SPREAD_TEXT}, see "
                  "--fixed-lengths), sending its history each turn, thinking THINK_S s (mean, exponential) "
                  "between turns; per-turn TTFT is reported", "multi_turn", parse_multi_turn, "TURNS[:THINK_S]"),
    )
    FORM: ClassVar[tuple[FormRow, ...]] = (
        FormRow("multi_turn", "Multi-turn", "text",
                f"Multi-turn conversations: each user holds a conversation of about TURNS turns ({SPREAD_TEXT} with "
                "Vary), sending its history and the replies each turn, thinking THINK s (mean, exponential) "
                "between turns; a level's users are conversations in progress. Results show TTFT per turn. Empty: off",
                placeholder="off — turns[:think s], e.g. 4:2",
                parse=lambda t: parse_multi_turn(t).model_dump() if t else None, text=multi_turn_text),
    )
    PREDICTION: ClassVar[Optional[Prediction]] = Prediction(
        "each engine user holds a conversation (turn counts and think times drawn with the generator's seeds), "
        "its history's blocks cached from turn to turn", per_user_stream=True)

    def kind_on(self) -> bool:
        return self.multi_turn is not None

    def turns_range(self) -> tuple[int, int]:
        """The uniform range (inclusive) a conversation's turn count is drawn from:
        ``multi_turn.turns`` · (1 ± ``length_spread``), rounded, at least 1 (the rule of
        :meth:`SyntheticLengths.length_range`); (1, 1) without ``multi_turn``."""
        if self.multi_turn is None:
            return 1, 1
        spread = getattr(self, "length_spread", DEFAULT_LENGTH_SPREAD)  # the Workload's (SyntheticLengths') spread
        t = self.multi_turn.turns
        lo = max(1, round(t * (1 - spread)))
        return lo, max(lo, round(t * (1 + spread)))

    def kind_shape(self) -> str | None:
        if self.multi_turn is None:
            return None
        lo, hi = self.turns_range()
        return (f"conversations of {lo if lo == hi else f'{lo}–{hi}'} turns"
                + (f", think {self.multi_turn.think_s:g} s (mean)" if self.multi_turn.think_s else ""))

    def kind_check(self, mode: str) -> None:
        if self.multi_turn is not None and mode != "concurrency":
            raise ValueError("multi_turn: conversations are held by closed-loop users — use concurrency levels "
                             "(--levels/--max-level), not request rates")


class RequestRate(WorkloadKind):
    """Open-loop arrivals, for request-rate levels: gaps gamma-distributed with shape
    ``burstiness`` (1: a Poisson process; the rule of ``vllm bench serve --burstiness``,
    :mod:`app.loadgen.arrivals`), at most ``max_concurrency`` requests in flight."""

    TITLE: ClassVar[str] = "request rate"
    burstiness: float = Field(1.0, gt=0, allow_inf_nan=False, description=(
        "rate mode: gamma shape of the gaps between arrivals, as vllm bench serve --burstiness "
        "(1 = Poisson; < 1 burstier, > 1 more uniform; app.loadgen.arrivals)"))
    max_concurrency: Optional[int] = Field(None, ge=1, description="rate mode: cap on requests in flight")

    CLI: ClassVar[tuple[CliOption, ...]] = (
        CliOption("--burstiness", "rate mode: gamma shape of the gaps between arrivals, as vllm bench serve "
                  "--burstiness (default 1 = Poisson; < 1 burstier, > 1 more uniform)", "burstiness",
                  _positive_float, "B", commands=COMMANDS - CLOSED_LOOP_COMMANDS),
        CliOption("--max-concurrency", "rate mode: cap on requests in flight", "max_concurrency", _positive_int, "N",
                  commands=COMMANDS - CLOSED_LOOP_COMMANDS),
    )
    FORM: ClassVar[tuple[FormRow, ...]] = (
        FormRow("burstiness", "Burstiness", "number",
                "Gamma shape of the gaps between arrivals, as vllm bench serve --burstiness: 1 = Poisson; below 1 "
                "requests come in bursts, above 1 more evenly spaced (the mean rate stays the level's)",
                section="arrivals", minimum=0.05, maximum=100, step=0.25, decimals=2),
        FormRow("max_concurrency", "Max concurrency", "count",
                "At most this many requests in flight (vllm bench serve --max-concurrency); an arrival that finds "
                "them all busy waits for one to end. The Results table counts the requests the cap delayed and "
                "held back", section="arrivals", maximum=100000, special="no cap"),
    )
    PREDICTION: ClassVar[Optional[Prediction]] = Prediction(
        "the engine sends at the load generator's arrival times (rate, burstiness, seed, level index), capped at "
        "max_concurrency; the plan's closed-loop curve leaves them out", arrivals=True)

    def kind_on(self) -> bool:
        return self.burstiness != 1.0 or self.max_concurrency is not None

    def kind_check(self, mode: str) -> None:
        if mode == "concurrency" and self.burstiness != 1.0:
            raise ValueError(f"burstiness {self.burstiness:g}: it shapes request-rate arrivals; give request rates "
                             "(mode: rate, --rate) or leave burstiness at 1")

    def arrivals(self, rate: float, seed: int, idx: int) -> Iterator[float]:
        """The send times (s from the level's start) of a rate level ``idx`` of ``rate``
        req/s (:func:`app.loadgen.arrivals.arrival_times`)."""
        return arrival_times(rate, self.burstiness, seed, idx)


# ------------------------------------------------------------------------------ the workload
class Workload(SyntheticLengths, DatasetSource, SharedPrefixKind, MultiTurnKind, RequestRate):
    """The requests of a ramp, a tune or a plan: every kind's fields (their defaults: 512
    prompt and 128 output tokens ±25 %, no dataset, no shared prefix, one turn, Poisson
    arrivals uncapped) and ``seed`` (every draw: lengths, dataset order, prefixes, turns,
    arrivals). Validation runs each kind's mode-free rules and reads a dataset (naming the
    file, the line and the fix); a ramp checks the kinds against its mode
    (:meth:`check_kinds`)."""

    seed: int = 0

    def kind_on(self) -> bool:
        return True

    @model_validator(mode="after")
    def _workload(self) -> "Workload":
        if self.prompts_file is not None:
            self.dataset()  # raises naming the file, the line and the fix
        for name in ("multi_turn", "shared_prefix"):
            if getattr(self, name) is not None and self.prompts_file is not None:
                raise ValueError(f"{name}: works on synthetic prompts; drop prompts_file (--prompts-file) or it")
        DatasetSource.kind_check(self, "concurrency")
        return self

    def check_kinds(self, mode: str) -> None:
        """Every kind's rules against a ramp of ``mode`` (ValueError naming the field)."""
        for k in KINDS:
            k.kind_check(self, mode)

    def as_workload(self) -> "Workload":
        """This model's Workload part, unchanged (a RampSpec's or a TuneSpec's fields of
        the workload, as a Workload)."""
        return Workload.model_validate({k: getattr(self, k) for k in Workload.model_fields})

    def closed_loop(self) -> "Workload":
        """This workload as a closed-loop ramp sends it: the fields of the kinds predicted
        by arrivals (:class:`Prediction` ``arrivals``) back at their defaults."""
        off = {f: Workload.model_fields[f].default for k in KINDS
               if k.PREDICTION is not None and k.PREDICTION.arrivals for f in k.own_fields()}
        return self.as_workload().model_copy(update=off)

    def per_user_stream(self) -> bool:
        """Whether the planner draws these requests one user at a time (a kind in use whose
        :class:`Prediction` says ``per_user_stream``)."""
        return any(k.PREDICTION is not None and k.PREDICTION.per_user_stream and k.kind_on(self) for k in KINDS)

    def kinds_shape(self) -> str:
        """The words of the kinds that have some beyond the lengths (``; ``-joined, each
        led by ``; ``), as :attr:`app.loadgen.spec.RampSpec.shape` ends."""
        parts = [s for k in KINDS if k is not SyntheticLengths and (s := k.kind_shape(self))]
        return "".join(f"; {s}" for s in parts)


#: the kinds, in the order the form and the help show them (:class:`Workload`'s bases)
KINDS: tuple[type[WorkloadKind], ...] = tuple(b for b in Workload.__bases__ if issubclass(b, WorkloadKind))


#: the seed's option: a field of the Workload itself (every kind draws with it)
SEED_OPTION = CliOption("--seed", "seed of the requests' draws: lengths, the dataset's order, prefixes, turns, "
                        "arrivals (default 0, or the profile's ramp)", "seed",
                        number_parser(int, low=0, high=2**32 - 1, what="a seed (a whole number)", example="0"), "N")


def cli_options(command: str) -> list[CliOption]:
    """Every kind's options that ``command`` (:data:`COMMANDS`) takes, then ``--seed``."""
    if command not in COMMANDS:
        raise ValueError(f"command {command!r}: one of {', '.join(sorted(COMMANDS))}")
    return [o for k in KINDS for o in k.CLI if command in o.commands] + [SEED_OPTION]


def fields_from_args(a: Any, command: str) -> dict[str, Any]:
    """The Workload fields the options of ``command`` set (those given; the workloads as
    their pydantic models, a dataset's as given). Raises ValueError naming the option."""
    out: dict[str, Any] = {}
    for k in KINDS:
        if any(command in o.commands for o in k.CLI):
            out.update(k.from_args(a))
    if getattr(a, "seed", None) is not None:
        out["seed"] = a.seed
    return out


def kind_problems(kinds: tuple[type[WorkloadKind], ...] | None = None) -> list[str]:
    """What each kind (:data:`KINDS` unless given) lacks, one line each naming it: a
    prediction (``PREDICTION``), a command-line option, a form row, its own
    :meth:`WorkloadKind.kind_on`, a field no option and no row sets (unless the kind's
    :meth:`~WorkloadKind.from_args` sets it: ``DERIVED``). Empty when every kind is whole —
    the coverage test (tests/unit/test_workload_kinds.py) asserts it."""
    out = []
    for k in KINDS if kinds is None else kinds:
        name = k.__name__
        if k.PREDICTION is None:
            out.append(f"{name}: no prediction (PREDICTION): how does the planner predict it?")
        if not k.CLI:
            out.append(f"{name}: no command-line option (CLI)")
        if not k.FORM:
            out.append(f"{name}: no row of the Ramp form (FORM)")
        if k.kind_on is WorkloadKind.kind_on:
            out.append(f"{name}: no kind_on (when is the kind in use?)")
        set_by = {o.field for o in k.CLI} | {r.field for r in k.FORM} | set(k.DERIVED)
        for f in k.own_fields():
            if f not in set_by:
                out.append(f"{name}.{f}: no CLI option or form row sets it")
        for f in {o.field for o in k.CLI if o.field} | {r.field for r in k.FORM}:
            if f not in k.own_fields():
                out.append(f"{name}: an option or row sets {f!r}, not a field of the kind")
    return out


def form_rows(section: str | None = None) -> list[FormRow]:
    """Every kind's form rows (of ``section``, or all)."""
    return [r for k in KINDS for r in k.FORM if section is None or r.section == section]


def mean_tokens(w: Workload, lengths: list[tuple[int, int]] | None = None) -> tuple[int, int]:
    """The mean (prompt, output) tokens of ``w``'s requests, each at least 1: of ``lengths``
    (a sample of its requests, e.g. ``app.loadgen.prompts.planned_lengths``) when given,
    else a single number itself or a range's middle (rounded)."""
    if lengths:
        return (max(1, round(sum(p for p, _ in lengths) / len(lengths))),
                max(1, round(sum(o for _, o in lengths) / len(lengths))))

    def mid(v: Length) -> int:
        return max(1, round((v[0] + v[1]) / 2)) if isinstance(v, tuple) else v

    return mid(w.prompt_tokens), mid(w.output_tokens)

