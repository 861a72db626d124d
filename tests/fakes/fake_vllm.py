"""A fake vLLM 0.32 OpenAI server: a real HTTP/1.1 server on 127.0.0.1 whose behaviour tests set.

    with FakeVLLM(served_models=("tiny",), api_key="sk-backend-test") as fake:
        fake.behaviour.first_token_delay = 0.2         # plain attributes, read on every request
        fake.fail_next(2)                               # 500 engine-dead body, then normal answers
        fake.inject(ResetAfter(chunks=3))               # next generation: 3 SSE events, then TCP reset
        ... drive the gateway at fake.url ...
        assert fake.wait_for(lambda: fake.aborted == 1)
        assert fake.requests[-1].json["model"] == "tiny"

It runs its own event loop in a background thread, answers byte-for-byte like the captures in
../shared/vllm/captures.md (modulo ids, timestamps and generated text) and stops within
milliseconds, whatever its requests are doing.

Faults (`inject`) apply to the next matching requests, by default those to the generation routes,
after the API-key check and routing, before the body is validated:
  Respond(status, body, content_type)  answer this instead (a list of bytes is sent chunked, one write each)
  Hang()                               never answer; counts as an in-flight generation
  ResetAfter(chunks, rst=True)         stream `chunks` SSE events, then TCP RST (rst=False: FIN) without
                                       the chunked terminator; non-streaming: close without an answer
  StallAfter(chunks)                   stream `chunks` SSE events (after the headers), then nothing; a
                                       non-streaming request hangs
  MalformedSSE(after, payload)         write `payload` as an extra chunk after `after` events
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal

from tests.fakes import anthropic_api as anth
from tests.fakes import vllm_api as api
from tests.fakes.http11 import LAST_CHUNK, BadRequest, Connection, Request, chunk, response_head

GUARDED_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")  # vLLM's AuthenticationMiddleware
GENERATION_PATHS = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings", "/v1/messages"}
)
SSE_HEADERS = (
    ("content-type", "text/event-stream; charset=utf-8"),
    ("vary", "Origin"),
    ("transfer-encoding", "chunked"),
)
UNAUTHORIZED = b'{"error":"Unauthorized"}'
NOT_FOUND = b'{"detail":"Not Found"}'
METHOD_NOT_ALLOWED = b'{"detail":"Method Not Allowed"}'
EMPTY_CONVERSATION = "Cannot apply chat template to an empty conversation. Provide at least one message."


@dataclass(frozen=True)
class Respond:
    status: int = 500
    body: bytes | Sequence[bytes] = api.ENGINE_DEAD_BODY
    content_type: str | None = "application/json"
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Hang:
    pass


@dataclass(frozen=True)
class ResetAfter:
    chunks: int = 0
    rst: bool = True


@dataclass(frozen=True)
class StallAfter:
    chunks: int = 0


@dataclass(frozen=True)
class MalformedSSE:
    after: int = 1
    payload: bytes = b'data: {"id":"chatcmpl-broken","choices":[{"delta":\n\n'


Fault = Respond | Hang | ResetAfter | StallAfter | MalformedSSE


@dataclass
class Behaviour:
    """Knobs read on every request; assign them from any thread (single attribute writes are atomic)."""

    first_token_delay: float = 0.0  # seconds before the first token (streaming: after the headers)
    token_delay: float = 0.0  # seconds between tokens
    health_status: int = 200  # /health and /ping answer this, with an empty body
    api_keys: tuple[str, ...] | None = None  # None: no --api-key, nothing guarded
    num_requests_running: float | None = None  # /metrics value; None: the live in-flight count
    num_requests_waiting: float = 0.0
    kv_cache_usage_perc: float = 0.0


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    query: str
    headers: dict[str, str]  # lower-cased names
    body: bytes
    json: Any  # the parsed body, or None when it is not JSON


Outcome = Literal["completed", "aborted", "cut"]  # cut: the fake itself broke the connection


@dataclass
class _Tracker:
    """One generation in flight; `finish` books its outcome once (the first call wins)."""

    on_finish: Callable[[Outcome], None]
    finished: bool = False

    def finish(self, outcome: Outcome) -> None:
        if not self.finished:
            self.finished = True
            self.on_finish(outcome)


@dataclass
class _Slot:
    fault: Fault
    remaining: int | None
    paths: frozenset[str]


Handler = Callable[[Connection, Request, Fault | None], Awaitable[bool]]


class FakeVLLM:
    def __init__(
        self,
        served_models: Sequence[str] = ("tiny",),
        *,
        api_key: str | Sequence[str] | None = "sk-backend-test",
        max_model_len: int = 512,
        root: str = "./tiny-model",
        task: Literal["generate", "embed"] = "generate",
        default_max_tokens: int | None = 16,
        embedding_dim: int = 8,
        port: int = 0,
        auto_tool_choice: bool = False,
        cloud: bool = False,
    ) -> None:
        """`default_max_tokens`: tokens generated when a chat/responses request sets no limit (vLLM
        itself fills the context: pass None for that). `task="embed"` serves /v1/embeddings instead
        of the generation routes, like a pooling model."""
        self.served_models = tuple(served_models)
        self.max_model_len = max_model_len
        self.root = root
        self.task = task
        self.default_max_tokens = default_max_tokens
        self.embedding_dim = embedding_dim
        self.auto_tool_choice = auto_tool_choice  # --enable-auto-tool-choice --tool-call-parser ...
        self.cloud = cloud  # play a cloud OpenAI-compatible API: only the /v1/* routes exist (no /health, /metrics)
        keys = (api_key,) if isinstance(api_key, str) else None if api_key is None else tuple(api_key)
        self.behaviour = Behaviour(api_keys=keys)
        self._port = port
        self._cond = threading.Condition(threading.RLock())
        self._faults: list[_Slot] = []
        self._requests: list[RecordedRequest] = []
        self._errors: list[BaseException] = []
        self._in_flight = self._aborted = self._completed = 0
        self._prompt_tokens_total = self._generation_tokens_total = 0
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._server: asyncio.Server | None = None
        self._conns: set[Connection] = set()  # connections being served (their handler task runs)
        self._open_conns: set[Connection] = set()  # every open transport, served or closing
        self._answering: set[Connection] = set()  # connections whose request is being answered
        self._tasks: set[asyncio.Task[None]] = set()
        self._routes = self._route_table()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> FakeVLLM:
        """Bind and listen; returns once connections are accepted (no sleeping)."""
        if self._thread is not None or self._stopping:
            raise RuntimeError("a FakeVLLM starts once")
        self._thread = threading.Thread(target=self._thread_main, name=f"fake-vllm-{id(self):x}", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout=10):
            raise RuntimeError("fake vLLM did not start")
        if self._startup_error is not None:
            self._thread.join()
            self._thread = None
            raise RuntimeError("fake vLLM could not listen") from self._startup_error
        return self

    def stop(self) -> None:
        """Drop every connection, stop the loop and join its thread (idempotent)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        with self._cond:
            self._stopping = True
        if self._loop is not None and self._stop_event is not None and thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop_event.set)
        thread.join(timeout=10)
        if thread.is_alive():
            raise RuntimeError("fake vLLM thread did not stop")

    def __enter__(self) -> FakeVLLM:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def close_listener(self, *, drop_connections: bool | Literal["idle"] = True) -> None:
        """Stop listening (new connections are refused), like a vLLM process that exited; by
        default also drop the open connections (``"idle"``: only those not answering a request, as
        a backend restarted between requests)."""
        self._run_in_loop(self._close_listener, drop_connections)

    def reopen_listener(self) -> None:
        """Listen again on the same port (a restarted vLLM)."""
        self._run_in_loop(self._open_listener)

    # ------------------------------------------------------------------ behaviour
    def inject(self, fault: Fault, *, times: int | None = 1, paths: Sequence[str] | None = None) -> None:
        """Apply `fault` to the next `times` requests (None: until `clear_faults`) whose path is in
        `paths` (default: the generation routes). Faults queue up in injection order."""
        with self._cond:
            self._faults.append(_Slot(fault, times, frozenset(paths) if paths else GENERATION_PATHS))

    def fail_next(
        self,
        n: int = 1,
        status: int = 500,
        body: bytes | Sequence[bytes] = api.ENGINE_DEAD_BODY,
        content_type: str | None = "application/json",
    ) -> None:
        self.inject(Respond(status, body, content_type), times=n)

    def clear_faults(self) -> None:
        with self._cond:
            self._faults.clear()

    # ------------------------------------------------------------------ recording
    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request received, in order (a copy)."""
        with self._cond:
            return list(self._requests)

    def requests_to(self, path: str) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path == path]

    @property
    def in_flight(self) -> int:
        """Generations started and neither finished nor aborted."""
        with self._cond:
            return self._in_flight

    @property
    def aborted(self) -> int:
        """Generations stopped because the client went away (mid-request or mid-stream)."""
        with self._cond:
            return self._aborted

    @property
    def completed(self) -> int:
        with self._cond:
            return self._completed

    @property
    def errors(self) -> list[BaseException]:
        """Exceptions raised inside the fake's handlers (a bug in the fake); should stay empty."""
        with self._cond:
            return list(self._errors)

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
        """Block until `predicate()` holds; it is re-checked whenever the fake's state changes."""
        with self._cond:
            return self._cond.wait_for(predicate, timeout)

    # ------------------------------------------------------------------ event loop side
    def _thread_main(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported by start()
            self._startup_error = exc
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        await self._open_listener()
        self._ready.set()
        await self._stop_event.wait()
        await self._close_listener(True)
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        # A graceful close waits for the client to read what is buffered; a client that never does
        # (the slow-reader tests) would leave that transport open past the loop's end.
        for conn in list(self._open_conns):
            conn.abort()
        await asyncio.sleep(0)  # let connection_lost run

    def _run_in_loop(self, fn: Callable[..., Coroutine[None, None, None]], *args: Any) -> None:
        if self._loop is None or self._thread is None:
            raise RuntimeError("fake vLLM is not running")
        asyncio.run_coroutine_threadsafe(fn(*args), self._loop).result(timeout=10)

    async def _open_listener(self) -> None:
        if self._server is not None:
            return
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: Connection(self._serve_connection, self._tasks, self._open_conns), "127.0.0.1", self._port
        )
        self._port = self._server.sockets[0].getsockname()[1]

    async def _close_listener(self, drop_connections: bool) -> None:
        if self._server is not None:
            self._server.close()  # closes the listening socket now; no wait_closed (3.12 waits for clients)
            self._server = None
        if drop_connections:
            for conn in list(self._conns):
                if drop_connections is True or conn not in self._answering:
                    conn.abort()

    def _record(self, req: Request) -> None:
        try:
            parsed = json.loads(req.body) if req.body else None
        except ValueError:
            parsed = None
        headers: dict[str, str] = {}
        for name, value in req.headers:
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        with self._cond:
            self._requests.append(RecordedRequest(req.method, req.path, req.query, headers, req.body, parsed))
            self._cond.notify_all()

    def _take_fault(self, path: str) -> Fault | None:
        with self._cond:
            for slot in self._faults:
                if path in slot.paths:
                    if slot.remaining is not None:
                        slot.remaining -= 1
                        if slot.remaining <= 0:
                            self._faults.remove(slot)
                    return slot.fault
        return None

    @contextmanager
    def _generation(self, prompt_tokens: int = 0, completion_tokens: int = 0) -> Iterator[_Tracker]:
        """Counts one generation as in flight; it ends "aborted" unless finished otherwise first."""
        with self._cond:
            self._in_flight += 1
            self._cond.notify_all()
        tracker = _Tracker(lambda outcome: self._ended(outcome, prompt_tokens, completion_tokens))
        try:
            yield tracker
        finally:
            tracker.finish("aborted")

    def _ended(self, outcome: Outcome, prompt_tokens: int, completion_tokens: int) -> None:
        with self._cond:
            self._in_flight -= 1
            if outcome == "completed":
                self._completed += 1
                self._prompt_tokens_total += prompt_tokens
                self._generation_tokens_total += completion_tokens
            elif outcome == "aborted" and not self._stopping:
                self._aborted += 1
            self._cond.notify_all()

    async def _serve_connection(self, conn: Connection) -> None:
        self._conns.add(conn)
        try:
            while True:
                try:
                    req = await conn.read_request()
                except BadRequest:
                    self._send(conn, 400, b"Invalid HTTP request received.", "text/plain; charset=utf-8", vary=False)
                    break
                if req is None:
                    break
                self._record(req)
                self._answering.add(conn)
                try:
                    kept = await self._respond(conn, req)
                finally:
                    self._answering.discard(conn)
                if not kept or not req.keep_alive:
                    break
        except Exception as exc:  # a bug in the fake: surface it through `errors`
            with self._cond:
                self._errors.append(exc)
                self._cond.notify_all()
        finally:
            self._conns.discard(conn)
            conn.close()

    # ------------------------------------------------------------------ HTTP plumbing
    @staticmethod
    def _send(
        conn: Connection,
        status: int,
        body: bytes,
        content_type: str | None = "application/json",
        *,
        extra: Sequence[tuple[str, str]] = (),
        vary: bool = True,
    ) -> bool:
        headers = [*extra, ("content-length", str(len(body)))]
        if content_type:
            headers.append(("content-type", content_type))
        if vary:
            headers.append(("vary", "Origin"))
        conn.write(response_head(status, headers))
        if body:
            conn.write(body)
        return True

    def _send_fault(self, conn: Connection, fault: Respond) -> bool:
        if isinstance(fault.body, bytes):
            return self._send(conn, fault.status, fault.body, fault.content_type, extra=fault.headers)
        headers = [*fault.headers, *([("content-type", fault.content_type)] if fault.content_type else [])]
        conn.write(response_head(fault.status, [*headers, ("vary", "Origin"), ("transfer-encoding", "chunked")]))
        for part in fault.body:
            conn.write(chunk(part))
        return conn.write(LAST_CHUNK)

    def _authorized(self, req: Request, keys: tuple[str, ...]) -> bool:
        scheme, _, token = (req.header("authorization") or "").partition(" ")
        return scheme.lower() == "bearer" and token in keys

    async def _respond(self, conn: Connection, req: Request) -> bool:
        """Answer one request; False when the connection must not be reused."""
        keys = self.behaviour.api_keys
        guarded = req.method != "OPTIONS" and req.path.startswith(GUARDED_PREFIXES)
        if keys is not None and guarded and not self._authorized(req, keys):
            return self._send(conn, 401, UNAUTHORIZED, vary=False)
        methods = self._routes.get(req.path)
        if methods is None:
            return self._send(conn, 404, NOT_FOUND)
        handler = methods.get(req.method)
        if handler is None:
            return self._send(conn, 405, METHOD_NOT_ALLOWED, extra=[("allow", ", ".join(methods))])
        fault = self._take_fault(req.path)
        generation = req.path in GENERATION_PATHS
        if isinstance(fault, Respond):
            return self._send_fault(conn, fault)
        if isinstance(fault, Hang) or (isinstance(fault, StallAfter) and not generation):
            return await self._hang(conn, generation)
        if isinstance(fault, ResetAfter) and not generation:
            self._cut(conn, fault)
            return False
        try:
            return await handler(conn, req, fault)
        except api.ApiError as err:
            return self._send(conn, err.status, api.dumps(err.body))

    async def _hang(self, conn: Connection, generation: bool) -> bool:
        if not generation:
            await conn.closed.wait()
            return False
        with self._generation():
            await conn.closed.wait()
        return False

    @staticmethod
    def _cut(conn: Connection, fault: ResetAfter) -> None:
        if fault.rst:
            conn.reset()
        else:
            conn.close()

    async def _generate_once(
        self, conn: Connection, body: bytes, steps: int, prompt: int, completion: int, fault: Fault | None
    ) -> bool:
        """A non-streaming generation: wait as long as its tokens take, then answer at once."""
        with self._generation(prompt, completion) as generation:
            if isinstance(fault, ResetAfter):
                generation.finish("cut")
                self._cut(conn, fault)
                return False
            if isinstance(fault, StallAfter):
                await conn.closed.wait()
                return False
            delay = self.behaviour.first_token_delay + self.behaviour.token_delay * max(0, steps - 1)
            if await conn.client_gone_within(delay):
                return False
            generation.finish("completed")  # before the client can see the answer
            return self._send(conn, 200, body)

    async def _generate_stream(
        self, conn: Connection, events: list[tuple[int | None, bytes]], prompt: int, completion: int,
        fault: Fault | None,
    ) -> bool:  # fmt: skip
        """A streaming generation: headers at once, then one chunk (one write) per SSE event."""
        with self._generation(prompt, completion) as generation:
            conn.write(response_head(200, SSE_HEADERS))
            last_step = -1
            for sent in range(len(events) + 1):
                if isinstance(fault, ResetAfter) and sent == fault.chunks:
                    generation.finish("cut")
                    self._cut(conn, fault)
                    return False
                if isinstance(fault, StallAfter) and sent == fault.chunks:
                    await conn.closed.wait()
                    return False
                if isinstance(fault, MalformedSSE) and sent == fault.after:
                    conn.write(chunk(fault.payload))
                if sent == len(events):
                    break
                step, data = events[sent]
                delay = 0.0
                if step is not None and step > last_step:
                    delay = self.behaviour.first_token_delay if step == 0 else self.behaviour.token_delay
                    last_step = step
                if await conn.client_gone_within(delay):
                    return False
                if sent == len(events) - 1:
                    generation.finish("completed")  # all tokens are out: the last event ends the stream
                if not conn.write(chunk(data)):
                    return False
            return conn.write(LAST_CHUNK)

    # ------------------------------------------------------------------ routes
    def _route_table(self) -> dict[str, dict[str, Handler]]:
        routes: dict[str, dict[str, Handler]] = {
            "/health": {"GET": self._health},
            "/ping": {"GET": self._health, "POST": self._health},
            "/version": {"GET": self._version},
            "/load": {"GET": self._load},
            "/metrics": {"GET": self._metrics},
            "/v1/models": {"GET": self._models},
            "/tokenize": {"POST": self._tokenize},
        }
        if self.cloud:
            routes = {path: r for path, r in routes.items() if path.startswith("/v1/")}
        if self.task == "generate":
            routes["/v1/chat/completions"] = {"POST": self._chat}
            routes["/v1/completions"] = {"POST": self._completions}
            routes["/v1/responses"] = {"POST": self._responses}
            routes["/v1/messages"] = {"POST": self._messages}
            routes["/v1/messages/count_tokens"] = {"POST": self._count_tokens}
        else:
            routes["/v1/embeddings"] = {"POST": self._embeddings}
        return routes

    async def _health(self, conn: Connection, req: Request, fault: Fault | None) -> bool:
        return self._send(conn, self.behaviour.health_status, b"", None)

    async def _version(self, conn: Connection, req: Request, fault: Fault | None) -> bool:
        return self._send(conn, 200, api.dumps({"version": api.VERSION}))

    async def _load(self, conn: Connection, req: Request, fault: Fault | None) -> bool:
        return self._send(conn, 200, api.dumps({"server_load": self.in_flight}))

    async def _models(self, conn: Connection, req: Request, fault: Fault | None) -> bool:
        return self._send(conn, 200, api.dumps(api.models_list(self.served_models, self.root, self.max_model_len)))

    async def _metrics(self, conn: Connection, req: Request, fault: Fault | None) -> bool:
        b = self.behaviour
        with self._cond:
            values = api.MetricValues(
                model_name=self.served_models[0],
                running=self._in_flight if b.num_requests_running is None else b.num_requests_running,
                waiting=b.num_requests_waiting,
                kv_cache_usage=b.kv_cache_usage_perc,
                success_length=self._completed,
                prompt_tokens=self._prompt_tokens_total,
                generation_tokens=self._generation_tokens_total,
            )
        body = api.metrics_text(values).encode()
        return self._send(conn, 200, body, "text/plain; version=1.0.0; charset=utf-8")

    async def _tokenize(self, conn: Connection, req: Request, fault: Fault | None) -> bool:
        body = api.parse_json_body(req.body, req.header("content-type"))
        if isinstance(body, dict) and isinstance(body.get("messages"), list):
            count = api.chat_prompt_tokens([m for m in body["messages"] if isinstance(m, dict)])
        else:
            count = 1 + api.count_tokens(str(body.get("prompt", "")) if isinstance(body, dict) else "")
        tokens = [(47 + 491 * i) % 2048 for i in range(count)]
        answer = {"count": count, "max_model_len": self.max_model_len, "tokens": tokens, "token_strs": None}
        return self._send(conn, 200, api.dumps(answer))

    def _model(self, requested: str | None) -> str:
        model = requested or self.served_models[0]
        if model not in self.served_models:
            raise api.model_not_found(model, self.served_models)
        return model

    def _check_prompt(self, prompt_tokens: int) -> None:
        if prompt_tokens >= self.max_model_len:
            raise api.context_length_error(prompt_tokens, self.max_model_len)

    def _output_tokens(self, requested: int | None, prompt_tokens: int) -> int:
        room = self.max_model_len - prompt_tokens
        wanted = requested if requested is not None else (self.default_max_tokens or room)
        return max(1, min(wanted, room))

    async def _chat(self, conn: Connection, req: Request, fault: Fault | None) -> bool:
        chat = api.validate(api.ChatRequest, api.parse_json_body(req.body, req.header("content-type")))
        api.check_stream_options(chat)
        model = self._model(chat.model)
        requested = chat.max_completion_tokens if chat.max_completion_tokens is not None else chat.max_tokens
        api.check_max_tokens(requested, self.max_model_len)
        if not chat.messages:
            raise api.bad_request(EMPTY_CONVERSATION)
        prompt = api.chat_prompt_tokens(chat.messages)
        self._check_prompt(prompt)
        api.check_sampling(chat, requested)
        tokens = self._output_tokens(requested, prompt)
        gen = api.Generation.make("chatcmpl-", model, prompt, [tokens] * (chat.n or 1))
        if not chat.stream:
            body = api.dumps(api.chat_completion(gen))
            return await self._generate_once(conn, body, tokens, prompt, gen.completion_tokens, fault)
        include, continuous = self._usage_flags(chat.stream_options)
        events = [
            (step, b"data: " + api.dumps(e) + b"\n\n") for step, e in api.chat_stream_events(gen, include, continuous)
        ]
        events.append((None, b"data: [DONE]\n\n"))
        return await self._generate_stream(conn, events, prompt, gen.completion_tokens, fault)

    async def _completions(self, conn: Connection, req: Request, fault: Fault | None) -> bool:
        comp = api.validate(api.CompletionRequest, api.parse_json_body(req.body, req.header("content-type")))
        api.check_stream_options(comp)
        model = self._model(comp.model)
        api.check_max_tokens(comp.max_tokens, self.max_model_len)
        if isinstance(comp.prompt, str):
            prompts = [1 + api.count_tokens(comp.prompt)]
        elif comp.prompt and isinstance(comp.prompt[0], str):
            prompts = [1 + api.count_tokens(str(p)) for p in comp.prompt]
        else:
            prompts = [max(1, len(comp.prompt))]
        for prompt in prompts:
            self._check_prompt(prompt)
        api.check_sampling(comp, comp.max_tokens)
        per_choice = [self._output_tokens(comp.max_tokens, p) for p in prompts for _ in range(comp.n or 1)]
        gen = api.Generation.make("cmpl-", model, sum(prompts), per_choice)
        if not comp.stream:
            body = api.dumps(api.completion(gen))
            return await self._generate_once(
                conn, body, max(per_choice), gen.prompt_tokens, gen.completion_tokens, fault
            )
        include, continuous = self._usage_flags(comp.stream_options)
        events = [
            (s, b"data: " + api.dumps(e) + b"\n\n") for s, e in api.completion_stream_events(gen, include, continuous)
        ]
        events.append((None, b"data: [DONE]\n\n"))
        return await self._generate_stream(conn, events, gen.prompt_tokens, gen.completion_tokens, fault)

    async def _responses(self, conn: Connection, req: Request, fault: Fault | None) -> bool:
        resp = api.validate(api.ResponsesRequest, api.parse_json_body(req.body, req.header("content-type")))
        model = self._model(resp.model)
        api.check_max_tokens(resp.max_output_tokens, self.max_model_len, "max_output_tokens")
        prompt = api.responses_prompt_tokens(resp)
        self._check_prompt(prompt)
        api.check_sampling(resp, resp.max_output_tokens, "max_output_tokens")
        tokens = self._output_tokens(resp.max_output_tokens, prompt)
        gen = api.Generation.make("resp_", model, prompt, [tokens], id_hex=32)
        if not resp.stream:
            body = api.dumps(api.response_object(gen, resp, tokens, "incomplete"))
            return await self._generate_once(conn, body, tokens, prompt, tokens, fault)
        events = [
            (step, f"event: {e['type']}\ndata: ".encode() + api.dumps(e) + b"\n\n")
            for step, e in api.responses_stream_events(gen, resp, tokens)
        ]
        return await self._generate_stream(conn, events, prompt, tokens, fault)

    def _anthropic_model(self, requested: str) -> str:
        try:
            return self._model(requested)
        except api.ApiError as err:
            raise anth.translate(err) from None

    def _anthropic_prompt(self, req: anth.CountTokensRequest) -> int:
        anth.check(req, self.auto_tool_choice)
        prompt = anth.prompt_tokens(req)
        try:
            self._check_prompt(prompt)
        except api.ApiError as err:
            raise anth.translate(err) from None
        return prompt

    async def _messages(self, conn: Connection, req: Request, fault: Fault | None) -> bool:
        msg = api.validate(anth.MessagesRequest, api.parse_json_body(req.body, req.header("content-type")))
        model = self._anthropic_model(msg.model)
        anth.check_max_tokens(msg.max_tokens, self.max_model_len)
        prompt = self._anthropic_prompt(msg)
        tokens = self._output_tokens(msg.max_tokens, prompt)
        gen = api.Generation.make("chatcmpl-", model, prompt, [tokens])
        if not msg.stream:
            return await self._generate_once(conn, api.dumps(anth.message(gen)), tokens, prompt, tokens, fault)
        return await self._generate_stream(conn, anth.stream_events(gen), prompt, tokens, fault)

    async def _count_tokens(self, conn: Connection, req: Request, fault: Fault | None) -> bool:
        body = api.validate(anth.CountTokensRequest, api.parse_json_body(req.body, req.header("content-type")))
        self._anthropic_model(body.model)
        return self._send(conn, 200, api.dumps(anth.count_tokens_body(self._anthropic_prompt(body))))

    async def _embeddings(self, conn: Connection, req: Request, fault: Fault | None) -> bool:
        emb = api.validate(api.EmbeddingRequest, api.parse_json_body(req.body, req.header("content-type")))
        model = self._model(emb.model)
        body, prompt = api.embeddings(emb, model, self.embedding_dim)
        return await self._generate_once(conn, api.dumps(body), 1, prompt, 0, fault)

    @staticmethod
    def _usage_flags(options: api.StreamOptions | None) -> tuple[bool, bool]:
        include = options is not None and bool(options.include_usage)
        return include, include and options is not None and bool(options.continuous_usage_stats)
