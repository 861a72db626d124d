"""What a running gateway takes from a changed config (a reload, an admin edit) and what waits for a restart.

Live: the mapping (``models``), client keys (``keys``) and ``admin.keys``. Everything else is read once,
when the services are built. :func:`live_update` is the one definition: the services swap exactly that
part in, and :func:`restart_sections` names the changed sections it leaves out.
"""

from __future__ import annotations

from gateway.config.schema import GatewayConfig

_LIVE_SECTIONS = frozenset({"models", "keys"})  # and admin.keys (the rest of `admin` is not live)


def live_update(running: GatewayConfig, new: GatewayConfig) -> GatewayConfig:
    """``running`` with the live parts of ``new``."""
    return running.model_copy(update={"models": new.models, "keys": new.keys,
                                      "admin": running.admin.model_copy(update={"keys": new.admin.keys})})


def restart_sections(running: GatewayConfig, new: GatewayConfig) -> list[str]:
    """The sections of ``new`` that differ from ``running`` and that only a restart applies, in file order."""
    out: list[str] = []
    for name in GatewayConfig.model_fields:
        if name in _LIVE_SECTIONS:
            continue
        a, b = getattr(running, name), getattr(new, name)
        if name == "admin":
            a, b = a.model_copy(update={"keys": []}), b.model_copy(update={"keys": []})
        if a != b:
            out.append(name)
    return out


__all__ = ["live_update", "restart_sections"]
