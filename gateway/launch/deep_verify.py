"""``gateway backends verify --deep NAME``: the checks that prove a (multi-GPU) backend works.

Seed 004's verification after a start: every rank initialised (from the log), GPU memory roughly
balanced across the backend's GPUs (a lopsided split means a GPU is not really taking part), one
request answered, requests of increasing length up to ``max_model_len``, and the same prompt at
temperature 0 giving the same tokens on repeated calls. Each check gives a :class:`Check` with
ok / warn / fail / skip and its numbers. The HTTP checks use a synchronous ``httpx.Client``
(no environment proxies, like the gateway); the pure ones take parsed inputs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from gateway.launch.diagnose import Diagnosis
from gateway.launch.gpu_state import GpuUse

Status = Literal["ok", "warn", "fail", "skip"]
BALANCE_OK = 0.85  # least-used / most-used GPU memory of the group
BALANCE_WARN = 0.5
DETERMINISM_CALLS = 3
DETERMINISM_TOKENS = 16
PROMPT = "The capital of France is"


@dataclass(frozen=True)
class Check:
    status: Status
    name: str
    detail: str


def check_ranks(diag: Diagnosis | None, world: int | None, log: str) -> Check:
    """Every rank 0..world-1 logged its distributed init line, and the log shows no failure."""
    if diag is None:
        return Check("skip", "ranks", f"no log to read ({log}); pass --log-dir/--state-dir or start it with "
                     "`gateway backends up`")
    if diag.root is not None and diag.root.signature.kind != "note":
        return Check("fail", "ranks", f"the log shows a failure ({diag.root.signature.layer}/"
                     f"{diag.root.signature.id}, line {diag.root.line_no}); run `gateway backends diagnose`")
    expected = world or (max(diag.ranks.values()) if diag.ranks else None)
    if not diag.ranks:
        return Check("warn", "ranks", f"no rank init line (world_size=... rank=...) in {log}; cannot tell "
                     "whether every rank started")
    assert expected is not None
    seen = sorted(diag.ranks)
    missing = [r for r in range(expected) if r not in diag.ranks]
    if missing:
        return Check("fail", "ranks", f"{len(seen)} of {expected} ranks initialised (missing rank "
                     f"{', '.join(map(str, missing))}) in {log}")
    return Check("ok", "ranks", f"{len(seen)} of {expected} ranks initialised ({log})")


def check_balance(gpus: Sequence[GpuUse] | None, devices: Sequence[str], cpu: bool) -> Check:
    """Memory used on the backend's GPUs: the least-used one should hold about as much as the most."""
    if cpu:
        return Check("skip", "gpu-memory", "device cpu: no GPUs, GPU memory balance not checked")
    if gpus is None:
        return Check("skip", "gpu-memory", "no working nvidia-smi here: GPU memory balance not checked")
    if not all(d.isdigit() for d in devices):
        return Check("skip", "gpu-memory", f"devices {','.join(devices)} are UUIDs/MIG ids: balance not checked")
    by_index = {g.index: g for g in gpus}
    group = [by_index.get(int(d)) for d in devices]
    if any(g is None or g.used_mib is None for g in group):
        return Check("warn", "gpu-memory", f"nvidia-smi has no memory figure for every GPU of {','.join(devices)}")
    used = [(g.index, g.used_mib) for g in group if g is not None and g.used_mib is not None]
    listing = ", ".join(f"GPU {i}: {m} MiB" for i, m in used)
    if len(used) == 1:
        return Check("ok", "gpu-memory", f"one GPU ({listing})")
    low, high = min(m for _, m in used), max(m for _, m in used)
    ratio = low / high if high else 1.0
    if ratio >= BALANCE_OK:
        return Check("ok", "gpu-memory", f"balanced: least/most used = {ratio:.2f} ({listing})")
    verdict: Status = "warn" if ratio >= BALANCE_WARN else "fail"
    return Check(verdict, "gpu-memory", f"lopsided: least/most used = {ratio:.2f} ({listing}); a GPU that holds "
                 "much less is not really taking part (wrong CUDA_VISIBLE_DEVICES, another process on the "
                 "others, or an uneven split)")


