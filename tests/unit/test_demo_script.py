"""`make demo` ends with a curl line a second terminal can paste: the key's value, not `$DEMO_KEY`."""

from __future__ import annotations

import subprocess
from pathlib import Path

DEMO = Path(__file__).resolve().parents[2] / "scripts" / "demo.sh"


def test_the_closing_lines_print_the_key_itself() -> None:
    text = DEMO.read_text()
    start = text.index('say "the gateway serves')
    end = text.index("\nEOT\n", start) + 5
    tail = text[start:end]
    script = 'say() { echo "[demo] $*"; }\nport=8080\nmodel=tiny-chat\nDEMO_KEY=sk-demo-value\n' + tail
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
    assert "$DEMO_KEY" not in out
    assert "key: sk-demo-value" in out and "Authorization: Bearer sk-demo-value" in out
