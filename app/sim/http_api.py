"""vLLM's HTTP surface for the sim (aiohttp).

Routes: ``GET /health``, ``GET /version``, ``GET /v1/models``, ``POST /v1/completions``,
``POST /v1/chat/completions`` (streaming and not; ``usage``,
``stream_options.include_usage``, ``max_tokens`` / ``max_completion_tokens``,
``ignore_eos``), ``GET /metrics``, ``GET /sim/info``, ``GET /sim/telemetry``.
Shapes and error texts follow vLLM 0.32 (docs/vllm-facts.md, "HTTP").

Data parallel replicas: one :class:`SimEngine` per replica; each generation request is
routed, once its HTTP and tokenization time has passed, by vLLM's load balancer
(:class:`app.engine.balance.DpBalancer`, the offline engine's rule too); ``/metrics``
has each engine's series under its ``engine`` label, ``/sim/info``'s ``engine`` the
replicas' pacing figures combined and ``engines`` each one's.

Engine death (``die_at_request``, the rig's ``--sim-engine-dies-at-request``): on that
generation request the engine dies as vLLM's does on a fatal error in a forward pass —
the requests in flight and every later one get 500 with vLLM's ``EngineDeadError``
message, ``/health`` answers 503 (vllm/entrypoints/serve/instrumentator/health.py), and
``on_engine_death`` (the server: its log lines, its exit) is called once.

Admission control (``--max-num-queued-reqs`` / ``--max-num-queued-tokens``,
:mod:`app.engine.admission`): a generation request is judged before its HTTP and
tokenization time, as vLLM's ``_preflight`` judges it before rendering, against the
requests admitted and not yet finished — over every data parallel replica, as vLLM's API
servers count them together — and the prompts of those without a first token; a refused
one gets vLLM's 503 (its body, no ``Retry-After``) and adds 1 to
``vllm:admission_rejections_total{reason=…}``. Deviations: vLLM checks twice — before
rendering (HTTP 503) and again when it registers the request after tokenization
(vllm/v1/engine/async_llm.py:569; a stream already begun then ends with a 503 error event,
which the load generator counts as a rejection too); the sim (and the planner,
app.engine.offline) checks once, counting a request from its check on, so its refusals
are all HTTP 503s. With data parallel vLLM starts one API
server per replica and each judges ``--max-num-queued-tokens`` on its own share of the
requests; the sim's one front end judges it on all of them.

Reasoning (``reasoning_tokens`` N, the rig's ``--sim-reasoning-tokens``): a chat
completion's first N generated tokens are the model's reasoning — streamed as
``delta.reasoning`` (vLLM 0.32's ``DeltaMessage.reasoning``,
vllm/entrypoints/generate/base/protocol.py:359, what a reasoning parser fills), the rest as
``delta.content``; a step whose tokens straddle the boundary sends two events. Without
streaming the message carries ``reasoning`` and ``content``. ``usage`` counts both, as
vLLM's does. Completions (no chat template, no parser) have none.

Tokens: the sim has no tokenizer. A prompt given as a list of token ids counts its
length; a text counts one token per word and per punctuation mark (regex
``\\w+|[^\\w\\s]``). Generated text is filler, one word per token, so the counts in
``usage`` are exact for the tokens the engine simulated. Those words and marks are the
tokens' identity for the prefix cache (:func:`prompt_tokens`, ``--enable-prefix-caching``,
on by default as in vLLM V1): a chat is rendered as a Llama-3-like template — a
begin-of-text token, each message as a 4-token role header and its content, then the
assistant's header — so a conversation's next turn repeats the previous request's tokens
and the reply it generated (the filler words the client received back).
"""
from __future__ import annotations

import asyncio

import json
import os
import re
import time
from typing import Callable

from aiohttp import web

from app.engine.admission import REJECTED_MESSAGES, REJECTED_TYPE, AdmissionLimits
from app.engine.balance import DpBalancer
from app.loadgen.records import REJECTED_STATUS
from app.sim import vlog
from app.sim.engine import SimEngine, Stream, combined_info

_TOKEN_RE = re.compile(r"\w+|[^\w\s]")
WORDS = ("the", "rig", "runs", "fast", "and", "every", "card", "keeps", "its", "cool", "while", "tokens",
         "flow", "through", "long", "steady", "batches")
