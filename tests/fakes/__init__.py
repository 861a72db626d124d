"""Test doubles for the gateway's upstreams. See `fake_vllm.py`."""

from tests.fakes.fake_vllm import (
    Behaviour,
    FakeVLLM,
    Fault,
    Hang,
    MalformedSSE,
    RecordedRequest,
    ResetAfter,
    Respond,
    StallAfter,
)
from tests.fakes.vllm_api import ENGINE_DEAD_BODY, generated_tokens

__all__ = [
    "ENGINE_DEAD_BODY",
    "Behaviour",
    "FakeVLLM",
    "Fault",
    "Hang",
    "MalformedSSE",
    "RecordedRequest",
    "ResetAfter",
    "Respond",
    "StallAfter",
    "generated_tokens",
]
