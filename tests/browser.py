"""Headless Chromium driven over the DevTools protocol on a pipe, with the standard library only.

``--remote-debugging-pipe`` makes Chromium read commands from its fd 3 and write answers and
events to its fd 4, each a JSON text ending in a NUL byte. ``Browser.load`` opens a page and
collects what the report tests need: console errors, uncaught exceptions, log entries, every
network request, the page's measures, and a full-page screenshot. Host names resolve nowhere
(``--host-resolver-rules``), so nothing can leave the machine even if a page tried.

``decode_png`` reads the screenshot back (zlib and the five PNG filters, 8-bit RGB or RGBA),
and ``spread`` says how far its pixels are from one flat colour.

Also a script: ``python -m tests.browser PAGE.html OUT.png`` writes a full-page screenshot
(how docs/report-demo.png is made).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
DEBIAN_BINARY = Path("/usr/lib/chromium/chromium")  # what Debian's /usr/bin/chromium runs
FLAGS = (
    "--headless",
    "--no-sandbox",  # the tests run as root, where Chromium's sandbox refuses to start
    "--disable-gpu",
    "--remote-debugging-pipe",
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-extensions",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-sync",
    "--metrics-recording-only",
    "--hide-scrollbars",
    "--mute-audio",
    "--font-render-hinting=none",
)

MEASURE = """(() => {
  const d = document.documentElement, body = document.body;
  let bottom = 0;
  for (const el of body.querySelectorAll('*')) {
    if (el.checkVisibility && !el.checkVisibility()) continue;  // e.g. a closed <details>
    const r = el.getBoundingClientRect();
    if (r.width > 0 && r.height > 0) bottom = Math.max(bottom, r.bottom + window.scrollY);
  }
  const svgs = [...document.querySelectorAll('svg.chart')].map(s => {
    const b = s.getBBox(), v = s.viewBox.baseVal, r = s.getBoundingClientRect();
    return {x: b.x, y: b.y, width: b.width, height: b.height,
            viewWidth: v.width, viewHeight: v.height, shownWidth: r.width, shownHeight: r.height};
  });
  const shown = sel => [...document.querySelectorAll(sel)].filter(
    el => !el.checkVisibility || el.checkVisibility()).length;
  return {scrollHeight: d.scrollHeight, scrollWidth: d.scrollWidth, clientWidth: d.clientWidth,
          contentBottom: Math.ceil(bottom), scripts: document.scripts.length, svgs,
          texts: document.querySelectorAll('svg text').length,
          printOnly: shown('.print-only'), details: shown('details')};
})()"""


def find_chromium() -> str | None:
    """The Chromium binary to run, or None when none is installed."""
    for name in NAMES:
        found = shutil.which(name)
        if found is None:
            continue
        # Debian's launcher is a shell script around the real binary: run that directly.
        if DEBIAN_BINARY.is_file() and Path(found).read_bytes()[:2] == b"#!":
            return str(DEBIAN_BINARY)
        return found
    return None


class DevToolsError(RuntimeError):
    pass


@dataclass
class Loaded:
    """What loading one page showed."""

    url: str
    console: list[str] = field(default_factory=list)  # console messages of level error
    exceptions: list[str] = field(default_factory=list)
    log: list[str] = field(default_factory=list)  # browser log entries of level error
    requests: list[str] = field(default_factory=list)  # every URL the page asked for
    measures: dict[str, Any] = field(default_factory=dict)
    content_size: dict[str, float] = field(default_factory=dict)
    png: bytes = b""
    pdf: bytes = b""


class Browser:
    """One headless Chromium; ``load`` opens pages in fresh tabs."""

    def __init__(self, binary: str, *, width: int = 1200, height: int = 900) -> None:
        self.width, self.height = width, height
        self.profile = tempfile.TemporaryDirectory(prefix="gpuwarden-chromium-")
        to_child, self._out = os.pipe()
        self._in, from_child = os.pipe()

        def pipes() -> None:  # in the child: its fd 3 reads our commands, fd 4 answers
            os.dup2(to_child, 3)
            os.dup2(from_child, 4)

        self.process = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={self.profile.name}", "about:blank"],
            preexec_fn=pipes,  # noqa: PLW1509 - the fds must be 3 and 4 in the child
            pass_fds=(3, 4),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        os.close(to_child)
        os.close(from_child)
        self._buffer = b""
        self._next = 0
        self._events: list[dict[str, Any]] = []

    # -- the protocol -----------------------------------------------------------------------

    def _send(self, method: str, params: dict[str, Any] | None, session: str | None) -> int:
        self._next += 1
        message: dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        os.write(self._out, json.dumps(message).encode() + b"\0")
        return self._next

    def _read(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._in], [], [], max(0.0, left))
            if not ready:
                raise DevToolsError(f"no answer from Chromium within {timeout:g}s")
            chunk = os.read(self._in, 1 << 20)
            if not chunk:
                err = (
                    self.process.stderr.read().decode(errors="replace")
                    if self.process.stderr
                    else ""
                )
                raise DevToolsError(f"Chromium closed the pipe: {err[-2000:]}")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        message: dict[str, Any] = json.loads(raw)
        return message

    def call(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        session: str | None = None,
        timeout: float = 30.0,
    ) -> dict[str, Any]:
        ident = self._send(method, params, session)
        while True:
            message = self._read(timeout)
            if message.get("id") == ident:
                if "error" in message:
                    raise DevToolsError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result
            self._events.append(message)

    def wait_for(self, method: str, session: str, timeout: float = 30.0) -> dict[str, Any]:
        for i, event in enumerate(self._events):
            if event.get("method") == method and event.get("sessionId") == session:
                return self._events.pop(i)
        while True:
            message = self._read(timeout)
            if message.get("method") == method and message.get("sessionId") == session:
                return message
            self._events.append(message)

    # -- pages ------------------------------------------------------------------------------

    def load(self, page: Path, *, scale: float = 1.0, media: str = "", pdf: bool = False) -> Loaded:
        """Open ``page``, wait for it to load, measure it and take a full-page screenshot at
        ``scale`` (0.25: a quarter of the size in each direction). ``media="print"`` shows it
        as it prints; ``pdf`` also prints it (A4 landscape, as the page asks) to ``pdf``."""
        url = page.resolve().as_uri()
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        self._events.clear()
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable", None, session)
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False},
            session,
        )
        if media:
            self.call("Emulation.setEmulatedMedia", {"media": media}, session)
        self.call("Page.navigate", {"url": url}, session)
        self.wait_for("Page.loadEventFired", session)
        loaded = Loaded(url)
        measures = self.call(
            "Runtime.evaluate", {"expression": MEASURE, "returnByValue": True}, session
        )
        loaded.measures = measures["result"]["value"]
        size = self.call("Page.getLayoutMetrics", None, session)["cssContentSize"]
        loaded.content_size = size
        shot = self.call(
            "Page.captureScreenshot",
            {
                "format": "png",
                "captureBeyondViewport": True,
                "clip": {
                    "x": 0,
                    "y": 0,
                    "width": size["width"],
                    "height": size["height"],
                    "scale": scale,
                },
            },
            session,
            timeout=60.0,
        )
        loaded.png = base64.b64decode(shot["data"])
        if pdf:
            printed = self.call(
                "Page.printToPDF", {"preferCSSPageSize": True}, session, timeout=60.0
            )
            loaded.pdf = base64.b64decode(printed["data"])
        self.call("Target.closeTarget", {"targetId": target})
        for event in self._events:
            if event.get("sessionId") != session:
                continue
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                loaded.console.append(json.dumps(params.get("args"))[:500])
            elif method == "Runtime.exceptionThrown":
                loaded.exceptions.append(json.dumps(params.get("exceptionDetails"))[:500])
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                loaded.log.append(str(params["entry"].get("text"))[:500])
            elif method == "Network.requestWillBeSent":
                loaded.requests.append(str(params.get("request", {}).get("url")))
        self._events.clear()
        return loaded

    def close(self) -> None:
        with contextlib.suppress(DevToolsError, OSError):
            self.call("Browser.close", timeout=10.0)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for fd in (self._in, self._out):
            with contextlib.suppress(OSError):
                os.close(fd)
        if self.process.stderr is not None:
            self.process.stderr.close()
        self.profile.cleanup()

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- PNG ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Image:
    width: int
    height: int
    channels: int
    rows: list[bytes]


def decode_png(data: bytes) -> Image:
    """An 8-bit RGB or RGBA PNG (what Chromium writes), non-interlaced, as raw rows."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, header = 8, [], b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    if depth != 8 or colour not in (2, 6) or interlace:
        raise ValueError(f"unsupported PNG: depth {depth}, colour type {colour}")
    channels = 3 if colour == 2 else 4
    raw = zlib.decompress(b"".join(idat))
    stride = width * channels
    rows: list[bytes] = []
    previous = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind = raw[start]
        line = bytearray(raw[start + 1 : start + 1 + stride])
        if kind == 1:
            for i in range(channels, stride):
                line[i] = (line[i] + line[i - channels]) & 0xFF
        elif kind == 2:
            for i in range(stride):
                line[i] = (line[i] + previous[i]) & 0xFF
        elif kind == 3:
            for i in range(stride):
                left = line[i - channels] if i >= channels else 0
                line[i] = (line[i] + ((left + previous[i]) >> 1)) & 0xFF
        elif kind == 4:
            for i in range(stride):
                a = line[i - channels] if i >= channels else 0
                b = previous[i]
                c = previous[i - channels] if i >= channels else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[i] = (line[i] + pred) & 0xFF
        elif kind != 0:
            raise ValueError(f"bad PNG filter {kind} in row {y}")
        rows.append(bytes(line))
        previous = line
    return Image(width, height, channels, rows)


