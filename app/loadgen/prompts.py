"""Request bodies for a ramp: synthetic prompts of about N tokens, or a dataset's requests
(``RampSpec.prompts_file``, read by :mod:`app.loadgen.datasets`).

Synthetic prompts are words drawn at random from common English words that are one
token each in the usual BPE vocabularies (Llama, Qwen, Mistral, GPT). Where the server
can tokenize (vLLM's ``/tokenize``), the runner measures the model's tokens per word
on a sample and the word count is scaled so a prompt has about N of the model's
tokens; the record keeps the server's own count from the usage chunk. Words are
drawn per request, so prompts share no long prefix (prefix caching does not flatter
TTFT) — except where the ramp asks for it: a shared-prefix workload
(:class:`SharedPrefixes`, ``RampSpec.shared_prefix``) puts one of a few fixed word
sequences before a fraction of the prompts, and a multi-turn conversation
(:class:`Conversation`, ``RampSpec.multi_turn``) re-sends its whole history each turn.
"""
from __future__ import annotations

import json
import math
import random

from dataclasses import dataclass, field

from app.loadgen.datasets import Dataset, Entry, length_histogram, output_of
from app.loadgen.spec import RampSpec
from app.loadgen.workload import SharedPrefix, Workload

_WORDS = (
    "the of and to in is was for on that with as by at from his her they this have had not are but "
    "one all were when we there can an which their said if do will each about how up out them then "
    "she many some so these would other into has more two like him see time could no make than first "
    "been its who now people my made over did down only way find use may water long little very after "
    "words called just where most know get through back much before go good new write our used me man "
    "too any day same right look think also around another came come work three word must because does "
    "part even place well such here take why things help put years different away again off went old "
    "number great tell men say small every found still between name should home big give air line set "
    "own under read last never us left end along while might next sound below saw something thought both "
    "few those always looked show large often together asked house world going want school important "
    "until form food keep children feet land side without boy once animals life enough took sometimes "
    "four head above kind began almost live page got earth need far hand high year mother light parts "
    "country father let night following picture being study second eyes soon times story boys since "
    "white days ever paper hard near sentence better best across during today others however sure means "
    "knew try told young miles sun ways thing whole hear example heard several change answer room sea "
    "against top turned learn point city play toward five using himself usually money seen car morning"
).split()


def calibration_sample(seed: int = 0, words: int = 400) -> str:
    """A fixed sample of the synthetic vocabulary for measuring tokens per word."""
    return " ".join(random.Random(seed).choices(_WORDS, k=words))


def _draw(rng: random.Random, lo_hi: tuple[int, int]) -> int:
    lo, hi = lo_hi
    return lo if lo == hi else rng.randint(lo, hi)


class LengthSampler:
    """The lengths of a ramp's requests in the order they are sent — the one rule the
    load generator sends by and the planner predicts with (app.planner.predict): the
    i-th call of :meth:`next` draws the prompt length, then ``max_tokens``, each
    uniformly from its :meth:`RampSpec.length_range` (inclusive, tokens), from
    ``random.Random(seed)`` (``spec.seed`` unless given). One sampler serves a whole
    ramp, level after level.

    With a dataset (``RampSpec.prompts_file``) the requests are its entries, sampled
    with the same generator: each pass over the dataset in a fresh random order (every
    entry once a pass, so a ramp's lengths follow the dataset's); the prompt length is
    the entry's (estimated, :func:`app.loadgen.datasets.estimate_tokens`) and
    ``max_tokens`` its answer's length capped at ``output_cap``
    (:func:`app.loadgen.datasets.output_of`), or, for an entry without an answer, drawn
    from the ``output_tokens`` range as above."""

    def __init__(self, prompt_range: tuple[int, int], output_range: tuple[int, int], seed: int = 0,
                 dataset: Dataset | None = None, output_cap: int | None = None) -> None:
        self.prompt_range, self.output_range = prompt_range, output_range
        self.rng = random.Random(seed)
        self.dataset, self.output_cap = dataset, output_cap
        self._order: list[int] = []

    @classmethod
    def of(cls, spec: Workload, seed: int | None = None) -> "LengthSampler":
        return cls(spec.length_range("prompt_tokens"), spec.length_range("output_tokens"),
                   spec.seed if seed is None else seed, spec.dataset(), spec.output_cap)

    def next_entry(self) -> tuple[Entry | None, int, int]:
        """(the dataset's entry or None, prompt tokens, max_tokens) of the next request."""
        if self.dataset is None:
            return None, _draw(self.rng, self.prompt_range), _draw(self.rng, self.output_range)
        if not self._order:
            self._order = list(range(len(self.dataset.entries)))
            self.rng.shuffle(self._order)
        e = self.dataset.entries[self._order.pop()]
        out = output_of(e, self.output_cap)
        return e, e.prompt_tokens, _draw(self.rng, self.output_range) if out is None else out

    def next(self) -> tuple[int, int]:
        """(prompt tokens, max_tokens) of the next request."""
        return self.next_entry()[1:]


