"""Open-loop arrivals: when the requests of a request-rate level are sent.

One rule for the load generator (:mod:`app.loadgen.runner`, a ``mode: rate`` level) and
the planner's prediction of the same level (:mod:`app.planner.predict`, on the offline
engine), as :class:`app.loadgen.prompts.LengthSampler` is one rule for the lengths.

The gaps between arrivals are drawn as ``vllm bench serve --burstiness`` draws them
(vllm/benchmarks/serve.py ``get_request``, read in vLLM 0.32.0, the installed CPU
build; older releases kept it in benchmarks/benchmark_serving.py): gamma-distributed with
shape ``burstiness`` and scale ``1 / (rate · burstiness)`` (``np.random.gamma``) — mean
``1 / rate`` s, coefficient of variation ``1 / sqrt(burstiness)``. ``burstiness`` 1 is a
Poisson process (exponential gaps); below 1 the arrivals come in bursts, above 1 they are
more evenly spaced (vLLM's ``inf`` — gaps of exactly ``1 / rate`` — is not accepted
here: a large finite value such as 1000, CV 0.03, comes as close). vLLM then rescales a
fixed request count's gaps so that they last exactly ``count / rate``; a ramp level here
lasts a time, not a count, so the draws are used as they come.

Units: requests/s for rates, seconds for times. Seeded: level ``idx`` of a ramp with
``seed`` draws from ``random.Random(seed · 1000003 + idx)`` (the load generator's
stream for that level since the Poisson levels came in: a burstiness of 1 draws the
very same gaps, ``random.gammavariate(1, β)`` being ``random.expovariate(1/β)``).
"""
from __future__ import annotations

import random
from typing import Iterator


def level_rng(seed: int, idx: int) -> random.Random:
    """The random stream of level ``idx``'s arrivals for a ramp's ``seed``."""
    return random.Random(seed * 1000003 + idx)


def arrival_gap(rng: random.Random, rate: float, burstiness: float = 1.0) -> float:
    """One gap between arrivals, s: gamma(shape ``burstiness``, scale
    ``1 / (rate · burstiness)``) (vLLM's ``get_request``). Raises ValueError for a rate
    or burstiness that is not > 0."""
    if not rate > 0:
        raise ValueError(f"request rate {rate}: a rate level is > 0 req/s")
    if not burstiness > 0:
        raise ValueError(f"burstiness {burstiness}: give a number > 0 (1 = Poisson)")
    return rng.gammavariate(burstiness, 1.0 / (rate * burstiness))


def arrival_times(rate: float, burstiness: float = 1.0, seed: int = 0, idx: int = 0) -> Iterator[float]:
    """The send times of level ``idx``'s requests, s from the level's start (the first
    one gap after it), without end: the cumulative sums of :func:`arrival_gap`."""
    rng = level_rng(seed, idx)
    t = 0.0
    while True:
        t += arrival_gap(rng, rate, burstiness)
        yield t


#: a rate level whose achieved (sent) rate is below this fraction of the offered one is
#: marked short (issue 20: the client or the server could not keep up)
SHORT_FRACTION = 0.95