CHAT_MESSAGE_OVERHEAD = 4  # role header tokens per message (Llama-3 template ≈ 4–5)
#: EngineDeadError's message (vllm/v1/engine/exceptions.py, 0.10–0.33), what a request gets once the engine died
ENGINE_DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."
#: what a generation request that arrives while the sim stops gets (503)
SHUTTING_DOWN_MESSAGE = "The server is shutting down."


def count_tokens(text: str) -> int:
    """Simulated token count of a text (words and punctuation marks)."""
    return len(_TOKEN_RE.findall(text))


def _header(role: object) -> list[str]:
    """A chat message's role header: :data:`CHAT_MESSAGE_OVERHEAD` tokens."""
    return ["<|start_header_id|>", str(role), "<|end_header_id|>", "\n\n"]


def prompt_tokens(prompt: object) -> list:
    """The simulated tokens of a prompt (their identity, for the prefix cache): a
    completions prompt's words and marks (or its token ids); a chat's ``messages`` as
    ``<|begin_of_text|>``, each message's :func:`_header` and content, and the
    assistant's header (1 + 4 + Σ(4 + content) tokens: the count :meth:`ApiServer.chat`
    gives)."""
    if isinstance(prompt, str):
        return _TOKEN_RE.findall(prompt)
    if isinstance(prompt, list) and all(isinstance(x, int) for x in prompt):
        return list(prompt)
    toks: list = ["<|begin_of_text|>"]
    for m in prompt if isinstance(prompt, list) else []:
        c = m.get("content") if isinstance(m, dict) else None
        if isinstance(c, list):
            c = " ".join(p.get("text", "") for p in c if isinstance(p, dict))
        toks += _header(m.get("role", "user") if isinstance(m, dict) else "user")
        toks += _TOKEN_RE.findall(c or "")
    return toks + _header("assistant")


def _error(status: int, message: str, typ: str = "BadRequestError", param: str | None = None) -> web.Response:
    return web.json_response({"error": {"message": message, "type": typ, "param": param, "code": status}},
                             status=status)