class Backend:
    """The backend's OpenAI API, as the checks use it."""

    def __init__(self, client: httpx.Client, base_url: str, model: str, api_key: str | None) -> None:
        self.client, self.base, self.model = client, base_url.rstrip("/"), model
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return self.client.post(self.base + path, json=body, headers=self.headers)

    def complete(self, prompt: str | list[int], max_tokens: int) -> tuple[httpx.Response, float]:
        t0 = time.monotonic()
        r = self.post("/v1/completions", {"model": self.model, "prompt": prompt, "max_tokens": max_tokens,
                                          "temperature": 0, "ignore_eos": True})
        return r, time.monotonic() - t0

    def max_model_len(self) -> int | None:
        r = self.client.get(self.base + "/v1/models", headers=self.headers)
        if r.status_code != 200:
            return None
        for m in r.json().get("data", []):
            if m.get("id") == self.model and isinstance(m.get("max_model_len"), int):
                return int(m["max_model_len"])
        return None

    def token_ids(self, text: str) -> list[int] | None:
        r = self.post("/tokenize", {"model": self.model, "prompt": text, "add_special_tokens": False})
        if r.status_code != 200:
            return None
        tokens = r.json().get("tokens")
        return [int(t) for t in tokens] if isinstance(tokens, list) and tokens else None


def _error(r: httpx.Response) -> str:
    try:
        msg = r.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        msg = r.text[:200]
    return f"HTTP {r.status_code}: {msg}"


def check_one_request(api: Backend) -> Check:
    try:
        r, secs = api.complete(PROMPT, 8)
    except httpx.HTTPError as exc:
        return Check("fail", "request", f"POST /v1/completions failed: {exc!r}")
    if r.status_code != 200:
        return Check("fail", "request", f"POST /v1/completions: {_error(r)}")
    usage = r.json().get("usage") or {}
    return Check("ok", "request", f"answered in {secs:.2f} s ({usage.get('prompt_tokens')} prompt + "
                 f"{usage.get('completion_tokens')} completion tokens)")


def lengths_for(max_len: int) -> list[int]:
    """Prompt lengths to try: 1/8, 1/4, 1/2 of max_model_len, then max_model_len - 1 (one token out)."""
    return sorted({n for n in (max_len // 8, max_len // 4, max_len // 2, max_len - 1) if n >= 1})


def check_lengths(api: Backend, max_len: int | None) -> list[Check]:
    """Token-id prompts of increasing length, the last one filling max_model_len."""
    try:
        max_len = max_len or api.max_model_len()
        unit = api.token_ids("Hello world. ")
    except httpx.HTTPError as exc:
        return [Check("fail", "lengths", f"cannot query the backend: {exc!r}")]
    if not max_len:
        return [Check("skip", "lengths", "max_model_len unknown (not in /v1/models nor launch.max_model_len)")]
    if unit is None:
        return [Check("skip", "lengths", "POST /tokenize did not answer: cannot build prompts of known length")]
    out = []
    for n in lengths_for(max_len):
        prompt = (unit * (n // len(unit) + 1))[:n]
        try:
            r, secs = api.complete(prompt, 1)
        except httpx.HTTPError as exc:
            out.append(Check("fail", "lengths", f"{n} of {max_len} tokens: {exc!r}"))
            break
        if r.status_code != 200:
            out.append(Check("fail", "lengths", f"{n} of {max_len} tokens: {_error(r)}"))
            break
        got = (r.json().get("usage") or {}).get("prompt_tokens")
        status: Status = "ok" if got == n else "warn"
        out.append(Check(status, "lengths", f"{n} of {max_len} tokens: answered in {secs:.2f} s"
                         + ("" if got == n else f" (the backend counted {got} prompt tokens)")))
    return out


def check_determinism(api: Backend, calls: int = DETERMINISM_CALLS, tokens: int = DETERMINISM_TOKENS) -> Check:
    texts = []
    for _ in range(calls):
        try:
            r, _ = api.complete(PROMPT, tokens)
        except httpx.HTTPError as exc:
            return Check("fail", "determinism", f"request failed: {exc!r}")
        if r.status_code != 200:
            return Check("fail", "determinism", _error(r))
        texts.append(r.json()["choices"][0]["text"])
    if all(t == texts[0] for t in texts):
        return Check("ok", "determinism", f"{calls} of {calls} temperature-0 answers identical ({tokens} tokens: "
                     f"{texts[0][:40]!r})")
    first = next(i for i, t in enumerate(texts) if t != texts[0])
    return Check("fail", "determinism", f"temperature 0 gave different text on call {first + 1}: "
                 f"{texts[0][:40]!r} vs {texts[first][:40]!r} (numerical problems in the parallel split?)")
