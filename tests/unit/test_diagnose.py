"""`gateway backends diagnose`: every signature on a real log excerpt, the rank order, the CLI.

Fixtures (tests/fixtures/vllm_logs/):
- ``cpu/``: whole logs of the real vLLM CPU server failing here, made by
  ``scripts/capture_vllm_failures.py`` (never edited);
- ``issues/``: excerpts of logs that users posted in GitHub issues (source URL on the first line),
  for the GPU failures this machine cannot produce.
Signatures whose vLLM 0.32 wording has no public log yet are checked against the installed
vLLM source text instead (``Signature.source``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.launch.diagnose import analyse, last_run, match_line, process_of
from gateway.launch.signatures import LAYERS, SIGNATURES, by_id

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm_logs"
VLLM_SITE = sorted((Path(__file__).resolve().parents[2] / ".venv-vllm" / "lib").glob("python3*/site-packages"))

# fixture -> (signature id of the root cause, layer, words the explanation must contain)
CASES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "cpu/hd16-engine-crash.log": ("cpu-head-dim", "model", ("head size 16",)),
    "cpu/tp2-hd16-engine-crash.log": ("cpu-head-dim", "model", ("head size 16",)),
    "cpu/port-in-use.log": ("port-in-use", "resources", ("another port",)),
    "cpu/max-model-len-too-long.log": ("max-model-len-limit", "split", ("4096", "max_position_embeddings=2048.0")),
    "cpu/kv-cache-too-small.log": ("kv-cache-too-small", "split", ("2048", "896")),
    "cpu/model-path-missing.log": ("model-path-missing", "model", ("/srv/models/no-such-model",)),
    "cpu/model-config-broken.log": ("model-config-invalid", "model", ("config.json",)),
    "cpu/tp-heads-not-divisible.log": ("tp-heads", "split", ("tensor_parallel_size 3", "4 attention heads")),
    "cpu/tp2-numa-nodes.log": ("cpu-numa-nodes", "visibility", ("2 ranks", "VLLM_CPU_OMP_THREADS_BIND")),
    "cpu/bus-error.log": ("bus-error", "resources", ("shm_size",)),
    "issues/nccl-watchdog-only.log": ("nccl-watchdog-timeout", "communication", ("ALLREDUCE", "1800270 ms")),
    "issues/nccl-watchdog-timeout.log": ("worker-died", "resources", ("exit code -6",)),
    "issues/nccl-system-error.log": ("nccl-system-error", "communication", ("/dev/shm",)),
    "issues/nccl-shm.log": ("nccl-shm", "resources", ("shm_size",)),
    "issues/nccl-warn.log": ("nccl-warn", "communication", ("ibv_reg_dmabuf_mr",)),
    "issues/quant-dtype.log": ("quant-dtype", "split", ("awq", "torch.bfloat16")),
    "issues/kv-cache-too-small-old.log": ("kv-cache-too-small-old", "split", ("60000", "58384")),
    "issues/cuda-oom.log": ("cuda-oom", "resources", ("160.00 MiB",)),
    "issues/free-memory.log": ("free-memory", "resources", ("59.32 of 79.15 GiB", "71.24 GiB")),
    "issues/local-world-size.log": ("local-world-size", "visibility", ("16 ranks", "8 GPUs")),
    "issues/invalid-device-ordinal.log": ("invalid-device-ordinal", "visibility", ("cuda_visible_devices",)),
    "issues/driver-too-old.log": ("driver-too-old", "versions", ("11040",)),
    "issues/undefined-symbol.log": ("undefined-symbol", "versions", ("_C.abi3.so",)),
}
# Signatures checked on the vLLM 0.32 source text (no public log with this wording) or that only
# appear next to a root cause (consequences and notes, checked in the tests below).
SOURCE_ONLY = {"no-cuda-gpus", "world-size-gpus", "no-kv-memory"}
SECONDARY = {"engine-init-failed", "engine-dead", "nofile-ulimit", "nccl-socket-interface", "nccl-no-ib",
             "nccl-init-rank"}


def read(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


@pytest.mark.parametrize("fixture", sorted(CASES))
def test_signature_on_real_log(fixture: str) -> None:
    sig_id, layer, words = CASES[fixture]
    diag = analyse(read(fixture))
    assert diag.root is not None, f"{fixture}: nothing matched"
    assert (diag.root.signature.id, diag.root.signature.layer) == (sig_id, layer)
    text = diag.root.cause + " " + diag.root.change
    for w in words:
        assert w in text, f"{w!r} not in {text!r}"
    assert diag.status == 1 and not diag.healthy
    assert "{" not in text  # every placeholder filled


def test_every_signature_has_a_real_case() -> None:
    covered = {c[0] for c in CASES.values()} | SOURCE_ONLY | SECONDARY
    assert {s.id for s in SIGNATURES} == covered
    assert {s.layer for s in SIGNATURES} == set(LAYERS)
    assert len({s.id for s in SIGNATURES}) == len(SIGNATURES)


def test_source_wordings_are_in_the_installed_vllm() -> None:
    """The signatures that name a vLLM file match that file's message text (vLLM 0.32)."""
    if not VLLM_SITE:
        if __import__("os").environ.get("VLLM_TIER_REQUIRED") == "1":
            pytest.fail("no .venv-vllm: cannot check the signatures against vLLM's source")
        pytest.skip("no .venv-vllm here: vLLM's source is not installed")
    site = VLLM_SITE[0]
    sources = [s for s in SIGNATURES if s.source]
    assert {s.id for s in sources} >= SOURCE_ONLY
    for sig in sources:
        text = (site / sig.source).read_text() if sig.source else ""
        # Join the f-string pieces of each statement and put sample values in the {fields}.
        joined = re.sub(r'"\s*\n\s*f?"', "", text)
        rendered = re.sub(r"\{[^{}]*\}", "7", joined).replace("%s", "7")
        line = next((ln for ln in rendered.splitlines() if sig.pattern.search(ln)), None)
        assert line is not None, f"{sig.id}: {sig.pattern.pattern!r} not in {sig.source}"


