"""The agent's protocol: one JSON object per line over the SSH channel's stdin/stdout.

No port is opened for it: the app starts ``vllm-dyno agent`` over SSH (or as a local
process for ``localhost``) and the two talk over the channel. Every message is a JSON
object with ``op``; a request from the app carries ``id`` and its reply echoes it.

Agent → app, unasked:

- ``hello`` (first line): ``protocol``, ``version`` (vllm-dyno), ``hostname``, ``pid``,
  ``python`` (the agent's interpreter), ``t`` (agent monotonic s), ``cards`` (NVML:
  ``index``, ``name``, ``memory_total_bytes``, ``memory_used_bytes``,
  ``compute_capability``), ``nvml`` (None, or why NVML is not there), ``cpu``
  (``cores``, ``memory_total_gib``, ``memory_available_gib``, ``node``: what the CPU
  build of vLLM would run on, app.planner.cards).
- ``samples``: ``samples`` = ``[[t, source, name, value], …]`` (t agent monotonic s,
  value None for a gap) — the host and GPU samplers of app.telemetry.
- ``log``: ``part``, ``stream``, ``text``, ``t`` — a line of a part the agent launched
  (``part``: ``server``, or ``ray`` — the host's Ray node, app.hosts.agent.PARTS).
- ``state``: ``part``, ``state``, ``t``, ``reason`` — that part's state (app.server.supervisor).

App → agent (reply op in brackets): ``ping`` {``t0``} (``pong`` {``t0``, ``t1``,
``t2``}), ``probe`` {``python``, ``model``} (``probed`` {``vllm`` (with ``cpu_build`` and ``ray``:
Ray's version for that interpreter or null), ``shm``, ``interfaces``, ``model``}), ``watch`` {``interval``, ``gpu_interval``} (``watching`` {``gpu``}),
``launch`` {``part``, ``engine``, ``config``, ``python``, ``sim_args``, ``expose``, ``fill_defaults``}
(``launched`` {``part``, ``pid``, ``pgid``, ``port``, ``url``, ``argv``, ``defaults``}), ``stop`` {``grace``}
(``stopped`` {``leftovers``}: every part stopped), ``bye`` (``bye``; the agent then stops its server and
exits). A request that fails is answered ``error`` {``message``}.

The clock offset (:func:`clock_sample`, :func:`best_offset`): the NTP on-wire exchange
(RFC 5905 §8): the app sends at t0 (its monotonic clock), the agent receives at t1 and
answers at t2 (its monotonic clock), the app receives at t3. offset = ((t1 − t0) +
(t2 − t3)) / 2 is the agent's clock minus the app's, exact when the two legs take
equally long and wrong by at most delay / 2 otherwise, delay = (t3 − t0) − (t2 − t1);
of several exchanges the one with the least delay is kept (RFC 5905 §10, the clock
filter). A sample the agent stamped ``t`` (its clock) lands on the session clock at
``t − offset − session.t0``.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from app.telemetry.series import Sample

#: the protocol's version: the app and the agent must speak the same (2: parts — a
#: host's Ray node beside its server — and Ray's version in the probe)
PROTOCOL = 2
#: the longest line either side accepts, bytes (a hello with 8 cards is ≈ 2 KiB)
MAX_LINE = 1 << 20


class ProtocolError(ValueError):
    """A line that is not a protocol message (not JSON, not an object, no ``op``)."""


def encode(msg: dict[str, Any]) -> bytes:
    """One message as one line (UTF-8 JSON, no NaN: gaps are null)."""
    return json.dumps(msg, separators=(",", ":"), allow_nan=False).encode() + b"\n"


def decode(line: bytes | str) -> dict[str, Any]:
    """One line as a message. Raises :class:`ProtocolError` naming what is wrong."""
    if len(line) > MAX_LINE:
        raise ProtocolError(f"a line of {len(line)} bytes (at most {MAX_LINE})")
    text = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
    try:
        msg = json.loads(text)
    except ValueError as e:
        raise ProtocolError(f"not JSON ({e}): {text[:120]!r}") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("op"), str):
        raise ProtocolError(f"not a message (an object with op): {text[:120]!r}")
    return msg


def samples_to_wire(samples: Iterable[Sample]) -> list[list[Any]]:
    """Samples as ``[t, source, name, value]`` rows; NaN (a gap) becomes None."""
    return [[s.t, s.source, s.name, None if math.isnan(s.value) else s.value] for s in samples]


def samples_from_wire(rows: Sequence[Sequence[Any]], shift: float = 0.0) -> list[Sample]:
    """Rows of a ``samples`` message as samples, ``t + shift`` (seconds; the agent's clock
    to the session clock: ``shift = −offset − session.t0``); None becomes NaN. Raises
    ProtocolError for a malformed row."""
    out = []
    for row in rows:
        try:
            t, source, name, value = row
            out.append(Sample(float(t) + shift, str(source), str(name),
                              math.nan if value is None else float(value)))
        except (TypeError, ValueError):
            raise ProtocolError(f"a sample row that is not [t, source, name, value]: {row!r}") from None
    return out


@dataclass(frozen=True)
class ClockSample:
    """One ping exchange: ``t0`` sent and ``t3`` answer received (app clock, s), ``t1``
    received and ``t2`` answered (agent clock, s)."""

    t0: float
    t1: float
    t2: float
    t3: float

    @property
    def offset(self) -> float:
        """The agent's clock minus the app's, s: ((t1 − t0) + (t2 − t3)) / 2 (RFC 5905 §8)."""
        return ((self.t1 - self.t0) + (self.t2 - self.t3)) / 2

    @property
    def delay(self) -> float:
        """The round trip without the agent's own time, s: (t3 − t0) − (t2 − t1)."""
        return (self.t3 - self.t0) - (self.t2 - self.t1)


