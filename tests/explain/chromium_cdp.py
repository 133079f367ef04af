"""Drive headless Chromium over the DevTools protocol on a pipe (no websocket library needed).

`--remote-debugging-pipe` makes Chromium read CDP messages from fd 3 and write them to fd 4,
each a JSON object ended by a NUL byte. Collected: console API calls, uncaught exceptions,
browser log entries (failed resource loads land there) and failed network requests.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--remote-debugging-pipe"]


def ensure_chromium() -> str:
    """Path of Debian's chromium, installing it with apt when missing."""
    found = shutil.which("chromium")
    if found:
        return found
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, timeout=600)
    subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], check=True, env=env, timeout=1200)
    found = shutil.which("chromium")
    assert found, "apt-get installed chromium but it is not on PATH"
    return found
LOCAL = ("file:", "data:", "about:")  # a self-contained page fetches nothing else


@dataclass
class PageResult:
    problems: list[str] = field(default_factory=list)  # console messages, exceptions, failed loads
    screenshot: bytes = b""


class Browser:
    def __init__(self, chromium: str, profile: Path) -> None:
        to_r, self._to_w = os.pipe()
        self._from_r, from_w = os.pipe()
        # bash puts our pipe ends on fds 3 and 4, where --remote-debugging-pipe expects them
        self.proc = subprocess.Popen(
            ["bash", "-c", f'exec "$0" "$@" 3<&{to_r} 4>&{from_w}', chromium, *FLAGS,
             f"--user-data-dir={profile}", "about:blank"],
            pass_fds=(to_r, from_w), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        os.close(to_r)
        os.close(from_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             timeout: float = 30) -> dict[str, Any]:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return dict(reply.get("result", {}))
            self.events.append(reply)

    def wait_event(self, method: str, timeout: float = 30) -> dict[str, Any]:
        for ev in self.events:
            if ev.get("method") == method:
                return ev
        deadline = time.monotonic() + timeout
        while True:
            ev = self._read(deadline)
            self.events.append(ev)
            if ev.get("method") == method:
                return ev

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            if time.monotonic() > deadline:
                raise TimeoutError("chromium did not answer in time")
            chunk = os.read(self._from_r, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe")
            self._buf += chunk
        raw, _, self._buf = self._buf.partition(b"\0")
        return dict(json.loads(raw))

    def open(self, url: str, width: int = 1280, settle_s: float = 0.5) -> PageResult:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Page", "Network"):
            self.send(f"{domain}.enable", session=session)
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False}, session=session)
        self.events.clear()
        self.send("Page.navigate", {"url": url}, session=session)
        self.wait_event("Page.loadEventFired")
        time.sleep(settle_s)
        self.send("Runtime.evaluate", {"expression": "1"}, session=session)  # drain pending events
        shot = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True},
                         session=session, timeout=60)
        return PageResult(_problems(self.events), base64.b64decode(shot["data"]))

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, TimeoutError, OSError):
            self.send("Browser.close", timeout=10)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_w)
        os.close(self._from_r)


def _problems(events: list[dict[str, Any]]) -> list[str]:
    out = []
    for ev in events:
        m, p = ev.get("method"), ev.get("params", {})
        if m == "Runtime.consoleAPICalled":
            args = " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", []))
            out.append(f"console.{p.get('type')}: {args}")
        elif m == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            out.append(f"exception: {d.get('exception', {}).get('description') or d.get('text')}")
        elif m == "Log.entryAdded":
            e = p.get("entry", {})
            out.append(f"log.{e.get('level')}: {e.get('text')} {e.get('url', '')}")
        elif m == "Network.requestWillBeSent" and not p.get("request", {}).get("url", "").startswith(LOCAL):
            out.append(f"network request: {p['request']['url']}")
        elif m == "Network.loadingFailed":
            out.append(f"network: {p.get('errorText')} ({p.get('type')})")
    return out
