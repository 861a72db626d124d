"""`gateway doctor`. Being written; see issue 3."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("doctor", help="preflight checks of the launch sections")
    p.set_defaults(func=lambda _a: 2)
