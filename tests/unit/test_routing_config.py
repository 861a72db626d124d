"""Config of load routing: per-model `routing`, `affinity`, `shed`; top-level `routing`."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.cli import main
from gateway.config import ConfigError, parse_config
from gateway.mappings.snapshot import ModelTable

BASE = """
models:
  - id: m
{extra}
    upstreams:
      - {{name: a, url: "http://127.0.0.1:1", model: x}}
      - {{name: b, url: "http://127.0.0.1:2", model: x}}
{top}
"""


def _cfg(extra: str = "", top: str = ""):  # type: ignore[no-untyped-def]
    return parse_config(BASE.format(extra=extra, top=top), {})


def _problems(extra: str = "", top: str = "") -> list[str]:
    with pytest.raises(ConfigError) as info:
        _cfg(extra, top)
    return info.value.problems


def test_defaults_are_todays_behaviour() -> None:
    cfg = _cfg()
    m = cfg.models[0]
    assert (m.routing, m.affinity, m.shed) == ("weighted", None, None)
    assert (cfg.routing.metrics_interval_s, cfg.routing.metrics_stale_s) == (0.5, 3.0)


def test_full_routing_config_reaches_the_model_table() -> None:
    cfg = _cfg(
        "    routing: load_aware\n    affinity: header:X-Session-Id\n"
        "    shed: {max_waiting: 20, max_kv_usage: 0.95}",
        "routing: {metrics_interval_s: 0.25, metrics_stale_s: 2}",
    )
    entry = ModelTable.from_config(cfg).entries["m"]
    assert entry.routing == "load_aware"
    assert entry.affinity == "header:x-session-id"  # header names are case-insensitive: stored lower-case
    assert entry.shed is not None and (entry.shed.max_waiting, entry.shed.max_kv_usage) == (20, 0.95)
    assert cfg.routing.metrics_interval_s == 0.25
    assert _cfg("    affinity: user").models[0].affinity == "user"


@pytest.mark.parametrize("bad", ["header", "header:", "cookie:sid", "header:x session", "session"])
def test_bad_affinity_says_what_to_write(bad: str) -> None:
    (problem,) = _problems(f"    affinity: '{bad}'")
    assert problem.startswith("models[0].affinity:")
    assert "header:<header name>" in problem and "`user`" in problem


def test_bad_routing_and_shed_values() -> None:
    (p,) = _problems("    routing: round_robin")
    assert p.startswith("models[0].routing:") and "load_aware" in p
    (p,) = _problems("    shed: {}")
    assert p.startswith("models[0].shed") and "max_waiting" in p
    (p,) = _problems("    shed: {max_kv_usage: 1.5}")
    assert p.startswith("models[0].shed.max_kv_usage:")
    (p,) = _problems("    shed: {max_waiting: 0}")
    assert p.startswith("models[0].shed.max_waiting:")
    (p,) = _problems("    shed: {max_queue: 3}")
    assert p == "models[0].shed.max_queue: unknown field"


def test_stale_must_exceed_interval() -> None:
    (p,) = _problems(top="routing: {metrics_interval_s: 2, metrics_stale_s: 1}")
    assert p.startswith("routing:") and "metrics_stale_s" in p and "saturated" in p
    (p,) = _problems(top="routing: {metrics_every: 2}")
    assert p == "routing.metrics_every: unknown field"


def test_check_config_reports_bad_affinity_and_summarises_routing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "g.yaml"
    f.write_text(BASE.format(extra="    affinity: 'header'", top=""))
    assert main(["check-config", str(f)]) == 1
    err = capsys.readouterr().err
    assert "models[0].affinity" in err and "header:<header name>" in err
    f.write_text(BASE.format(extra="    routing: load_aware\n    affinity: user\n    shed: {max_waiting: 4}", top=""))
    assert main(["check-config", str(f)]) == 0
    out = capsys.readouterr().out
    assert "model m: load_aware, affinity user, shed max_waiting=4" in out
    assert "/metrics of 2 upstreams scraped every 0.5s (older than 3s: saturated)" in out
