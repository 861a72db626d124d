from __future__ import annotations

import pytest

from gateway.config import ConfigError, parse_config

GOOD = """
models:
  - id: deepseek-7b-local
    upstreams:
      - name: gpu0-7b
        url: http://127.0.0.1:8001/v1/
        model: /models/deepseek-llm-7b-chat
        api_key: ${VLLM_KEY_A}
      - url: http://127.0.0.1:8002
        model: /models/deepseek-llm-7b-chat
        api_key: ${VLLM_KEY_B:-fallback}
keys:
  - name: team-a
    key_sha256: "%s"
    models: ["deepseek-7b-local"]
  - name: dev
    key: sk-dev
""" % ("ab" * 32)


def test_good_config_with_env_interpolation_and_defaults() -> None:
    cfg = parse_config(GOOD, {"VLLM_KEY_A": "secret-a"})
    m = cfg.models[0]
    assert [u.name for u in m.upstreams] == ["gpu0-7b", "deepseek-7b-local-1"]
    assert m.upstreams[0].url == "http://127.0.0.1:8001"  # /v1 and trailing slash stripped
    assert m.upstreams[0].api_key_value() == "secret-a"
    assert m.upstreams[1].api_key_value() == "fallback"
    assert "secret-a" not in repr(cfg)  # secrets never show in reprs or logs


def _problems(text: str, env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text, env or {})
    return info.value.problems


def test_missing_env_variable_names_the_field() -> None:
    assert _problems(GOOD) == ["models[0].upstreams[0].api_key: environment variable ${VLLM_KEY_A} is not set"]


def test_unknown_field_is_an_error_with_its_path() -> None:
    text = "models:\n  - id: a\n    upstreams:\n      - url: http://h:1\n        model: m\n        api_kye: x\n"
    assert _problems(text) == ["models[0].upstreams[0].api_kye: unknown field"]


def test_duplicate_model_ids() -> None:
    text = "models:\n" + "  - id: a\n    upstreams: [{url: 'http://h:1', model: m}]\n" * 2
    assert any("duplicate model id 'a'" in p for p in _problems(text))


def test_bad_url() -> None:
    text = "models:\n  - id: a\n    upstreams: [{url: 'localhost:8000', model: m}]\n"
    (problem,) = _problems(text)
    assert problem.startswith("models[0].upstreams[0].url:") and "http(s) URL" in problem


def test_key_needs_exactly_one_secret_form_and_known_models() -> None:
    assert any("exactly one" in p for p in _problems("keys:\n  - name: a\n"))
    assert any("64 hex" in p for p in _problems("keys:\n  - name: a\n    key_sha256: abc\n"))
    text = "keys:\n  - name: a\n    key: sk-x\n    models: [nope]\n"
    assert any("unknown model 'nope'" in p for p in _problems(text))


def test_not_yaml_and_not_a_mapping() -> None:
    assert "not valid YAML" in _problems("models: [")[0]
    assert "top level" in _problems("- a\n- b\n")[0]


def test_dollar_escape() -> None:
    cfg = parse_config("keys:\n  - name: a\n    key: 'pa$$word'\n", {})
    assert cfg.keys[0].key is not None and cfg.keys[0].key.get_secret_value() == "pa$word"


def test_default_upstream_names_are_valid_names_for_any_model_id() -> None:
    from gateway.config.schema import ModelSpec

    for model_id in ("<img src=x onerror=alert(1)>", "org/model-7b", "_x", "modèle"):
        m = ModelSpec.model_validate({"id": model_id, "upstreams": [{"url": "http://127.0.0.1:1", "model": "x"}]})
        name = m.upstreams[0].name
        assert name is not None and name.endswith("-0")
        assert ModelSpec.model_validate(m.model_dump()).upstreams[0].name == name  # round-trips (admin PUT)


@pytest.mark.parametrize("key", ["secret-a\n", "sec ret", "sécret"])
def test_a_backend_key_that_cannot_be_a_header_value_is_refused_without_echoing_it(key: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(GOOD, {"VLLM_KEY_A": key})
    text = str(info.value)
    assert "models[0].upstreams[0].api_key" in text and "printable ASCII" in text
    assert key.strip() not in text
