"""Client-connection limits, and the process's open-file limit they must fit in."""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass

from gateway.settings import Settings

log = logging.getLogger("gateway.server")

DEFAULT_MAX_CONNECTIONS = 10_000
# Descriptors kept for everything that is not a client connection: listening sockets, logs, the
# health prober, metric files. Each client connection may hold one upstream connection besides.
_RESERVED_FDS = 64


@dataclass(frozen=True)
class ServerLimits:
    max_head_bytes: int = 65536
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    idle_timeout_s: float = 5.0
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    linger_s: float = 2.0  # after a 408/414/431: read and drop what the client still sends, then close

    @classmethod
    def from_settings(cls, settings: Settings, open_files: int | None = None) -> ServerLimits:
        cap = settings.max_connections
        if cap is None:
            cap = DEFAULT_MAX_CONNECTIONS
            if open_files is not None:
                cap = min(cap, fitting_connections(open_files))
        elif open_files is not None and cap > fitting_connections(open_files):
            log.warning("GATEWAY_MAX_CONNECTIONS=%d does not fit the open-file limit %d (about %d "
                        "connections do, each may need an upstream connection too)",
                        cap, open_files, fitting_connections(open_files))
        return cls(max_head_bytes=settings.max_head_bytes, header_timeout_s=settings.header_timeout_s,
                   body_timeout_s=settings.body_timeout_s, idle_timeout_s=settings.idle_timeout_s,
                   max_connections=cap)


def fitting_connections(open_files: int) -> int:
    """Client connections that fit in ``open_files`` descriptors, with one upstream connection each."""
    return max(1, (open_files - _RESERVED_FDS) // 2)


def raise_open_file_limit() -> int:
    """Raise RLIMIT_NOFILE's soft limit to the hard limit where allowed; return the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            log.debug("open-file limit raised from %d to %d", soft, target)
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, target, exc)
    return int(soft)