def test_secondary_signatures_on_real_logs() -> None:
    engine_init = analyse(read("cpu/kv-cache-too-small.log"))
    assert "engine-init-failed" in [e.signature.id for e in engine_init.related]
    crash = analyse(read("cpu/hd16-engine-crash.log"))
    assert "engine-dead" in [e.signature.id for e in crash.related]
    assert [n.signature.id for n in crash.notes] == ["nofile-ulimit"]
    assert "20000" in crash.notes[0].cause


def test_nccl_debug_info_lines_are_notes() -> None:
    """NCCL_DEBUG=INFO output: what NCCL chose is shown, but it is no diagnosis (this start was still going)."""
    diag = analyse(read("issues/nccl-debug-info.log"))
    assert diag.root is None and diag.silent
    notes = {n.signature.id: n for n in diag.notes}
    assert set(notes) == {"nccl-socket-interface", "nccl-no-ib", "nccl-init-rank"}
    assert "[0]eth0:172.17.0.3<0>" in notes["nccl-socket-interface"].cause
    assert notes["nccl-init-rank"].cause == "rank 1 of 2 started its NCCL communicator"


def test_root_cause_is_in_the_first_rank_to_fail() -> None:
    """Two CPU ranks hit the same missing kernel; TP0 logged first, TP1, the engine and the API followed."""
    diag = analyse(read("cpu/tp2-hd16-engine-crash.log"))
    assert diag.root is not None and diag.root.process is not None
    assert diag.root.process.startswith("Worker_TP0 ")
    order = [p.split()[0] for p, _ in diag.failed]
    assert order == ["Worker_TP0", "Worker_TP1", "EngineCore", "APIServer"]
    assert diag.ranks == {0: 2, 1: 2}


def test_a_dead_worker_outranks_the_timeouts_that_follow() -> None:
    """The others only time out: the worker that died first is the diagnosis, the watchdog follows."""
    diag = analyse(read("issues/nccl-watchdog-timeout.log"))
    assert diag.root is not None and diag.root.signature.id == "worker-died"
    assert [e.signature.id for e in diag.related] == ["nccl-watchdog-timeout"]
    assert diag.related[0].process == "rank 0"


def test_only_timeouts_shows_the_error_block() -> None:
    diag = analyse(read("issues/nccl-watchdog-only.log"))
    assert diag.root is not None and diag.root.signature.kind == "consequence"
    assert any("Watchdog caught" in line for line in diag.error_block)


def test_process_labels_of_vllm_log_prefixes() -> None:
    lines = read("issues/rank-prefixes.log").splitlines()
    assert process_of(lines[1]) == "VllmWorker rank=0 pid=85"
    assert process_of("(Worker_TP1 pid=26275) ERROR 11-30 20:53:43 [x.py:1] boom") == "Worker_TP1 pid=26275"
    assert process_of("[rank1]: RuntimeError: NCCL error") == "rank 1"
    assert process_of("INFO 01-01 plain line") is None


def test_healthy_logs() -> None:
    for name, world in (("cpu/healthy.log", 1), ("cpu/tp2-healthy.log", 2)):
        diag = analyse(read(name))
        assert diag.healthy and diag.status == 0 and diag.started, name
        assert diag.ranks == {r: world for r in range(world)}


def test_unknown_failure_gives_the_last_error_block() -> None:
    diag = analyse(read("cpu/bad-argument.log"))
    assert diag.root is None and not diag.healthy and diag.status == 1
    assert diag.error_block == [line for line in read("cpu/bad-argument.log").splitlines()
                                if "error: argument --dtype: invalid choice: 'float42'" in line]


def test_unknown_traceback_block_ends_at_its_exception() -> None:
    log = read("cpu/model-config-broken.log")
    lines = log.splitlines()
    start = max(i for i, line in enumerate(lines) if "Traceback (most recent call last):" in line)
    # Cut the known message off: the same real traceback, now unknown.
    text = "\n".join(lines[: start + 1] + [ln for ln in lines[start + 1:] if "not a valid JSON" not in ln])
    diag = analyse(text)
    assert diag.root is None
    assert diag.error_block[0].endswith("Traceback (most recent call last):")
    assert len(diag.error_block) <= 20


