"""Headless Chromium for the report tests, without a driver library.

One browser run per page (:func:`load`) gives everything the tests look at:

* the DOM after load (``--dump-dom``),
* a screenshot of the viewport (``--screenshot``, ``--window-size``),
* every console message: with ``--enable-logging=stderr --v=0`` Chromium writes each one to stderr
  as ``[pid:tid:time:INFO:CONSOLE:line] "text", source: url (line)``. That covers
  ``console.log/warn/error``, uncaught exceptions (``"Uncaught Error: ..."``) and Content
  Security Policy violations (``"Loading the image '...' violates the following Content Security
  Policy directive ..."``). The log line carries no level, so every console message counts: the
  report has no script, so any message at all is a blocked load, a CSP violation or an error.
* every network request the page made: ``--log-net-log`` writes Chromium's NetLog; each
  ``URL_REQUEST_START_JOB`` whose network isolation key or initiator is the ``file://`` page is a
  request from the page (the browser's own background requests have neither). Loads of the page
  itself from ``file://`` do not go through the network stack, so a self-contained page makes none.

``--virtual-time-budget`` lets timers and late scripts run before the DOM is dumped. The browser
runs in its own process group with a fresh profile directory and a timeout; the whole group is
killed afterwards, whatever happened.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

# Root in a container needs --no-sandbox; the rest keeps the browser off the network (its
# background services would otherwise try to reach Google) and quiet.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--hide-scrollbars",
    "--enable-logging=stderr",
    "--v=0",
)

TIMEOUT_S = 60

_CONSOLE = re.compile(
    r"^\[[^\]]*:CONSOLE[^\]]*\] \"(?P<text>.*?)\", source: (?P<source>\S*) \((?P<line>\d+)\)$",
    re.MULTILINE | re.DOTALL,
)


def find_chromium() -> str | None:
    """Path of a Chromium/Chrome binary on PATH (``$CHROMIUM`` first), or None."""
    for name in (os.environ.get("CHROMIUM"), *CANDIDATES):
        if name and (path := shutil.which(name)):
            return path
    return None


@dataclass
class Page:
    dom: str
    console: list[str] = field(default_factory=list)  # "text (source:line)" per message
    requests: list[str] = field(default_factory=list)  # URLs the page asked the network for
    stderr: str = ""


def console_lines(stderr: str) -> list[str]:
    """The console messages in Chromium's ``--enable-logging=stderr`` output."""
    return [f"{m['text']} ({m['source']}:{m['line']})" for m in _CONSOLE.finditer(stderr)]


def page_requests(netlog: dict) -> list[str]:
    """URLs requested through the network stack on behalf of a ``file://`` page."""
    types = {v: k for k, v in netlog.get("constants", {}).get("logEventTypes", {}).items()}
    urls = []
    for event in netlog.get("events", []):
        if types.get(event.get("type")) != "URL_REQUEST_START_JOB":
            continue
        p = event.get("params", {})
        initiator = str(p.get("initiator", ""))
        if "file://" in str(p.get("network_isolation_key", "")) or initiator == "null" or initiator.startswith("file:"):
            urls.append(str(p.get("url")))
    return urls


def _read_netlog(path: Path) -> dict:
    text = path.read_text(errors="replace") if path.is_file() else ""
    try:
        return json.loads(text)
    except ValueError:
        # A browser killed mid-run leaves the final "]}" out; the events written so far still count.
        try:
            return json.loads(text.rstrip().rstrip(",") + "]}")
        except ValueError:
            return {}


def load(html_path, png_path=None, size=(1280, 2000), budget_ms: int = 1000, timeout: float = TIMEOUT_S) -> Page:
    """Open ``html_path`` in headless Chromium; optionally write a screenshot to ``png_path``."""
    exe = find_chromium()
    if exe is None:
        raise FileNotFoundError(f"no browser found (tried {', '.join(CANDIDATES)})")
    url = Path(html_path).resolve().as_uri()
    with tempfile.TemporaryDirectory(prefix="perfscope-browser-") as tmp:
        tmp = Path(tmp)
        netlog = tmp / "netlog.json"
        cmd = [
            exe,
            *FLAGS,
            f"--user-data-dir={tmp / 'profile'}",
            f"--log-net-log={netlog}",
            f"--window-size={size[0]},{size[1]}",
            f"--virtual-time-budget={budget_ms}",
            "--dump-dom",
        ]
        if png_path is not None:
            Path(png_path).parent.mkdir(parents=True, exist_ok=True)
            cmd.append(f"--screenshot={Path(png_path).resolve()}")
        cmd.append(url)
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
            start_new_session=True, env={**os.environ, "HOME": str(tmp)},
        )
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            out, err = proc.communicate()
            raise TimeoutError(f"{exe} did not finish {url} in {timeout} s:\n{err[-3000:]}") from None
        finally:
            _kill_group(proc.pid)  # the renderer/GPU/zygote children, if any outlived the browser
        if proc.returncode != 0:
            raise RuntimeError(f"{exe} exited with {proc.returncode} on {url}:\n{err[-3000:]}")
        return Page(dom=out, console=console_lines(err), requests=page_requests(_read_netlog(netlog)), stderr=err)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def screenshot(html_path, png_path, size=(1280, 2000)) -> Page:
    """Write a ``size`` screenshot of the page to ``png_path``; returns the whole :class:`Page`."""
    page = load(html_path, png_path, size)
    if not Path(png_path).is_file():
        raise RuntimeError(f"no screenshot written to {png_path}:\n{page.stderr[-3000:]}")
    return page


def console_messages(html_path) -> list[str]:
    """Every console message (errors, uncaught exceptions, CSP violations) the page produced."""
    return load(html_path).console


def dom_text(dom: str) -> str:
    """The visible text of a dumped DOM, whitespace collapsed (scripts and styles dropped)."""
    dom = re.sub(r"(?is)<(script|style|title)\b.*?</\1\s*>", " ", dom)
    text = re.sub(r"<[^>]+>", " ", dom)
    return " ".join(html.unescape(text).split())
