"""Send one chat completion through the gateway with the openai SDK and print it.

    .venv/bin/python scripts/demo_client.py --base-url http://127.0.0.1:8080/v1 --api-key sk-demo-local

Defaults come from DEMO_BASE_URL, DEMO_KEY and DEMO_MODEL. Exit status 0 when the gateway answered.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import openai


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="one chat completion through the gateway")
    p.add_argument("--base-url", default=os.environ.get("DEMO_BASE_URL", "http://127.0.0.1:8080/v1"))
    p.add_argument("--api-key", default=os.environ.get("DEMO_KEY", "sk-demo-local"))
    p.add_argument("--model", default=os.environ.get("DEMO_MODEL", "tiny-chat"))
    p.add_argument("--prompt", default="Say hello to the gateway.")
    p.add_argument("--max-tokens", type=int, default=24)
    args = p.parse_args(argv)

    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=60)
    try:
        models = [m.id for m in client.models.list()]
        print(f"models at {args.base_url}: {', '.join(models) or '(none)'}")
        t0 = time.perf_counter()
        resp = client.chat.completions.create(
            model=args.model,
            messages=[{"role": "user", "content": args.prompt}],
            max_tokens=args.max_tokens,
        )
        ms = (time.perf_counter() - t0) * 1000
    except openai.APIStatusError as exc:
        print(f"error: the gateway answered {exc.status_code}: {exc.response.text}", file=sys.stderr)
        return 1
    except openai.APIConnectionError as exc:
        print(f"error: cannot reach {args.base_url}: {exc}", file=sys.stderr)
        return 1
    choice = resp.choices[0]
    print(f"POST {args.base_url}/chat/completions model={args.model!r} -> {resp.model!r} in {ms:.0f} ms")
    print(f"  reply ({choice.finish_reason}): {choice.message.content!r}")
    if resp.usage is not None:
        print(f"  usage: prompt {resp.usage.prompt_tokens}, completion {resp.usage.completion_tokens} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
