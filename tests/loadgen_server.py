"""A small scripted OpenAI-compatible streaming server for load-generator tests.

Real aiohttp on 127.0.0.1, in a background thread with its own event loop. Tokens come
at known times: first token ``ttft`` s after the request arrived, then one every
``itl`` s (scheduled on absolute times, so sleep overshoot does not accumulate). It
counts requests in flight (``max_in_flight``), can answer HTTP 400 like vLLM for an
over-long prompt, send an error object mid-stream, drop the connection, or replay a
case's ``events``/``reads``.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field

from aiohttp import web

from app.engine.admission import REJECTED_MESSAGES, REJECTED_TYPE


@dataclass
class Script:
    ttft: float = 0.05
    itl: float = 0.01
    role_chunk: bool = False
    include_usage_default: bool = False
    max_model_len: int = 4096
    error_after: int | None = None  # send an error object after this many tokens
    drop_after: int | None = None  # close the connection after this many tokens
    events: list | None = None  # [[t, payload], …] replayed as-is
    reads: list | None = None  # raw byte chunks replayed with read_gap between them
    read_gap: float = 0.03
    hold: float | None = None  # keep every stream open this long before the first token
    fail_fraction: float = 0.0  # this share of the requests (evenly spread) get HTTP 500, as from a dying engine
    #: this share of the requests (evenly spread) get vLLM's admission-control 503 (app.engine.admission),
    #: with ``Retry-After: retry_after`` when set (vLLM sends none)
    reject_fraction: float = 0.0
    retry_after: str | None = None


@dataclass
class ScriptedServer:
    script: Script = field(default_factory=Script)
    model: str = "scripted"

    def __post_init__(self):
        self.in_flight = 0
        self.max_in_flight = 0
        self.n_requests = 0
        self.rejected: list[int] = []  # the 1-based numbers of the requests answered 503
        self.bodies: list[dict] = []
        self.timings: list[tuple[float, list[float]]] = []  # (arrival, [write times]) per streamed request
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    # ---- lifecycle ---------------------------------------------------------------
    def __enter__(self) -> "ScriptedServer":
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("scripted server did not start")
        return self

    def __exit__(self, *exc) -> None:
        self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.loop.run_until_complete(self._main())
        self.loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._complete)
        app.router.add_post("/v1/chat/completions", self._complete)
        runner = web.AppRunner(app, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    # ---- handlers ----------------------------------------------------------------
    async def _models(self, request):
        return web.json_response({"object": "list", "data": [{"id": self.model, "max_model_len": self.script.max_model_len}]})

    async def _complete(self, request):
        t_in = time.monotonic()
        body = await request.json()
        self.bodies.append(body)
        self.n_requests += 1
        s = self.script
        if body.get("model") != self.model:
            return web.json_response({"error": {"message": f"The model `{body.get('model')}` does not exist.",
                                                "type": "NotFoundError", "code": 404}}, status=404)
        n = self.n_requests
        if s.reject_fraction and int(n * s.reject_fraction) > int((n - 1) * s.reject_fraction):
            self.rejected.append(n)
            return web.json_response({"error": {"message": REJECTED_MESSAGES["max_num_queued_reqs"],
                                                "type": REJECTED_TYPE, "param": None, "code": 503}}, status=503,
                                     headers={"Retry-After": s.retry_after} if s.retry_after else None)
        if s.fail_fraction and int(n * s.fail_fraction) > int((n - 1) * s.fail_fraction):
            return web.json_response({"error": {"message": "EngineCore encountered an issue. See stack trace (above) "
                                                "for the root cause.", "type": "InternalServerError", "code": 500}},
                                     status=500)
        prompt = body.get("prompt") or " ".join(m["content"] for m in body.get("messages", []))
        n_prompt = len(prompt.split())
        if n_prompt + body["max_tokens"] > s.max_model_len:
            msg = (f"This model's maximum context length is {s.max_model_len} tokens. However, you requested "
                   f"{n_prompt + body['max_tokens']} tokens ({n_prompt} in the messages, {body['max_tokens']} in "
                   "the completion). Please reduce the length of the messages or completion.")
            return web.json_response({"error": {"message": msg, "type": "BadRequestError", "param": None,
                                                "code": 400}}, status=400)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        writes: list[float] = []
        self.timings.append((t_in, writes))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await resp.prepare(request)
            if s.reads is not None:
                for i, chunk in enumerate(s.reads):
                    if i:
                        await asyncio.sleep(s.read_gap)
                    await resp.write(chunk.encode())
                return resp
            if s.events is not None:
                for t, payload in s.events:
                    await _sleep_until(t_in + t, self.in_flight <= 8)
                    await resp.write(f"data: {payload}\n\n".encode())
                return resp
            if s.hold:
                await asyncio.sleep(s.hold)
            chat = "messages" in body
            usage = (body.get("stream_options") or {}).get("include_usage") or s.include_usage_default
            if chat and s.role_chunk:
                await resp.write(_data({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}))
            n = body["max_tokens"]
            for i in range(n):
                if s.drop_after is not None and i == s.drop_after:
                    request.transport.close()
                    return resp
                if s.error_after is not None and i == s.error_after:
                    await resp.write(_data({"error": {"message": "EngineCore encountered an issue.", "code": 500}}))
                    await resp.write(b"data: [DONE]\n\n")
                    return resp
                await _sleep_until(t_in + s.ttft + i * s.itl, self.in_flight <= 8)
                fin = "length" if i == n - 1 else None
                ch = ({"index": 0, "delta": {"content": f" t{i}"}, "finish_reason": fin} if chat
                      else {"index": 0, "text": f" t{i}", "finish_reason": fin})
                await resp.write(_data({"id": "x", "choices": [ch]}))
                writes.append(time.monotonic())
            if usage:
                await resp.write(_data({"id": "x", "choices": [], "usage": {
                    "prompt_tokens": n_prompt, "completion_tokens": n, "total_tokens": n_prompt + n}}))
            await resp.write(b"data: [DONE]\n\n")
            return resp
        finally:
            self.in_flight -= 1


def _data(obj) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


async def _sleep_until(t: float, precise: bool = True) -> None:
    """Sleep until monotonic time ``t``. asyncio timers overshoot by up to ~1 ms (the
    selector's millisecond timeout); with ``precise`` the last 2 ms are spent yielding
    to the loop so the scripted delay is kept to ~0.1 ms (used at low concurrency)."""
    d = t - time.monotonic()
    if not precise:
        if d > 0:
            await asyncio.sleep(d)
        return
    if d > 0.002:
        await asyncio.sleep(d - 0.002)
    while time.monotonic() < t:
        await asyncio.sleep(0)