def planned_lengths(spec: Workload, n: int | None = None) -> list[tuple[int, int]]:
    """(prompt tokens, max_tokens) of the first ``n`` requests ``spec`` sends
    (:class:`LengthSampler`, the ramp's seed): the lengths shown and stored before a
    run (:func:`app.loadgen.datasets.length_histogram`). ``n`` None: the dataset's size
    within 2,000–20,000 (a dataset of up to 20,000 entries once each), 2,000 without one."""
    s = LengthSampler.of(spec)
    if n is None:
        n = min(20_000, max(2_000, len(s.dataset.entries))) if s.dataset is not None else 2_000
    return [s.next() for _ in range(n)]


def dataset_lengths(spec: Workload) -> dict | None:
    """The lengths a dataset ramp sends, stored with its run and exported with its result:
    ``{"source", "format", "entries", "skipped", "truncated", "prompt", "output"}`` —
    ``prompt``/``output`` the histograms of :func:`planned_lengths`
    (:func:`app.loadgen.datasets.length_histogram`: n, mean, p50, p90, max, edges,
    counts; tokens). None without a dataset."""
    ds = spec.dataset()
    if ds is None:
        return None
    return {"source": str(spec.prompts_file), "format": ds.format, "entries": len(ds.entries),
            "skipped": ds.skipped, "truncated": ds.truncated, **length_histogram(planned_lengths(spec))}


#: what :func:`fit_context` leaves for the estimate's error and a chat template: 10 % of
#: the prompt and 16 tokens (a word is 1–1.5 tokens of the usual vocabularies; Llama 3's
#: chat template adds about 10 tokens a message)
CONTEXT_MARGIN = (0.10, 16)


def fit_context(prompt_tokens: int, max_tokens: int, max_model_len: int) -> int:
    """``max_tokens`` of a dataset request cut so that the prompt (estimated tokens, plus
    :data:`CONTEXT_MARGIN`) and the output fit the server's ``max_model_len`` (from
    ``/v1/models``), at least 1: a dataset's long tail (ShareGPT's, the built-in's) may
    exceed a small model's context, which vLLM answers with HTTP 400. The planner does
    not cut (it sizes the plan's own max_model_len)."""
    room = max_model_len - math.ceil(prompt_tokens * (1 + CONTEXT_MARGIN[0])) - CONTEXT_MARGIN[1]
    return max(1, min(max_tokens, room))


def needs_calibration(spec: Workload) -> bool:
    """Whether the ramp sends synthetic words (no dataset, or a built-in one), whose
    count the runner scales by the model's measured tokens per word."""
    ds = spec.dataset()
    return ds is None or ds.synthetic


