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


def test_normalisation_is_linear_in_repeated_v1() -> None:
    """Stripping one `/v1` at a time by slicing was quadratic: a long URL of `/v1/v1/...` pinned a core."""
    import time

    def cost(n: int) -> float:
        path = "/v1" * n + "/models"
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter()
            assert normalize_path(path) == "/v1/models"
            best = min(best, time.perf_counter() - t)
        return best

    small, large = cost(10_000), cost(160_000)  # 16x the input: ~16x the time when linear, ~256x when quadratic
    assert large < 80 * small, (small, large)