class ApiServer:
    """Routes bound to the replicas' :class:`SimEngine` (one, or a list: data parallel
    ranks in order, their ``on_done`` wired to ``balancer``). ``info`` is the static
    part of ``/sim/info``."""

    def __init__(self, engine: SimEngine | list[SimEngine], served_name: str, model: str, max_model_len: int,
                 info: dict, api_key: str | None = None, die_at_request: int | None = None,
                 on_engine_death: Callable[[], None] | None = None, balancer: DpBalancer | None = None,
                 admission: AdmissionLimits = AdmissionLimits(), reasoning_tokens: int = 0) -> None:
        self.engines = list(engine) if isinstance(engine, list) else [engine]
        self.engine = self.engines[0]  # its clock and time scale are every replica's
        self.balancer = balancer or DpBalancer(len(self.engines))
        self.served_name, self.model = served_name, model
        self.max_model_len = max_model_len
        self.static_info = info
        self.api_key = api_key
        self.created = int(time.time())
        self.die_at_request = die_at_request
        self.on_engine_death = on_engine_death
        self.requests = 0  # generation requests taken
        self.admission = admission
        self.reasoning_tokens = reasoning_tokens
        self._admitted: dict[int, int] = {}  # requests admitted, not yet in an engine (HTTP/tokenization): key → prompt
        self.dead = False
        self.stopping = False  # set by shutdown(): a request that comes in later is refused at once
        self._live: set[Stream] = set()

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth], client_max_size=64 * 2**20)
        app.router.add_get("/health", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        app.router.add_get("/sim/info", self.sim_info)
        app.router.add_get("/sim/telemetry", self.telemetry)
        return app

    @web.middleware
    async def _auth(self, request: web.Request, handler):
        if self.api_key and request.path.startswith("/v1"):
            if request.headers.get("Authorization", "") != f"Bearer {self.api_key}":
                return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    # ------------------------------------------------------------------ simple routes
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=503 if self.dead else 200)

    def shutdown(self) -> None:
        """The server stops (SIGTERM/SIGINT): every request in flight ends at once with an
        error, as vLLM's do with its default ``--shutdown-timeout`` 0 (its engine aborts
        them on SIGTERM: vllm/v1/engine/utils.py), so that the HTTP server can close. A
        generation request that arrives later (a closed-loop user re-sending before the
        listening socket is closed, or one still in its HTTP/tokenization time) gets 503 at
        once: the stopped engines would never serve it, and the HTTP server would wait for
        it until its shutdown timeout."""
        self.stopping = True
        for e in self.engines:
            e.stop()
        for s in list(self._live):
            if s.error is None and not s.finished:
                s.error = "The server is shutting down: the request was aborted."
                s.event.set()

    def _die(self) -> None:
        """The engine dies: every request in flight fails, later ones too."""
        self.dead = True
        for e in self.engines:
            e.stop()
        for s in list(self._live):
            s.error = ENGINE_DEAD_MESSAGE
            s.event.set()
        if self.on_engine_death is not None:
            self.on_engine_death()

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": self.static_info.get("vllm_version", "0.32.0")})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{
            "id": self.served_name, "object": "model", "created": self.created, "owned_by": "vllm",
            "root": self.model, "parent": None, "max_model_len": self.max_model_len,
            "sim": {"time_scale": self.engine.k}}]})

    async def metrics(self, request: web.Request) -> web.Response:
        for e in self.engines:
            m = e.metrics
            m.running.set(len(e.sched.running))
            m.waiting.set(len(e.sched.waiting))
            m.kv_usage.set(e.sched.kv_usage)
        return web.Response(body=self.engine.sim_metrics.render(), content_type="text/plain", charset="utf-8",
                            headers={"X-Content-Type-Version": "0.0.4"})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        """``POST /reset_prefix_cache``: vLLM's dev-mode route
        (vllm/entrypoints/serve/dev/cache/api_router.py @ 0.32.0, served there only with
        ``VLLM_SERVER_DEV_MODE=1``; the sim always serves it, so a ramp's levels start on an
        empty cache as the planner predicts them): ``{"success": bool}`` — false while any
        replica's blocks are held by requests (:meth:`Scheduler.reset_prefix_cache`)."""
        vlog.emit("Resetting prefix cache...", process="APIServer", where="api_router.py:38")
        ok = True
        for e in self.engines:
            if not e.sched.reset_prefix_cache():
                held = e.sched.num_blocks - e.sched.free_blocks
                vlog.emit(f"Failed to reset prefix cache because some blocks ({held}) are not freed yet",
                          level="WARNING", process=f"EngineCore_DP{e.index}", where="block_pool.py:839")
                ok = False
        return web.json_response({"success": ok})

    async def sim_info(self, request: web.Request) -> web.Response:
        """Static facts + pacing figures; ``?reset=1`` starts a new pacing window after reading."""
        infos = [e.info() for e in self.engines]
        body = {**self.static_info, "time_scale": self.engine.k, "pid": os.getpid(), "engine": combined_info(infos),
                "engines": infos}
        if request.query.get("reset"):
            for e in self.engines:
                e.reset_pacing()
        return web.json_response(body)

    async def telemetry(self, request: web.Request) -> web.Response:
        t = min(e.T if e.sched.has_work else e.rig_now() for e in self.engines)
        doc = self.engine.gpus.document(t)
        return web.Response(text=doc.to_json(), content_type="application/json")

    def route(self) -> SimEngine:
        """The replica a request reaching the engine client now goes to (vLLM's load
        balancer over the replicas' schedulers)."""
        return self.engines[self.balancer.choose(self.engine.rig_now(), self._counts)]

    def _counts(self) -> list[tuple[int, int, float]]:
        """Each replica's (waiting, running, KV cache usage), as the DP coordinator reads them."""
        return [(len(e.sched.waiting), len(e.sched.running), e.sched.kv_usage) for e in self.engines]

    # ------------------------------------------------------------------ generation
    async def _body(self, request: web.Request) -> dict | web.Response:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "The request body is not valid JSON.")
        if not isinstance(body, dict):
            return _error(400, "The request body must be a JSON object.")
        model = body.get("model")
        if model is not None and model not in (self.served_name, self.model):
            return _error(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
        if body.get("n", 1) != 1:
            return _error(400, "The sim serves n=1 only (one choice per request).", param="n")
        return body

    def _limits(self, body: dict, prompt_len: int) -> tuple[int, web.Response | None]:
        mml = self.max_model_len
        if prompt_len >= mml:
            return 0, _error(400, f"This model's maximum context length is {mml} tokens. However, your request "
                                  f"has {prompt_len} input tokens. Please reduce the length of the input messages.")
        mt = body.get("max_tokens", body.get("max_completion_tokens"))
        if mt is None:
            mt = mml - prompt_len
        if not isinstance(mt, int) or mt < 1:
            return 0, _error(400, f"max_tokens must be at least 1, got {mt}.", param="max_tokens")
        if prompt_len + mt > mml:
            return 0, _error(400, f"'max_tokens' or 'max_completion_tokens' is too large: {mt}. This model's maximum "
                                  f"context length is {mml} tokens and your request has {prompt_len} input tokens "
                                  f"({mt} > {mml} - {prompt_len}).")
        return mt, None

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            plen = count_tokens(prompt)
        elif isinstance(prompt, list) and all(isinstance(x, int) for x in prompt):
            plen = len(prompt)
        else:
            return _error(400, "prompt must be a string or a list of token ids (one prompt per request).",
                          param="prompt")
        if plen == 0:
            return _error(400, "The prompt cannot be empty.", param="prompt")
        return await self._generate(request, body, plen, chat=False, prompt=prompt)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            return _error(400, "messages must be a non-empty list.", param="messages")
        plen = 1 + CHAT_MESSAGE_OVERHEAD
        for m in msgs:
            c = m.get("content") if isinstance(m, dict) else None
            if isinstance(c, list):
                c = " ".join(p.get("text", "") for p in c if isinstance(p, dict))
            plen += CHAT_MESSAGE_OVERHEAD + count_tokens(c or "")
        return await self._generate(request, body, plen, chat=True, prompt=msgs)

    def _refusal(self) -> web.Response | None:
        """vLLM's admission check (:meth:`AdmissionLimits.refusal`) over the requests in
        the engines: the 503 it answers, counted by reason; None when admitted."""
        if not self.admission.active:
            return None
        live = [s for s in self._live if not s.finished and s.error is None]
        why = self.admission.refusal(len(live) + len(self._admitted),
                                     sum(s.req.prompt_len for s in live if s.counted == 0 and s.req)
                                     + sum(self._admitted.values()))
        if why is None:
            return None
        self.engine.sim_metrics.admission_rejections[why].inc()
        return _error(REJECTED_STATUS, REJECTED_MESSAGES[why], REJECTED_TYPE)

    async def _generate(self, request: web.Request, body: dict, plen: int, chat: bool,
                        prompt: object = None) -> web.StreamResponse:
        if not self.dead and not self.stopping:
            refused = self._refusal()  # vLLM's _preflight: before rendering, so before the length checks
            if refused is not None:
                return refused
        mt, err = self._limits(body, plen)
        if err is not None:
            return err
        key = id(request)
        if self.admission.active:
            self._admitted[key] = plen
        try:
            if self.engine.request_overhead_s > 0:  # HTTP and tokenization before the engine sees it
                await asyncio.sleep(self.engine.request_overhead_s / self.engine.k)
        finally:
            self._admitted.pop(key, None)  # from here on it is in _live (no await before), or answered
        if self.dead:
            return _error(500, ENGINE_DEAD_MESSAGE, "InternalServerError")
        if self.stopping:  # no await from here to the stream's registration in _live
            return _error(503, SHUTTING_DOWN_MESSAGE, "ServiceUnavailableError")
        eng = self.route()
        nw = len(WORDS)
        # the prompt's tokens then the filler words the engine will generate (hashed only with caching on)
        s = eng.submit(plen, mt, bool(body.get("ignore_eos", False)),
                       tokens=lambda: prompt_tokens(prompt) + [WORDS[i % nw] for i in range(mt)])
        self.requests += 1
        rid = ("chatcmpl-" if chat else "cmpl-") + f"{self.requests}{os.getpid():x}"
        self._live.add(s)
        if self.die_at_request is not None and self.requests >= self.die_at_request and not self.dead:
            self._die()
        try:
            if body.get("stream"):
                opts = body.get("stream_options") or {}
                return await self._stream(request, s, rid, chat, bool(opts.get("include_usage")))
            while not s.finished and s.error is None:
                await s.event.wait()
                s.event.clear()
            if s.error is not None:
                return _error(500, s.error, "InternalServerError")
            return web.json_response(self._full(s, rid, chat))
        finally:
            self._live.discard(s)
            eng.abort(s)  # no-op when finished

    def _full(self, s: Stream, rid: str, chat: bool) -> dict:
        r = s.req
        think = min(self.reasoning_tokens, r.output) if chat else 0
        text = "".join(" " + WORDS[i % len(WORDS)] for i in range(think, r.output))
        usage = {"prompt_tokens": r.prompt_len, "total_tokens": r.prompt_len + r.output, "completion_tokens": r.output}
        base = {"id": rid, "created": int(time.time()), "model": self.served_name, "usage": usage}
        if chat:
            message = {"role": "assistant", "content": text, "tool_calls": []}
            if think:
                message["reasoning"] = "".join(" " + WORDS[i % len(WORDS)] for i in range(think))
            return {**base, "object": "chat.completion", "choices": [{
                "index": 0, "message": message,
                "logprobs": None, "finish_reason": r.finish_reason, "stop_reason": None}]}
        return {**base, "object": "text_completion", "choices": [{
            "index": 0, "text": text, "logprobs": None, "finish_reason": r.finish_reason, "stop_reason": None}]}

    async def _stream(self, request: web.Request, s: Stream, rid: str, chat: bool, usage: bool) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        created = int(time.time())
        name = json.dumps(self.served_name)
        if chat:
            head = f'data: {{"id":"{rid}","object":"chat.completion.chunk","created":{created},"model":{name},' \
                   '"choices":[{"index":0,"delta":{"content":" '
            rhead = head.replace('"delta":{"content":" ', '"delta":{"reasoning":" ')
            mid = '"},"logprobs":null,"finish_reason":'
            tail = "}]}\n\n"
            await resp.write(f'data: {{"id":"{rid}","object":"chat.completion.chunk","created":{created},'
                             f'"model":{name},"choices":[{{"index":0,"delta":{{"role":"assistant","content":""}},'
                             '"logprobs":null,"finish_reason":null}]}\n\n'.encode())
        else:
            head = f'data: {{"id":"{rid}","object":"text_completion","created":{created},"model":{name},' \
                   '"choices":[{"index":0,"text":" '
            rhead = head
            mid = '","logprobs":null,"finish_reason":'
            tail = ',"stop_reason":null}]}\n\n'
        r = s.req
        sent = 0
        nw = len(WORDS)
        while True:
            await s.event.wait()
            s.event.clear()
            if s.error is not None:  # vLLM sends the error as a last event, then [DONE]
                err = json.dumps({"error": {"message": s.error, "type": "InternalServerError", "param": None,
                                            "code": 500}})
                try:
                    await resp.write(f"data: {err}\n\ndata: [DONE]\n\n".encode())
                except ConnectionResetError:
                    return resp
                break
            n = s.pending
            s.pending = 0
            if n == 0 and not s.finished:
                continue
            parts = []
            last = sent + n
            while s.chunks:  # one event per engine step, its tokens' text together (vLLM's delta)
                c = s.chunks.popleft()
                end = sent + c
                fin = f'"{r.finish_reason}"' if s.finished and end == last else "null"
                if chat and sent < self.reasoning_tokens:  # the reasoning part of the step (then its answer, if any)
                    cut = min(end, self.reasoning_tokens)
                    rfin = fin if cut == end else "null"
                    parts.append(f"{rhead}{' '.join(WORDS[i % nw] for i in range(sent, cut))}{mid}{rfin}{tail}")
                    sent = cut
                    if sent == end:
                        continue
                parts.append(f"{head}{' '.join(WORDS[i % nw] for i in range(sent, end))}{mid}{fin}{tail}")
                sent = end
            if s.finished:
                if usage:
                    obj = "chat.completion.chunk" if chat else "text_completion"
                    parts.append(f'data: {{"id":"{rid}","object":"{obj}","created":{created},"model":{name},'
                                 f'"choices":[],"usage":{{"prompt_tokens":{r.prompt_len},"total_tokens":'
                                 f'{r.prompt_len + r.output},"completion_tokens":{r.output}}}}}\n\n')
                parts.append("data: [DONE]\n\n")
            try:
                await resp.write("".join(parts).encode())
            except ConnectionResetError:  # the client went away: the caller aborts the request
                return resp
            if s.finished:
                break
        await resp.write_eof()
        return resp