class SharedPrefixes:
    """The shared prefixes of a shared-prefix ramp (``RampSpec.shared_prefix``) and the
    rule choosing which request starts with which: ``count`` texts of ``tokens`` of the
    model's tokens each (synthetic words, ``tokens / tokens_per_word`` of them), made once
    from ``Random(f"shared-prefix:{seed}")``; :meth:`next` draws, for each request in the
    order sent (each conversation, in a multi-turn ramp), whether it gets one (probability
    ``fraction``) and which (uniform) from ``Random(f"shared-prefix-choice:{seed}")`` — a
    stream of its own, so the lengths (:class:`LengthSampler`) are drawn as without it.
    The planner draws with the same rule (app.planner.predict)."""

    def __init__(self, sp: SharedPrefix, seed: int = 0, tokens_per_word: float = 1.0) -> None:
        self.spec = sp
        rng = random.Random(f"shared-prefix:{seed}")
        k = max(1, round(sp.tokens / (tokens_per_word if tokens_per_word > 0 else 1.0)))
        self.texts = [" ".join(rng.choices(_WORDS, k=k)) for _ in range(sp.count)]
        self.rng = random.Random(f"shared-prefix-choice:{seed}")

    def next(self) -> int | None:
        """The index of the prefix the next request starts with, or None (no prefix)."""
        if self.rng.random() >= self.spec.fraction:
            return None
        return self.rng.randrange(self.spec.count)


#: tokens a chat turn adds around its messages besides their text (role headers of the
#: user message and the assistant reply; Llama-3's template spends 4–5 per message) —
#: the margin :meth:`RequestFactory.next_turn` keeps below ``max_model_len``
TURN_OVERHEAD_TOKENS = 16


@dataclass
class Conversation:
    """One user's conversation in a multi-turn ramp. ``turns``: the turns it will have
    (drawn: :meth:`RequestFactory.new_conversation`); ``turn``: the turns sent so far
    (the number of the turn in flight while one is); ``messages``: the chat history
    (``[{"role", "content"}]``, the assistant's replies as received); ``transcript``: the
    same as one text (completions endpoint); ``tokens``: the history's length in tokens
    after the last reply (the server's usage ``prompt_tokens + completion_tokens`` when
    sent, else the estimate); ``prefix``: the shared prefix it started with (None)."""

    turns: int
    turn: int = 0
    messages: list = field(default_factory=list)
    transcript: str = ""
    tokens: int = 0
    prefix: int | None = None

    @property
    def done(self) -> bool:
        return self.turn >= self.turns

    def reply(self, text: str, prompt_tokens: int | None, output_tokens: int, est_prompt: int) -> None:
        """The reply to the turn in flight arrived: ``text`` as received, the token counts
        of the request (``prompt_tokens`` None: the estimate ``est_prompt`` stands)."""
        self.messages.append({"role": "assistant", "content": text})
        self.transcript += text
        self.tokens = (prompt_tokens if prompt_tokens is not None else est_prompt) + output_tokens


