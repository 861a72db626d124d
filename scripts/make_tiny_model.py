"""Build a tiny random-weight Llama model that a real vLLM (CPU build) can serve.

Run it with the vLLM venv's interpreter (it needs torch, transformers and tokenizers)::

    .venv-vllm/bin/python scripts/make_tiny_model.py            # -> var/tiny-model
    .venv-vllm/bin/python scripts/make_tiny_model.py /tmp/tiny  # any directory
    .venv-vllm/bin/python scripts/make_tiny_model.py --head-dim 16 var/tiny-model-hd16

Nothing is downloaded (HF_HUB_OFFLINE=1). The output is deterministic: a seeded synthetic
corpus trains a byte-level BPE tokenizer and a fixed seed initialises the weights, so two runs
with the same torch/transformers versions give identical files. About 1.8 MB, a few seconds.

Shape (see vllm/RECIPE.md): hidden 128, intermediate 256, 2 layers, 4 attention heads, 4 KV heads,
head_dim 32 (the CPU attention backend rejects head sizes below 32 on the first request),
vocab 2048, bfloat16, max_position_embeddings 2048. The tokenizer carries a Jinja chat template so
``/v1/chat/completions`` works. Generated text is random.

``--max-position-embeddings N`` builds the same model claiming a longer context (weights identical:
RoPE has no learned positions), e.g. ``--max-position-embeddings 32768 var/tiny-model-long`` for
vLLM's ``--max-model-len 32768``, which Claude Code's ~21k-token prompts need. ``--short-answers``
makes half the vocabulary stop tokens (generation_config ``eos_token_id``), so answers end after a
few tokens with ``end_turn``, as Claude Code expects of a turn, instead of at ``max_tokens``.

``--head-dim N`` (default 32) builds the same kind of model with another attention head size:
4 heads of N, so hidden 4*N and intermediate 8*N (the default is exactly the shape above, byte
for byte). ``--head-dim 16`` gives a model vLLM's CPU build loads and reports healthy, whose
first generation then kills the engine (tests/vllm/test_engine_crash.py).

If the directory already holds a model built by this script with the same parameters (a stamp
file records them), it returns at once; ``--force`` rebuilds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SEED = 1234
VOCAB_SIZE = 2048
DEFAULT_HEAD_DIM = 32
NUM_HEADS = 4
MODEL_PARAMS: dict[str, object] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 32,
    "vocab_size": VOCAB_SIZE,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
}
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)
# Bump when the build changes in a way the parameters above do not show.
BUILD_VERSION = 1
STAMP = ".tiny-model.json"


def model_params(head_dim: int = DEFAULT_HEAD_DIM) -> dict[str, object]:
    """MODEL_PARAMS with another head size: NUM_HEADS heads (and KV heads) of ``head_dim``."""
    if head_dim == DEFAULT_HEAD_DIM:
        return dict(MODEL_PARAMS)
    if head_dim < 1 or head_dim % 2:
        raise ValueError(f"head_dim must be a positive even number (rotary embeddings), not {head_dim}")
    hidden = NUM_HEADS * head_dim
    return {**MODEL_PARAMS, "hidden_size": hidden, "intermediate_size": 2 * hidden, "head_dim": head_dim}


def build_id(params: dict[str, object] = MODEL_PARAMS) -> str:
    blob = json.dumps(
        {"v": BUILD_VERSION, "seed": SEED, "model": params, "special": SPECIAL_TOKENS,
         "template": CHAT_TEMPLATE},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def corpus(seed: int = SEED, lines: int = 4000) -> list[str]:
    """Pseudo-English text from a seeded generator: identical on every machine and Python."""
    rng = random.Random(seed)
    onsets = ["", "b", "c", "d", "f", "g", "h", "l", "m", "n", "p", "r", "s", "t", "v", "w",
              "br", "ch", "cl", "dr", "gr", "pl", "pr", "sh", "st", "th", "tr"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ea", "ee", "oo", "ou"]
    codas = ["", "", "n", "r", "s", "t", "l", "nd", "ng", "st", "ck"]
    words = [
        "".join(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas) for _ in range(rng.randint(1, 3)))
        for _ in range(1500)
    ]
    common = ("the of and to in is it that for you with on as are this be at or by from what how "
              "hello world model answer question please thanks gateway server request token").split()
    out = []
    for _ in range(lines):
        n = rng.randint(4, 16)
        ws = [rng.choice(common) if rng.random() < 0.35 else rng.choice(words) for _ in range(n)]
        ws[0] = ws[0].capitalize()
        tail = rng.choice([".", ".", ".", "?", "!", ",", ":"])
        num = f" {rng.randint(0, 9999)}" if rng.random() < 0.1 else ""
        out.append(" ".join(ws) + num + tail)
    return out


def build(out_dir: Path, params: dict[str, object] = MODEL_PARAMS) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    # Tokenizer: byte-level BPE.
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        additional_special_tokens=SPECIAL_TOKENS[4:],
        model_max_length=int(str(params["max_position_embeddings"])),
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE

    vocab_size = int(str(params["vocab_size"]))
    if len(fast) > vocab_size:
        raise SystemExit(f"tokenizer has {len(fast)} tokens, more than the model's vocab {vocab_size}")

    # Model: random weights from a fixed seed.
    torch.manual_seed(SEED)
    short_answers = bool(params.get("short_answers"))
    config = LlamaConfig(
        **{k: v for k, v in params.items() if k != "short_answers"},  # type: ignore[arg-type]
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.eval()
    # --short-answers: half the vocabulary also ends a generation (vLLM adds generation_config's
    # eos_token_id list to every request's stop tokens), so answers stop after a few tokens with
    # finish_reason "stop", like a chat model's, instead of running to max_tokens.
    eos_ids: int | list[int] = fast.eos_token_id
    if short_answers:
        eos_ids = [fast.eos_token_id, *range(len(SPECIAL_TOKENS), vocab_size, 2)]
    model.generation_config = GenerationConfig(
        bos_token_id=fast.bos_token_id, eos_token_id=eos_ids, pad_token_id=fast.pad_token_id
    )

    # Write into a temporary sibling directory, then move into place: never a half-built model.
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        fast.save_pretrained(tmp)
        (tmp / STAMP).write_text(json.dumps({"build_id": build_id(params), "seed": SEED, **params},
                                            indent=2, sort_keys=True) + "\n")
        tmp.chmod(0o755)  # mkdtemp makes it private
        for f in tmp.iterdir():
            f.chmod(0o644)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    n_params = sum(p.numel() for p in model.parameters())
    size = sum(f.stat().st_size for f in out_dir.iterdir() if f.is_file())
    print(f"[make_tiny_model] wrote {out_dir} ({n_params:,} parameters, {len(fast)} tokens, "
          f"{size / 1e6:.1f} MB, build {build_id(params)})")


def is_built(out_dir: Path, params: dict[str, object] = MODEL_PARAMS) -> bool:
    try:
        stamp = json.loads((out_dir / STAMP).read_text())
    except (OSError, ValueError):
        return False
    return bool(stamp.get("build_id") == build_id(params) and (out_dir / "model.safetensors").is_file())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir", nargs="?", default="var/tiny-model", help="output directory (default var/tiny-model)")
    p.add_argument("--head-dim", type=int, default=DEFAULT_HEAD_DIM, metavar="N",
                   help=f"attention head size (default {DEFAULT_HEAD_DIM}); {NUM_HEADS} heads, hidden "
                        f"{NUM_HEADS}*N. vLLM's CPU attention rejects 16 on the first request")
    p.add_argument("--max-position-embeddings", type=int, default=None, metavar="N",
                   help="context the model claims (default 2048); e.g. 32768 for a long-context twin that "
                        "vLLM serves with --max-model-len 32768 (Claude Code's prompts are ~21k tokens)")
    p.add_argument("--short-answers", action="store_true",
                   help="half the vocabulary ends a generation: answers stop after a few tokens (end_turn)")
    p.add_argument("--force", action="store_true", help="rebuild even if already built")
    args = p.parse_args(argv)
    try:
        params = model_params(args.head_dim)
    except ValueError as exc:
        p.error(str(exc))
    if args.max_position_embeddings is not None:
        if args.max_position_embeddings < 16:
            p.error("--max-position-embeddings must be at least 16")
        params["max_position_embeddings"] = args.max_position_embeddings
    if args.short_answers:
        params["short_answers"] = True
    out_dir = Path(args.out_dir)
    if not args.force and is_built(out_dir, params):
        print(f"[make_tiny_model] already built: {out_dir} (build {build_id(params)}); --force to rebuild")
        return 0
    build(out_dir, params)
    return 0


if __name__ == "__main__":
    sys.exit(main())