def clock_sample(t0: float, t1: float, t2: float, t3: float) -> ClockSample:
    """A :class:`ClockSample`; raises ValueError when the stamps contradict themselves
    (answered before received, or received back before sent)."""
    if t2 < t1 or t3 < t0:
        raise ValueError(f"clock stamps out of order: t0={t0} t1={t1} t2={t2} t3={t3}")
    return ClockSample(t0, t1, t2, t3)


@dataclass(frozen=True)
class ClockOffset:
    """A host's clock against the app's: ``offset_s`` (its clock − the app's, s),
    ``bound_s`` (the true offset lies within ± this: delay / 2 of the exchange used),
    ``rtt_s`` (that exchange's delay), ``rtt_median_s`` (the median delay of all
    ``exchanges``)."""

    offset_s: float
    bound_s: float
    rtt_s: float
    rtt_median_s: float
    exchanges: int

    def describe(self) -> str:
        return (f"clock offset {self.offset_s * 1e3:+.3f} ms ± {self.bound_s * 1e3:.3f} ms "
                f"(round trip {self.rtt_s * 1e3:.3f} ms, median {self.rtt_median_s * 1e3:.3f} ms, "
                f"{self.exchanges} pings)")

    def to_dict(self) -> dict[str, float]:
        return {"offset_s": self.offset_s, "bound_s": self.bound_s, "rtt_s": self.rtt_s,
                "rtt_median_s": self.rtt_median_s, "exchanges": self.exchanges}


def best_offset(samples: Sequence[ClockSample]) -> ClockOffset:
    """The offset of the exchange with the least delay (RFC 5905's clock filter); the
    bound is half that delay. Raises ValueError for no samples."""
    if not samples:
        raise ValueError("no ping exchange to measure a clock offset from")
    best = min(samples, key=lambda s: s.delay)
    delays = sorted(s.delay for s in samples)
    n = len(delays)
    median = delays[n // 2] if n % 2 else (delays[n // 2 - 1] + delays[n // 2]) / 2
    return ClockOffset(best.offset, best.delay / 2, best.delay, median, n)