class RequestFactory:
    """Makes the JSON bodies (bytes) of a ramp's requests, deterministic for a seed.

    ``spec``: the RampSpec; ``model``: the served model name to put in the body;
    ``max_model_len``: the server's (tokens; bounds a conversation's history, None: no
    bound). :meth:`next` returns ``(body, estimated_prompt_tokens, max_tokens)``; in a
    multi-turn ramp :meth:`next_turn` returns the conversation too.
    """

    def __init__(self, spec: RampSpec, model: str, seed: int | None = None,
                 tokens_per_word: float | None = None, max_model_len: int | None = None) -> None:
        self.spec = spec
        self.max_model_len = max_model_len
        self.tokens_per_word = tokens_per_word if tokens_per_word and tokens_per_word > 0 else 1.0
        self.model = model
        self.rng = random.Random(spec.seed if seed is None else seed)  # the prompts' words
        self.lengths = LengthSampler.of(spec, seed)
        seed_ = spec.seed if seed is None else seed
        self.prefixes = (SharedPrefixes(spec.shared_prefix, seed_, self.tokens_per_word)
                         if spec.shared_prefix is not None else None)
        self.turns_rng = random.Random(f"turns:{seed_}")  # each conversation's turn count
        #: conversations ended before their drawn turns because the next turn would not fit max_model_len
        self.cut_conversations = 0

    def _words(self, n: int) -> str:
        """A synthetic prompt of about ``n`` of the model's tokens."""
        return " ".join(self.rng.choices(_WORDS, k=max(1, round(n / self.tokens_per_word))))

    def _with_prefix(self, idx: int | None, text: str, est: int) -> tuple[str, int]:
        """``text`` after shared prefix ``idx`` (a blank line between; None: unchanged).
        In a chat the prefix opens the user message (not a system message: some models'
        chat templates refuse the system role)."""
        if idx is None or self.prefixes is None:
            return text, est
        return self.prefixes.texts[idx] + "\n\n" + text, est + self.prefixes.spec.tokens

    def next(self) -> tuple[bytes, int, int]:
        entry, n, max_tokens = self.lengths.next_entry()
        if entry is not None and self.max_model_len:
            max_tokens = fit_context(n, max_tokens, self.max_model_len)
        if entry is not None and entry.prompt is not None:  # a dataset's own prompt (no shared prefix: refused)
            return self._body(entry.prompt, max_tokens), n, max_tokens
        prompt, est = self._prompt(n)
        if self.prefixes is not None:
            prompt, est = self._with_prefix(self.prefixes.next(), prompt, est)
        return self._body(prompt, max_tokens), est, max_tokens

    def _prompt(self, n: int) -> tuple[str, int]:
        """A synthetic prompt of about ``n`` tokens and its estimated length (``n``)."""
        return self._words(n), n

    def new_conversation(self) -> Conversation:
        """A fresh conversation: its turn count drawn uniformly from
        :meth:`RampSpec.turns_range` (``Random(f"turns:{seed}")``), its shared prefix (if
        any) from :class:`SharedPrefixes`."""
        lo, hi = self.spec.turns_range()
        conv = Conversation(turns=_draw(self.turns_rng, (lo, hi)))
        if self.prefixes is not None:
            conv.prefix = self.prefixes.next()
        return conv

    def next_turn(self, conv: Conversation | None) -> tuple[Conversation, bytes, int, int]:
        """The next request of a multi-turn user: ``(conversation, body, estimated prompt
        tokens, max_tokens)``. The user's next message has the ramp's prompt length (the
        lengths of :class:`LengthSampler`, drawn as for any request); the body holds the
        whole history. A new conversation starts when ``conv`` is None (the first, or the
        last one failed), has had all its turns, or its next turn would not fit
        ``max_model_len`` (history + new message + :data:`TURN_OVERHEAD_TOKENS` +
        ``max_tokens`` — counted in :attr:`cut_conversations`)."""
        n, max_tokens = self.lengths.next()
        text, est = self._prompt(n)
        if conv is not None and not conv.done and self.max_model_len is not None and (
                conv.tokens + est + TURN_OVERHEAD_TOKENS + max_tokens > self.max_model_len):
            self.cut_conversations += 1
            conv = None
        if conv is None or conv.done:
            conv = self.new_conversation()
        if conv.turn == 0:
            text, est = self._with_prefix(conv.prefix, text, est)
        conv.turn += 1
        conv.messages.append({"role": "user", "content": text})
        conv.transcript += ("\n\n" if conv.transcript else "") + text
        est += conv.tokens
        prompt = list(conv.messages) if self.spec.chat else conv.transcript
        return conv, self._body(prompt, max_tokens), est, max_tokens

    def _body(self, prompt: object, max_tokens: int) -> bytes:
        body: dict = {"model": self.model, "stream": True, "max_tokens": max_tokens,
                      "temperature": self.spec.temperature, "stream_options": {"include_usage": True}}
        if self.spec.ignore_eos:
            body["ignore_eos"] = True
        if self.spec.chat:
            body["messages"] = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        else:
            if isinstance(prompt, list):  # messages given but completions endpoint: flatten
                prompt = "\n".join(str(m.get("content", "")) for m in prompt if isinstance(m, dict))
            body["prompt"] = prompt
        return json.dumps(body).encode()