def test_only_the_last_start_of_a_launcher_log_counts() -> None:
    failed, healthy = read("cpu/port-in-use.log"), read("cpu/healthy.log")
    header = "===== 2026-11-30 20:44:00 gateway backends: starting tiny (http://127.0.0.1:8001)\n===== cmd\n"
    log = header + failed + "\n" + header + healthy
    assert last_run(log).startswith("===== 2026") and "Address already in use" not in last_run(log)
    assert analyse(log).healthy
    assert analyse(header + healthy + "\n" + header + failed).root is not None


def test_table_order_picks_the_specific_nccl_line() -> None:
    hit = match_line(read("issues/nccl-shm.log").splitlines()[1])
    assert hit is not None and hit[0].id == "nccl-shm"
    assert by_id("nccl-warn").layer == "communication"
    with pytest.raises(KeyError):
        by_id("no-such-signature")


# -- the command -------------------------------------------------------------------------------------


def test_cli_diagnosis_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["backends", "diagnose", "tiny", "--log", str(FIXTURES / "cpu/tp2-hd16-engine-crash.log")])
    out = capsys.readouterr().out
    assert rc == 1
    assert "DIAGNOSIS: model layer" in out and "[cpu-head-dim]" in out
    assert "first failure (line" in out and "Worker_TP0 pid=26274" in out
    assert "Unsupported CPU attention configuration: head_dim=16" in out
    assert "change: serve a model whose head size" in out
    assert "ranks initialised: 2 of 2" in out


def test_cli_healthy_exit_0_and_unknown_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["backends", "diagnose", "tiny", "--log", str(FIXTURES / "cpu/healthy.log")]) == 0
    assert "healthy: no error in the last start (the server reported it was serving)" in capsys.readouterr().out
    assert main(["backends", "diagnose", "tiny", "--log", str(FIXTURES / "cpu/bad-argument.log")]) == 1
    out = capsys.readouterr().out
    assert "no known failure signature matched; the last error block:" in out
    assert "invalid choice: 'float42'" in out


def test_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    rc = main(["backends", "diagnose", "tiny", "--json", "--log", str(FIXTURES / "issues/nccl-watchdog-timeout.log")])
    report = json.loads(capsys.readouterr().out)
    assert rc == 1 and report["status"] == "diagnosis" and report["exit"] == 1
    root = report["root"]
    assert (root["layer"], root["signature"], root["line"]) == ("resources", "worker-died", 2)
    assert [r["signature"] for r in report["related"]] == ["nccl-watchdog-timeout"]
    assert main(["backends", "diagnose", "tiny", "--json", "--log", str(FIXTURES / "cpu/bad-argument.log")]) == 1
    assert json.loads(capsys.readouterr().out)["status"] == "unknown"


def test_cli_no_log_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["backends", "diagnose", "tiny", "--log", str(tmp_path / "missing.log")]) == 2
    assert "no log to read" in capsys.readouterr().err
    (tmp_path / "empty.log").write_text("")
    assert main(["backends", "diagnose", "tiny", "--log", str(tmp_path / "empty.log")]) == 2


def test_cli_finds_the_launcher_log_from_the_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "gw.yaml"
    cfg.write_text("models:\n  - id: m\n    upstreams:\n      - name: tiny\n        url: http://127.0.0.1:8001\n"
                   "        model: tiny\n        launch: {model_path: /m, device: cpu}\n"
                   "      - name: plain\n        url: http://127.0.0.1:8002\n        model: tiny\n")
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "tiny.log").write_text(read("cpu/max-model-len-too-long.log"))
    base = ["backends", "diagnose", "--config", str(cfg), "--log-dir", str(logs), "--state-dir", str(tmp_path)]
    assert main([*base, "tiny"]) == 1
    out = capsys.readouterr().out
    assert "DIAGNOSIS: split layer" in out
    assert "  launch: " in out and " ".join(out.split()).endswith("device cpu, tensor_parallel_size 1")
    assert main([*base, "plain"]) == 2  # no launch section: nothing says where its log is
    assert "--log FILE" in capsys.readouterr().err
    assert main([*base, "nope"]) == 2


def test_a_start_still_loading_is_not_called_healthy(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The healthy log read before the server was up: no error, no 'serving' line yet."""
    lines = read("cpu/healthy.log").splitlines()
    ready = next(i for i, line in enumerate(lines) if "Application startup complete" in line)
    diag = analyse("\n".join(lines[:ready]))
    assert diag.silent and not diag.healthy and diag.status == 1
    assert diag.error_block == [line for line in lines[:ready] if line.strip()][-10:]
    (tmp_path / "loading.log").write_text("\n".join(lines[:ready]))
    assert main(["backends", "diagnose", "tiny", "--log", str(tmp_path / "loading.log")]) == 1
    assert "never reported serving" in capsys.readouterr().out
