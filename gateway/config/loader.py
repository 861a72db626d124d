"""Read a YAML config file, interpolate ``${ENV}`` references, validate it.

Errors are collected into one :class:`ConfigError` whose lines name the path to each bad field
(``models[0].upstreams[1].url: ...``), so ``gateway check-config`` and start-up say exactly what
is wrong.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gateway.config.schema import GatewayConfig

_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$\$")


class ConfigError(Exception):
    """A config file that cannot be used; ``problems`` lists one line per fault."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: invalid config:\n" + "\n".join(f"  - {p}" for p in problems))


def field_path(loc: tuple[Any, ...] | list[Any]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def interpolate(data: Any, env: Mapping[str, str], problems: list[str], loc: tuple[Any, ...] = ()) -> Any:
    """Replace ``${VAR}`` / ``${VAR:-default}`` in every string; ``$$`` is a literal ``$``."""
    if isinstance(data, dict):
        return {k: interpolate(v, env, problems, (*loc, k)) for k, v in data.items()}
    if isinstance(data, list):
        return [interpolate(v, env, problems, (*loc, i)) for i, v in enumerate(data)]
    if isinstance(data, str) and "$" in data:

        def repl(m: re.Match[str]) -> str:
            if m.group(0) == "$$":
                return "$"
            name, default = m.group(1), m.group(2)
            if name in env:
                return env[name]
            if default is not None:
                return default
            problems.append(f"{field_path(loc)}: environment variable ${{{name}}} is not set")
            return ""

        return _REF.sub(repl, data)
    return data


def parse_config(text: str, env: Mapping[str, str], source: str = "<config>") -> GatewayConfig:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(source, [f"not valid YAML: {exc}"]) from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(source, ["the top level must be a mapping with `models:` and `keys:`"])
    problems: list[str] = []
    data = interpolate(raw, env, problems)
    if problems:
        raise ConfigError(source, problems)
    try:
        return GatewayConfig.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors(include_url=False):
            msg = err["msg"]
            if err["type"] == "extra_forbidden":
                msg = "unknown field"
            msg = msg.removeprefix("Value error, ")
            lines.append(f"{field_path(err['loc'])}: {msg}")
        raise ConfigError(source, lines) from None


def load_config(path: str | Path, env: Mapping[str, str]) -> GatewayConfig:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(str(p), [f"cannot read the file: {exc.strerror or exc}"]) from None
    return parse_config(text, env, str(p))
