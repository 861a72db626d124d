"""`gateway backends ...` (command, up, down, verify). Being written; see issue 3."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("backends", help="launch and check vLLM backends")
    p.set_defaults(func=lambda _a: 2)
