"""The load-generator process: ``helper_argv("app.loadgen.worker")``.

Protocol (parent = :class:`app.loadgen.generator.LoadGenerator`):

- stdin, first line: JSON ``{"spec": RampSpec, "t0": session-clock origin}``; later
  lines: ``abort``. End of stdin (the parent died or closed it) also aborts.
- stdout: frames of a 4-byte big-endian length + a pickle of ``(kind, payload)``:
  ``("records", [RequestRecord tuples])`` in batches (every 0.1 s or 512 records),
  ``("event", dict)`` (preflight / level_start / level_end / done) and
  ``("error", message)`` for a fatal error such as a failed pre-flight check.
  Records are always sent before the event that follows them, so an abort loses no
  completed request. Anything else the process prints goes to stderr.

Signals (issue 15, item 9): the process ignores SIGINT — a Ctrl-C at the terminal is the
app's to handle, and the app stops the ramp through stdin, so the level in progress is
kept (marked partial) instead of a ``KeyboardInterrupt`` traceback; it is also started in
its own process group (:class:`app.loadgen.generator.LoadGenerator`), so the terminal's
SIGINT does not reach it at all. SIGTERM from outside stops the ramp as an abort does,
with the reason said.
"""
from __future__ import annotations

import signal

if __name__ == "__main__":  # before the heavier imports below: a Ctrl-C now must not print a traceback
    signal.signal(signal.SIGINT, signal.SIG_IGN)

import asyncio
import json
import os
import pickle
import queue
import struct
import sys
import threading
import traceback
from typing import IO, Any, Callable, Coroutine, Iterator

from app.loadgen.client import PreflightError, time_feeds
from app.loadgen.records import RequestRecord
from app.loadgen.runner import Ramp
from app.loadgen.spec import RampSpec

BATCH_SECONDS = 0.1
BATCH_MAX = 512


def write_frame(f: IO[bytes], kind: str, payload: object) -> None:
    data = pickle.dumps((kind, payload), protocol=pickle.HIGHEST_PROTOCOL)
    f.write(struct.pack(">I", len(data)) + data)
    f.flush()


def read_frame(f: IO[bytes]) -> tuple[str, Any] | None:
    """Read one frame ``(kind, payload)`` from a binary file; None at end of stream."""
    head = f.read(4)
    if len(head) < 4:
        return None
    (n,) = struct.unpack(">I", head)
    data = f.read(n)
    if len(data) < n:
        return None
    return pickle.loads(data)


#: the stop reason of a ramp ended by a SIGTERM from outside the app
SIGTERM_REASON = "the load generator was sent SIGTERM (not by vLLM Dyno); the ramp stopped"


def stdin_lines(fd: int = 0) -> Iterator[bytes]:
    """The lines of ``fd`` (each with its ``\\n``; the last one without it when the input
    ends there), read with ``os.read``: a thread blocked in ``sys.stdin.buffer`` holds the
    lock of its BufferedReader, which CPython's shutdown must take, so a worker whose ramp
    ended while the app still held its stdin open died at exit with "Fatal Python error:
    _enter_buffered_busy" (SIGABRT, a core file where core dumps are on)."""
    buf = b""
    while True:
        chunk = os.read(fd, 4096)
        if not chunk:
            if buf:
                yield buf
            return
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            yield line + b"\n"


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the app stops the ramp (stdin), not the terminal
    # keep the real stdout for frames; anything printed goes to stderr
    out = os.fdopen(os.dup(1), "wb", buffering=1 << 16)
    os.dup2(2, 1)
    lines = stdin_lines()
    first = next(lines, b"")
    if not first:
        return 2
    try:
        msg = json.loads(first)
        spec = RampSpec.model_validate(msg["spec"])
        t0 = float(msg["t0"])
    except Exception as e:  # bad input from the parent: report, don't hang
        write_frame(out, "error", f"bad ramp request: {e}")
        return 2

    frames: queue.SimpleQueue = queue.SimpleQueue()

    def writer() -> None:
        while True:
            item = frames.get()
            if item is None:
                break
            try:
                write_frame(out, *item)
            except (BrokenPipeError, OSError):
                break

    wt = threading.Thread(target=writer, name="frames", daemon=True)
    wt.start()
    runner: Callable[[Coroutine[Any, Any, None]], None]
    try:
        import uvloop  # optional (extra "bench"): a faster event loop

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    rc = 0
    try:
        runner(_amain(spec, t0, frames, lines))
    except Exception as e:
        if isinstance(e, PreflightError):
            frames.put(("error", str(e)))
        else:
            frames.put(("error", f"load generator failed: {type(e).__name__}: {e}"))
            traceback.print_exc()
        rc = 1
    frames.put(None)
    wt.join(timeout=10)
    try:
        out.close()
    except OSError:
        pass
    return rc


async def _amain(spec: RampSpec, t0: float, frames: queue.SimpleQueue, lines: Iterator[bytes]) -> None:
    """The ramp; ``lines``: the rest of stdin (:func:`stdin_lines`), watched for ``abort``."""
    time_feeds()  # stream arrivals timed as aiohttp receives them (this process only)

    loop = asyncio.get_running_loop()
    abort = asyncio.Event()

    def watch_stdin() -> None:
        for line in lines:
            if line.strip() == b"abort":
                break
        loop.call_soon_threadsafe(abort.set)

    threading.Thread(target=watch_stdin, name="stdin-watch", daemon=True).start()
    batch: list[tuple] = []

    def flush() -> None:
        if batch:
            frames.put(("records", batch.copy()))
            batch.clear()

    def emit_record(rec: RequestRecord) -> None:
        batch.append(rec.to_tuple())
        if len(batch) >= BATCH_MAX:
            flush()

    def emit_event(ev: dict) -> None:
        flush()
        frames.put(("event", ev))

    async def ticker() -> None:
        while True:
            await asyncio.sleep(BATCH_SECONDS)
            flush()

    ramp = Ramp(spec, emit_record, emit_event, t0, abort)

    def on_term() -> None:
        ramp.abort_reason = ramp.abort_reason or SIGTERM_REASON
        abort.set()

    loop.add_signal_handler(signal.SIGTERM, on_term)
    tick = asyncio.create_task(ticker())
    try:
        await ramp.run()
    finally:
        tick.cancel()
        flush()


if __name__ == "__main__":
    sys.exit(main())
