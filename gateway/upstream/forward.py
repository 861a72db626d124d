"""Send a request to a model's upstreams, retrying before any byte reached the client, then to
its fallback models.

The forwarder returns an open upstream response with a 2xx status (the caller streams or reads
it) or raises a :class:`~gateway.errors.GatewayError`. Which failures are tried again, on which
upstream and after how long a wait is :mod:`gateway.upstream.retry`'s decision; a timeout after the
request was sent is never retried, so a slow generation is never duplicated. Every attempt goes
through the upstream's circuit breaker (:mod:`gateway.routing.breaker`): an open circuit gets no
request, and each attempt's outcome feeds it. When none of a model's upstreams can take the request
(no circuit lets it through, all down, the model overloaded, every attempt failed in a retryable
way), the request goes to the model's ``fallbacks`` in order, each with its own attempts, all within
the one request deadline.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from gateway.config.schema import LimitsSpec, RetrySpec, Timeouts
from gateway.domain import ModelEntry, Upstream
from gateway.errors import (
    CircuitOpen,
    GatewayError,
    InvalidRequest,
    OutOfFileDescriptors,
    UpstreamBadResponse,
    UpstreamTimeout,
)
from gateway.routing.breaker import BreakerBoard
from gateway.routing.health import HealthBoard
from gateway.routing.load import Lease
from gateway.routing.selector import Selector
from gateway.upstream.client import UpstreamClients
from gateway.upstream.headers import DEFAULT_ALLOW, allow_set, forward_headers
from gateway.upstream.idle import IdleTimer
from gateway.upstream.normalize import from_error_response, from_transport_error
from gateway.upstream.response import UpstreamResponse
from gateway.upstream.retry import Verdict, backoff_s, judge
from gateway.upstream.transport import LeanResponse

log = logging.getLogger("gateway.upstream")

ErrorHook = Callable[[Upstream, GatewayError], None]
PairHook = Callable[[str, str], None]  # (model, reason) for retries, (from_model, to_model) for fallbacks


@dataclass(slots=True)
class Opened:
    upstream: Upstream
    response: UpstreamResponse
    deadline: float  # loop time by which the whole exchange must end
    idle: float = 60.0  # the upstream's limit on silence between two body chunks
    lease: Lease | None = None  # this request in the upstream's in-flight count, until release()

    def release(self) -> None:
        """The response ended (whole body, stream end, error or client gone): idempotent."""
        if self.lease is not None:
            self.lease.release()

    @property
    def served_by(self) -> str:
        """``<public id>/<upstream name>``: what answered (a fallback model's ID after a fallback)."""
        return f"{self.upstream.model_id}/{self.upstream.name}"


@dataclass(slots=True)
class _Failed:
    error: GatewayError
    fall_back: bool  # the model could not take the request: its fallbacks may


def effective(up: Upstream, t: Timeouts) -> tuple[float, float, float]:
    """(connect, first_byte, idle) for ``up``: its own ``timeouts`` over the top-level ones."""
    own = up.spec.timeouts
    return (own.connect or t.connect, own.first_byte or t.first_byte, own.idle or t.idle)


class Forwarder:
    def __init__(
        self,
        clients: UpstreamClients,
        selector: Selector,
        board: HealthBoard,
        timeouts: Timeouts,
        retry: RetrySpec,
        limits: LimitsSpec,
        on_error: ErrorHook | None = None,
        forward_allow: frozenset[bytes] = allow_set(DEFAULT_ALLOW),
        breakers: BreakerBoard | None = None,
        on_retry: PairHook | None = None,
        on_fallback: PairHook | None = None,
    ) -> None:
        self.clients = clients
        self.selector = selector
        self.board = board
        self.timeouts = timeouts
        self.retry = retry
        self.limits = limits
        self.on_error = on_error
        self.forward_allow = forward_allow
        self.breakers = breakers or BreakerBoard((), 1 << 30, 1.0)  # none given: never opens
        self.on_retry = on_retry
        self.on_fallback = on_fallback

    def _headers(self, up: Upstream, extra: list[tuple[bytes, bytes]], request_id: str) -> list[tuple[bytes, bytes]]:
        h = [
            (b"content-type", b"application/json"),
            (b"accept-encoding", b"identity"),
            (b"x-request-id", request_id.encode()),
        ]
        key = up.spec.api_key_value()
        if key:
            h.append((b"authorization", b"Bearer " + key.encode()))
        h.extend(extra)
        return h

    def _order(self, entry: ModelEntry, affinity_key: str | None) -> list[Upstream]:
        # The selector's order: routing strategy and affinity (it raises ModelOverloaded when every
        # usable upstream is over the model's shed thresholds, before anything was sent).
        return self.selector.order(entry, affinity_key)

    async def open(
        self,
        entry: ModelEntry,
        path: str,
        payload: dict[str, Any],
        client_headers: list[tuple[bytes, bytes]],
        request_id: str,
        *,
        fallbacks: Sequence[ModelEntry] = (),
        affinity_key: str | None = None,
    ) -> Opened:
        """Raises :class:`~gateway.errors.ModelOverloaded` (from the selector) before sending anything
        when every usable upstream is over the model's shed thresholds and no fallback takes it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeouts.total
        extra = forward_headers(client_headers, self.forward_allow)
        first = await self._try_model(entry, path, payload, extra, request_id, deadline, affinity_key,
                                      eager=bool(fallbacks))
        if isinstance(first, Opened):
            return first
        if not first.fall_back or not fallbacks:
            raise first.error
        for fb in fallbacks:
            if loop.time() >= deadline:
                break
            log.warning("model %s cannot take the request (%s): falling back to %s", entry.id,
                        first.error.code, fb.id,
                        extra={"request_id": request_id, "model": entry.id, "error_code": first.error.code})
            got = await self._try_model(fb, path, payload, extra, request_id, deadline, affinity_key, eager=True)
            if isinstance(got, Opened):
                if self.on_fallback is not None:
                    self.on_fallback(entry.id, fb.id)
                return got
            if not got.fall_back:
                raise got.error
        raise first.error

    async def _try_model(
        self, entry: ModelEntry, path: str, payload: dict[str, Any], extra: list[tuple[bytes, bytes]],
        request_id: str, deadline: float, affinity_key: str | None, *, eager: bool,
    ) -> Opened | _Failed:
        """Up to ``retry.max_attempts`` attempts on ``entry``'s upstreams. ``eager``: when no upstream
        is usable (down or circuit open), give up at once (a fallback will do) instead of trying
        the down ones as a last resort."""
        loop = asyncio.get_running_loop()
        try:
            order = self._order(entry, affinity_key)
        except GatewayError as err:
            if err.code == "model_overloaded":
                return _Failed(err, True)
            raise
        if eager and not any(self.board.usable(u.name) for u in order):
            return _Failed(self._none_available(entry, order), True)
        tried: dict[str, Verdict] = {}
        last: _Failed | None = None
        reason: str | None = None
        for attempt in range(self.retry.max_attempts):
            up = self._next(order, tried)
            if up is None:
                break
            if attempt:
                assert reason is not None
                remaining = deadline - loop.time()
                wait = backoff_s(attempt, self.retry.backoff_ms, remaining)
                if wait >= remaining:  # no time left for another attempt after the wait: stop now
                    self.breakers.release(up.name)
                    break
                if self.on_retry is not None:
                    self.on_retry(entry.id, reason)
                log.info("retry %d of model %s on upstream %s after %s (backoff %.0f ms)", attempt, entry.id,
                         up.name, reason, wait * 1000,
                         extra={"request_id": request_id, "upstream": up.name, "model": entry.id})
                if wait > 0:
                    try:
                        await asyncio.sleep(wait)
                    except BaseException:
                        self.breakers.release(up.name)
                        raise
                if loop.time() >= deadline:
                    self.breakers.release(up.name)
                    break
            got = await self._attempt(up, path, payload, extra, request_id, deadline)
            if isinstance(got, Opened):
                return got
            failure, verdict = got
            tried[up.name] = verdict
            if verdict.reason is None:
                return _Failed(failure, False)
            reason = verdict.reason
            # A fallback model may take what this one could not (5xx, 429), never what the request
            # itself got wrong (an endpoint this model does not serve is the client's choice).
            last = _Failed(failure, failure.status >= 500 or failure.status == 429)
        if last is None:
            return _Failed(self._none_available(entry, order), True)
        return last

    def _next(self, order: list[Upstream], tried: dict[str, Verdict]) -> Upstream | None:
        """A different upstream than those tried, when one lets a request through its circuit; else
        one already tried whose failure allows the same upstream again."""
        for u in order:
            if u.name not in tried and self.breakers.acquire(u.name):
                return u
        for u in order:
            v = tried.get(u.name)
            if v is not None and v.same_upstream_ok and self.breakers.acquire(u.name):
                return u
        return None

    def _none_available(self, entry: ModelEntry, order: list[Upstream]) -> GatewayError:
        waits = [w for u in order if (w := self.breakers.open_for(u.name)) is not None]
        err = CircuitOpen(f"The model `{entry.id}` has no upstream available right now; retry shortly.")
        if waits and len(waits) == len(order):
            err.retry_after_s = max(1, round(min(waits) + 0.5))
        return err

    async def _attempt(
        self, up: Upstream, path: str, payload: dict[str, Any], extra: list[tuple[bytes, bytes]],
        request_id: str, deadline: float,
    ) -> Opened | tuple[GatewayError, Verdict]:
        """One request to ``up`` (its circuit already acquired); its outcome goes to the breaker."""
        loop = asyncio.get_running_loop()
        _connect, first_byte, idle = effective(up, self.timeouts)
        payload["model"] = up.served_name
        status: int | None = None
        sent_timeout = False
        err: GatewayError
        lease: Lease | None = self.selector.load.start(up.name)  # released below unless it succeeds
        try:
            body = encode_payload(payload)
            try:
                response = await self.clients.post(up, path, self._headers(up, extra, request_id), body,
                                                   min(deadline, loop.time() + first_byte))
            except TimeoutError:
                err = UpstreamTimeout(
                    f"Upstream {up.name} sent no response within {first_byte:g}s."
                )
                sent_timeout = True
            except httpx.HTTPError as exc:
                err = from_transport_error(exc, up)
                if isinstance(err, OutOfFileDescriptors):  # our fault: blame no backend, try none
                    log.error("%s", err.message, extra={"upstream": up.name, "error_code": err.code})
                    self.breakers.release(up.name)
                    raise err from exc
                if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout) and up.spec.probe_mode != "passive":
                    # (a passive upstream is never probed, so nothing would mark it up again: its
                    # circuit breaker alone judges it)
                    self.board.mark_down(up.name, err.message)
            else:
                if response.status_code < 400:
                    self.breakers.success(up.name)
                    opened, lease = Opened(up, response, deadline, idle, lease), None
                    return opened
                status = response.status_code
                try:
                    body = await read_body(response, deadline, idle, 1 << 20, up)
                except GatewayError as body_err:
                    err = body_err
                else:
                    err = from_error_response(response.status_code, body, up, path)
        except BaseException:  # cancelled (the client left) or a bug: the attempt says nothing
            self.breakers.release(up.name)
            raise
        finally:
            if lease is not None:  # this attempt is over (the one that succeeded stays in flight)
                lease.release()
        if status is not None:  # the backend answered this error: say which one did
            err.headers.setdefault("x-gateway-served-by", f"{up.model_id}/{up.name}")
        verdict = judge(err, status, sent_timeout)
        if verdict.backend_failure:
            self.breakers.failure(up.name, err.code or err.message)
        elif status is not None and status < 500 and status != 429:
            self.breakers.success(up.name)  # the backend answered sanely (the request's own 4xx)
        else:
            self.breakers.release(up.name)
        self.report(up, err)
        return err, verdict

    def report(self, up: Upstream, err: GatewayError) -> None:
        level = logging.ERROR if err.code in ("upstream_auth_failed", "upstream_model_not_found") else (
            logging.WARNING if err.status >= 500 else logging.INFO)
        log.log(level, "upstream %s: %s", up.name, err.detail or err.message,
                extra={"upstream": up.name, "error_code": err.code, "status": err.status})
        if self.on_error is not None:
            self.on_error(up, err)


MAX_WRITE_DEPTH = 254  # orjson reads 1024 levels of nesting but writes at most this many


def encode_payload(payload: dict[str, Any]) -> bytes:
    """The body for the backend. The one thing orjson reads but cannot write again is nesting deeper
    than it writes: the client's error, found here at no extra cost (the body is serialised anyway)."""
    try:
        return orjson.dumps(payload)
    except orjson.JSONEncodeError:
        raise InvalidRequest(
            f"The JSON body is nested too deeply: at most {MAX_WRITE_DEPTH} levels of arrays and objects "
            f"are accepted.",
            code="invalid_json",
        ) from None


async def read_body(
    response: UpstreamResponse, deadline: float, idle: float, max_bytes: int, up: Upstream
) -> bytes:
    """The whole (non-streaming) body, bounded in size, total time and silence; always closes."""
    if isinstance(response, LeanResponse) and (whole := response.stream.take_complete()) is not None:
        await response.aclose()  # all of it is here already: nothing to time, nothing to iterate
        if len(whole) > max_bytes:
            raise UpstreamBadResponse(f"Upstream {up.name} sent a body over {max_bytes} bytes.")
        return whole
    parts: list[bytes] = []
    size = 0
    timer = IdleTimer(idle, deadline)
    try:
        async for chunk in response.aiter_raw():
            timer.touch()
            size += len(chunk)
            if size > max_bytes:
                raise UpstreamBadResponse(f"Upstream {up.name} sent a body over {max_bytes} bytes.")
            parts.append(chunk)
    except asyncio.CancelledError:
        if not timer.absorb():
            raise
        raise UpstreamTimeout(f"Upstream {up.name} stopped sending its response.") from None
    except httpx.HTTPError as exc:
        raise from_transport_error(exc, up) from None
    finally:
        timer.stop()
        await response.aclose()
    return b"".join(parts)


__all__ = ["Forwarder", "Opened", "encode_payload", "read_body"]
