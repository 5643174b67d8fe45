"""Speculative decoding's acceptance: how many of k draft tokens the target model accepts.

The model: each draft position is accepted with the same conditional probability ``a``
given that every earlier position was (the acceptance rate), and the first rejection
ends the run — vLLM's rejection sampler keeps a leading run of drafts only
(``SpecDecodingStats.observe_draft`` in vllm/v1/spec_decode/metrics.py, 0.32, counts
position i as accepted only when i < the accepted count). So position i (1-based) is
accepted with probability a^i, which is what vLLM's per-position counters
``vllm:spec_decode_num_accepted_tokens_per_pos{position}`` ÷ ``vllm:spec_decode_num_drafts``
show falling off with the position (its own "Per-position acceptance rate" log line);
the EAGLE paper (Li et al. 2024, arXiv 2401.15077, the n-α figures) measures nearly the
same conditional rate at every position, the premise of the geometric form. Then a step
emits 1 + accepted tokens, in expectation 1 + a + a² + … + a^k (:func:`mean_accepted_length`,
vLLM's "Mean acceptance length", which counts the bonus token), and vLLM's acceptance
rate — accepted ÷ draft tokens — is (a + … + a^k)/k (:func:`draft_acceptance_rate`).
"""
from __future__ import annotations

import random
from typing import Callable

#: the acceptance rate a when none is given (the sim's ``--sim-spec-acceptance`` default and
#: the planner's prediction): assumed, inside the 0.6–0.8 per-position acceptance that
#: EAGLE reports on chat prompts (arXiv 2401.15077); n-gram lookup on unrepetitive text
#: accepts far less, on code edits or summaries more — measure it (`/metrics`) and set it
DEFAULT_ACCEPTANCE = 0.7


def check_acceptance(a: float, where: str = "--sim-spec-acceptance") -> float:
    """``a`` if it is a rate in [0, 1], else ValueError naming ``where`` and the fix."""
    try:
        x = float(a)
    except (TypeError, ValueError):
        raise ValueError(f"{where} {a!r}: give the draft acceptance rate, a number in [0, 1] such as 0.7") from None
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"{where} {a}: the draft acceptance rate is a probability in [0, 1], e.g. 0.7")
    return x


def geometric_accept(acceptance: float, rng: random.Random) -> Callable[[object, int], int]:
    """An ``accept(request, k)`` for :class:`app.engine.scheduler.Scheduler`: the leading
    run of k Bernoulli(``acceptance``) draws from ``rng`` (0…k drafts accepted)."""
    a = check_acceptance(acceptance, "acceptance")

    def accept(_req: object, k: int) -> int:
        n = 0
        while n < k and rng.random() < a:
            n += 1
        return n

    return accept


def expected_accepted(acceptance: float, k: int) -> float:
    """Expected drafts accepted per step out of ``k``: a + a² + … + a^k, tokens."""
    return sum(acceptance ** i for i in range(1, k + 1))


def mean_accepted_length(acceptance: float, k: int) -> float:
    """Expected tokens a decoding step emits: 1 + :func:`expected_accepted` (vLLM's
    "Mean acceptance length", bonus token included), tokens per step."""
    return 1.0 + expected_accepted(acceptance, k)


def draft_acceptance_rate(acceptance: float, k: int) -> float:
    """vLLM's acceptance rate (accepted ÷ draft tokens, ``vllm:spec_decode_num_accepted_tokens``
    ÷ ``vllm:spec_decode_num_draft_tokens``) that conditional rate ``acceptance`` gives with
    ``k`` drafts a step, 0–1."""
    return expected_accepted(acceptance, k) / k if k else 0.0


def acceptance_from_rate(rate: float, k: int) -> float:
    """The conditional acceptance a whose vLLM acceptance rate with ``k`` drafts a step is
    ``rate`` (accepted ÷ draft tokens, as ``/metrics`` gives it): the inverse of
    :func:`draft_acceptance_rate`, by bisection (it grows with a). 0–1."""
    r = min(max(float(rate), 0.0), 1.0)
    if k <= 0:
        return r
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if draft_acceptance_rate(mid, k) < r:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2
