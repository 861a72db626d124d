"""The rate-limit fields of the config, validated like every other field (paths in the messages)."""

from __future__ import annotations

import pytest

from gateway.auth.keys import StaticKeyStore
from gateway.config import ConfigError, parse_config
from gateway.mappings.snapshot import ModelTable

BASE = """
models:
  - id: big-70b
    rpm: 300
    tpm: 500000
    max_parallel: 32
    upstreams: [{url: "http://h:1", model: m, launch: {model_path: /m, max_model_len: 8192}}]
  - id: small
    upstreams: [{url: "http://h:2", model: s}]
keys:
  - name: team-a
    key: sk-a
    rpm: 600
    tpm: 200000
    max_parallel: 16
    burst_requests: 60
    burst_tokens: 50000
    per_model:
      big-70b: {rpm: 60, tpm: 50000, max_parallel: 4}
  - name: free
    key: sk-free
rate_limits:
  redis_failure: fail_closed
  default_max_tokens: 256
  redis_timeout_ms: 20
"""


def test_the_issue_example_parses_and_reaches_principal_and_model_entry() -> None:
    cfg = parse_config(BASE, {})
    assert cfg.rate_limits.redis_failure == "fail_closed" and cfg.rate_limits.default_max_tokens == 256
    a = StaticKeyStore(cfg.keys).authenticate("Bearer sk-a")
    assert a.limits is not None and (a.limits.rpm, a.limits.burst_tokens) == (600, 50000)
    assert a.per_model["big-70b"].max_parallel == 4
    free = StaticKeyStore(cfg.keys).authenticate("Bearer sk-free")
    assert free.limits is None and not free.per_model
    table = ModelTable.from_config(cfg)
    big = table.entries["big-70b"]
    assert big.limits is not None and big.limits.tpm == 500000 and big.max_model_len == 8192
    assert table.entries["small"].limits is None and table.entries["small"].max_model_len is None


def _problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text, {})
    return info.value.problems


@pytest.mark.parametrize(("old", "new", "expected"), [
    ("    rpm: 600\n", "    rpm: 0\n", "keys[0].rpm: Input should be greater than or equal to 1"),
    ("    rpm: 600\n", "", "keys[0]: `burst_requests` needs `rpm`"),
    ("      big-70b: {rpm: 60", "      nope: {rpm: 60", "key 'team-a': per_model names unknown model 'nope'"),
    ("      big-70b: {rpm: 60, tpm: 50000, max_parallel: 4}", "      big-70b: {rpm: 60, tmp: 5}",
     "keys[0].per_model.big-70b.tmp: unknown field"),
    ("  redis_failure: fail_closed", "  redis_failure: fail_maybe",
     "rate_limits.redis_failure: Input should be 'fail_open' or 'fail_closed'"),
    ("  redis_timeout_ms: 20", "  redis_timeout_ms: 0",
     "rate_limits.redis_timeout_ms: Input should be greater than or equal to 1"),
    ("    max_parallel: 32\n", "    max_parallel: -1\n",
     "models[0].max_parallel: Input should be greater than or equal to 1"),
])
def test_bad_rate_limit_fields_name_the_field(old: str, new: str, expected: str) -> None:
    assert BASE.count(old) == 1
    problems = _problems(BASE.replace(old, new))
    assert any(expected in p for p in problems), problems


def test_per_model_limits_for_a_model_the_key_may_not_use() -> None:
    text = BASE.replace("    key: sk-a\n", "    key: sk-a\n    models: [small]\n")
    assert any("per_model names model 'big-70b', which the key may not use" in p for p in _problems(text))
