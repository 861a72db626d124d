"""A raw HTTP/1.1 client over a real socket: no client library buffers or hides the bytes."""

from __future__ import annotations

import socket
from collections.abc import Callable


def post_json(port: int, path: str, body: bytes, key: str, timeout: float = 30) -> socket.socket:
    """Open a connection to 127.0.0.1:port and send one POST; the caller reads and closes."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Authorization: Bearer " + key.encode() + b"\r\nContent-Length: " + str(len(body)).encode()
              + b"\r\n\r\n" + body)
    return s


def read_until(s: socket.socket, done: Callable[[bytes], bool], seen: bytes = b"") -> bytes:
    """Receive until ``done(all bytes so far)``; fails if the peer closes first."""
    while not done(seen):
        data = s.recv(65536)
        assert data, f"connection closed early after {len(seen)} bytes"
        seen += data
    return seen


def connect(port: int, timeout: float = 10) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=timeout)


def read_to_close(s: socket.socket) -> bytes:
    """Receive until the peer closes (a reset counts as a close); the socket's timeout applies."""
    seen = b""
    while True:
        try:
            data = s.recv(65536)
        except ConnectionResetError:
            return seen
        if not data:
            return seen
        seen += data


def split_response(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """(status, lower-cased headers, body as sent) of one HTTP response; interim 1xx answers skipped."""
    while raw.startswith(b"HTTP/1.1 1"):
        raw = raw.split(b"\r\n\r\n", 1)[1]
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(lines[0].split()[1]), headers, body
