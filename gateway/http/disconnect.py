"""Telling the application that its client went away, without a task per request.

ASGI's way is to keep a task waiting on ``receive()`` for ``http.disconnect``: one task created and
cancelled per request (about 5 % of a proxied request's CPU). The gateway's own protocol offers the
same news as a callback instead: each request's scope carries, under :data:`DISCONNECT_HOOK`, an
object with an ``on_disconnect`` slot that the protocol calls once, from ``connection_lost``, when the
connection ends before the response is complete. An application served by another server (no hook in
the scope) keeps using ``receive()``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

DISCONNECT_HOOK = "gateway.disconnect_hook"


class DisconnectHook(Protocol):
    disconnected: bool  # the connection already ended before the response was complete
    on_disconnect: Callable[[], None] | None  # called once, when it ends so (set None to stop watching)


__all__ = ["DISCONNECT_HOOK", "DisconnectHook"]