def spread(image: Image) -> tuple[float, float]:
    """(variance of the pixels' grey levels, share of pixels that are not the most common
    colour): 0 and 0 for a blank page."""
    counts: dict[bytes, int] = {}
    total = 0.0
    squares = 0.0
    n = 0
    c = image.channels
    for row in image.rows:
        for i in range(0, len(row), c):
            r, g, b = row[i], row[i + 1], row[i + 2]
            grey = 0.299 * r + 0.587 * g + 0.114 * b
            total += grey
            squares += grey * grey
            n += 1
            key = row[i : i + 3]
            counts[key] = counts.get(key, 0) + 1
    if n == 0:
        return 0.0, 0.0
    mean = total / n
    common = max(counts.values())
    return squares / n - mean * mean, 1.0 - common / n


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m tests.browser PAGE.html OUT.png", file=sys.stderr)
        return 2
    binary = find_chromium()
    if binary is None:
        print("no chromium: apt-get install chromium", file=sys.stderr)
        return 1
    with Browser(binary, width=1100) as browser:
        loaded = browser.load(Path(argv[0]))
    Path(argv[1]).write_bytes(loaded.png)
    image = decode_png(loaded.png)
    print(f"{argv[1]}: {image.width}x{image.height}, {len(loaded.png) / 1024:,.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
