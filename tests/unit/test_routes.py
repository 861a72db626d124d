from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.api.routes import normalize_path, route_label, suggest


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/v1/chat/completions", "/v1/chat/completions"),
        ("/chat/completions", "/v1/chat/completions"),
        ("/v1/v1/chat/completions", "/v1/chat/completions"),
        ("/v1/v1/v1/completions/", "/v1/completions"),
        ("/v1/chat/completions/", "/v1/chat/completions"),
        ("/models", "/v1/models"),
        ("/v1/models/org/model-7b", "/v1/models/org/model-7b"),
        ("/models/org/model-7b/", "/v1/models/org/model-7b"),
        ("/embeddings", "/v1/embeddings"),
        ("/responses", "/v1/responses"),
        ("/health/", "/health"),
        ("/health/ready", "/health/ready"),
        ("/metrics", "/metrics"),
        ("/", "/"),
        ("/v1", "/v1"),
        ("/v1/unknown", "/v1/unknown"),
        ("/chat/completionsx", "/chat/completionsx"),
    ],
)
def test_normalize(path: str, expected: str) -> None:
    assert normalize_path(path) == expected


@given(st.sampled_from(["/chat/completions", "/completions", "/embeddings", "/responses", "/models"]),
       st.integers(min_value=0, max_value=4), st.booleans())
def test_any_number_of_v1_prefixes_and_a_trailing_slash(tail: str, n: int, slash: bool) -> None:
    path = "/v1" * n + tail + ("/" if slash else "")
    assert normalize_path(path) == "/v1" + tail
    assert normalize_path(normalize_path(path)) == normalize_path(path)


def test_route_labels_are_bounded() -> None:
    assert route_label("/v1/chat/completions") == "/v1/chat/completions"
    assert route_label("/v1/models/anything") == "/v1/models/{model}"
    assert route_label("/random/client/path") == "other"


def test_suggest() -> None:
    assert suggest("/v1/chat/completion") == "/v1/chat/completions"
    assert suggest("/zzzzzzzzzzzzzzzzzzz") is None
