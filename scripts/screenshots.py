"""Take the docs' screenshots of the live view and of the report's cost line (docs/live-view.png,
docs/report-cost.png) with headless Chromium (Debian's ``chromium``).

The live view is what ``perfscope profile`` drew on a 120 x 30 pseudo-terminal two seconds into
a run of examples/io_bound.py, rebuilt line by line from what it wrote (a carriage return starts
the line again) and shown as a terminal page; the cost line is the verdict section of the report
of the num_workers=0 ResNet-50 trace in ../shared/traces at $3.06 an hour (a V100 machine's
on-demand price), or of evals/traces/gpu-io.json.gz without the shared traces.

    python scripts/screenshots.py
"""

from __future__ import annotations

import fcntl
import html
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import browser  # noqa: E402  (the tests' headless-Chromium helper)

SNAPSHOT_AFTER_S = 2.0
RESNET = ROOT.parent / "shared" / "traces" / "tb_plugin" / "resnet50_num_workers_0" / "worker0.1623143089861.pt.trace.json.gz"


def terminal_lines(args: list[str], after_s: float) -> list[str]:
    """The lines on a 120 x 30 terminal ``after_s`` seconds into ``perfscope ARGS`` (the run is
    left to finish)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "perfscope", *args], stdout=slave, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, cwd=ROOT)
    os.close(slave)
    data, started, seen_view = b"", time.monotonic(), None
    while True:
        ready, _, _ = select.select([master], [], [], 1.0)
        chunk = os.read(master, 65536) if ready else b""
        data += chunk
        if seen_view is None and b"| median " in data:
            seen_view = time.monotonic()
        if seen_view is not None and time.monotonic() - seen_view >= after_s or (ready and not chunk):
            break
        if time.monotonic() - started > 300:
            break
    snapshot = data
    try:
        while os.read(master, 65536):
            pass
    except OSError:
        pass
    proc.wait(timeout=300)
    os.close(master)
    lines = []
    for raw in snapshot.decode(errors="replace").split("\n"):
        shown = raw.split("\r")
        kept = [s for s in shown if s.strip()]
        lines.append(kept[-1] if kept else "")
    return [line for line in lines if line.strip()][-30:]


def terminal_page(lines: list[str], path: Path) -> None:
    body = "\n".join(html.escape(line) for line in lines)
    path.write_text("<!doctype html><meta charset=utf-8><style>body{margin:0;background:#1e1e1e}"
                    "pre{color:#d4d4d4;font:14px/1.35 monospace;padding:14px;margin:0;white-space:pre}</style>"
                    f"<pre>{body}</pre>", encoding="utf-8")


def main() -> None:
    work = Path("/tmp/perfscope-screenshots")
    work.mkdir(exist_ok=True)
    lines = terminal_lines(["profile", "--out", str(work / "live"), "--max-steps", "0", "examples/io_bound.py",
                            "--", "--steps", "90"], SNAPSHOT_AFTER_S)
    terminal_page(lines, work / "live.html")
    browser.screenshot(work / "live.html", ROOT / "docs" / "live-view.png", (1100, 20 * len(lines) + 40))
    trace = RESNET if RESNET.is_file() else ROOT / "evals" / "traces" / "gpu-io.json.gz"
    subprocess.run([sys.executable, "-m", "perfscope", "analyze", str(trace), "--price-per-hour", "3.06",
                    "--out", str(work / "report")], check=True, capture_output=True, cwd=ROOT)
    browser.screenshot(work / "report" / "report.html", ROOT / "docs" / "report-cost.png", (1280, 520))
    print("wrote docs/live-view.png and docs/report-cost.png")


if __name__ == "__main__":
    main()
