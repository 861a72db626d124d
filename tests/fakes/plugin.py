"""pytest plugin: the `fake_vllm` factory fixture. Enable with `pytest_plugins = ["tests.fakes.plugin"]`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.fakes.fake_vllm import FakeVLLM

FakeVLLMFactory = Callable[..., FakeVLLM]


@contextmanager
def fake_vllm_servers() -> Iterator[FakeVLLMFactory]:
    """Yields `start(**FakeVLLM kwargs) -> started FakeVLLM`; stops them all on exit and fails if
    any of them hit an internal error."""
    started: list[FakeVLLM] = []

    def start(**kwargs: Any) -> FakeVLLM:
        fake = FakeVLLM(**kwargs)
        started.append(fake)
        return fake.start()

    try:
        yield start
    finally:
        for fake in started:
            fake.stop()
    errors = [error for fake in started for error in fake.errors]
    if errors:
        raise AssertionError(f"fake vLLM handler errors: {errors!r}") from errors[0]


@pytest.fixture
def fake_vllm() -> Iterator[FakeVLLMFactory]:
    """Factory of started fake vLLM servers, all stopped at teardown: `fake = fake_vllm(api_key=None)`."""
    with fake_vllm_servers() as start:
        yield start
