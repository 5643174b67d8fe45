"""Request bodies for a ramp: synthetic prompts of about N tokens, or prompts from JSONL.

Synthetic prompts are words drawn at random from common English words that are one
token each in the usual BPE vocabularies (Llama, Qwen, Mistral, GPT). Where the server
can tokenize (vLLM's ``/tokenize``), the runner measures the model's tokens per word
on a sample and the word count is scaled so a prompt has about N of the model's
tokens; the record keeps the server's own count from the usage chunk. Words are
drawn per request, so prompts share no long prefix (prefix caching does not flatter
TTFT).
"""
from __future__ import annotations

import json
import random

from app.loadgen.spec import RampSpec, load_prompts

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
    ramp, level after level."""

    def __init__(self, prompt_range: tuple[int, int], output_range: tuple[int, int], seed: int = 0) -> None:
        self.prompt_range, self.output_range = prompt_range, output_range
        self.rng = random.Random(seed)

    @classmethod
    def of(cls, spec: RampSpec, seed: int | None = None) -> "LengthSampler":
        return cls(spec.length_range("prompt_tokens"), spec.length_range("output_tokens"),
                   spec.seed if seed is None else seed)

    def next(self) -> tuple[int, int]:
        """(prompt tokens, max_tokens) of the next request."""
        return _draw(self.rng, self.prompt_range), _draw(self.rng, self.output_range)


class RequestFactory:
    """Makes the JSON bodies (bytes) of a ramp's requests, deterministic for a seed.

    ``spec``: the RampSpec; ``model``: the served model name to put in the body.
    :meth:`next` returns ``(body, estimated_prompt_tokens, max_tokens)``.
    """

    def __init__(self, spec: RampSpec, model: str, seed: int | None = None,
                 tokens_per_word: float | None = None) -> None:
        self.spec = spec
        self.tokens_per_word = tokens_per_word if tokens_per_word and tokens_per_word > 0 else 1.0
        self.model = model
        self.rng = random.Random(spec.seed if seed is None else seed)  # the prompts' words
        self.lengths = LengthSampler.of(spec, seed)
        self.file_prompts = load_prompts(spec.prompts_file) if spec.prompts_file else None
        self._i = 0

    def _prompt(self, n: int) -> tuple[object, int]:
        """(prompt string or messages list, estimated prompt tokens) for a drawn length
        of ``n`` tokens (a prompts file's own prompts instead)."""
        if self.file_prompts:
            p = self.file_prompts[self._i % len(self.file_prompts)]
            self._i += 1
            if "messages" in p:
                text = " ".join(str(m.get("content", "")) for m in p["messages"] if isinstance(m, dict))
                return p["messages"], max(1, len(text.split()))
            return p["prompt"], max(1, len(p["prompt"].split()))
        words = self.rng.choices(_WORDS, k=max(1, round(n / self.tokens_per_word)))
        return " ".join(words), n

    def next(self) -> tuple[bytes, int, int]:
        n, max_tokens = self.lengths.next()
        prompt, est = self._prompt(n)
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
        return json.dumps(body).encode(), est, max_tokens
