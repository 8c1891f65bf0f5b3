"""A minimal headless-Chromium driver over the Chrome DevTools Protocol (no selenium / playwright):
open a page, evaluate JavaScript, collect console errors and failed loads, take screenshots."""

from __future__ import annotations

import base64
import itertools
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from websockets.sync.client import connect

from service.store.processes import stop_all

CHROMIUM_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    for name in CHROMIUM_CANDIDATES:
        if path := shutil.which(name):
            return path
    return None


class Browser:
    """One headless browser with one page; ``errors`` collects console errors, uncaught exceptions and
    failed network loads (as text)."""

    def __init__(self, binary: str, profile: Path) -> None:
        self.tmp = tempfile.mkdtemp(prefix="cdp-")
        self.proc: subprocess.Popen | None = None
        try:
            self._start(binary, profile)
        except BaseException:  # a start that failed at any step leaves no browser and no temp dir behind
            self._stop()
            raise

    def _start(self, binary: str, profile: Path) -> None:
        self.proc = subprocess.Popen(
            [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--remote-debugging-port=0", f"--user-data-dir={profile}",
             "--window-size=1280,1000", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
            # its singleton socket directory (org.chromium.Chromium.*) goes in a short temp dir of its own,
            # removed by close(): not left in /tmp (a socket path under the test's tmp_path is too long for AF_UNIX)
            env={**os.environ, "TMPDIR": self.tmp},
        )
        url = self._devtools_url()
        # the rest of its stderr is read to the end, never left to fill the pipe (a full pipe blocks chromium)
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()  # type: ignore[union-attr]
        self.ws = connect(url, max_size=64 * 1024 * 1024, open_timeout=30).__enter__()
        self._ids = itertools.count(1)
        self.errors: list[str] = []
        self.dialogs: list[str] = []  # messages of the dialogs the page opened (prompt / alert / confirm)
        self.prompt_answer: str | None = None  # what a prompt() is answered with (None: dismissed)
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable", session=True)

    def _stop(self) -> None:
        try:
            if getattr(self, "ws", None) is not None:
                self.ws.close()
        finally:
            if self.proc is not None:
                stop_all([self.proc], timeout_s=10)
            shutil.rmtree(self.tmp, ignore_errors=True)

    def _devtools_url(self) -> str:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()  # type: ignore[union-attr]
            if match := re.search(r"DevTools listening on (ws://\S+)", line):
                return match.group(1)
            if not line and self.proc.poll() is not None:
                break
        raise RuntimeError("chromium did not start its DevTools endpoint")

    def call(self, method: str, params: dict[str, Any] | None = None, session: bool = False) -> dict[str, Any]:
        msg_id = next(self._ids)
        msg: dict[str, Any] = {"id": msg_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = self.session
        self.ws.send(json.dumps(msg))
        while True:
            reply = json.loads(self.ws.recv(timeout=60))
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self._event(reply)

    def _event(self, event: dict[str, Any]) -> None:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            self.errors.append("console: " + " ".join(str(a.get("value", a.get("description"))) for a in params["args"]))
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            self.errors.append("exception: " + str(details.get("exception", {}).get("description", details.get("text"))))
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            self.errors.append(f"log: {params['entry']['text']} {params['entry'].get('url', '')}")
        elif method == "Page.javascriptDialogOpening":  # answered at once, without waiting for the reply
            self.dialogs.append(params.get("message", ""))
            answer = {"accept": self.prompt_answer is not None, "promptText": self.prompt_answer or ""}
            msg = {"id": next(self._ids), "method": "Page.handleJavaScriptDialog", "params": answer}
            self.ws.send(json.dumps({**msg, "sessionId": self.session}))
        elif method == "Network.loadingFailed" and params.get("errorText") != "net::ERR_ABORTED":
            self.errors.append(f"network: {params.get('errorText')}")

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True}, session=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def goto(self, url: str) -> None:
        self.call("Page.navigate", {"url": url}, session=True)

    def wait_for(self, expression: str, timeout_s: float = 20.0) -> Any:
        """Poll ``expression`` until it is truthy; returns its value."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {expression}; page: {self.evaluate('document.body.innerText')[:500]}")

    def screenshot(self, path: Path) -> None:
        data = self.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, session=True)["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        self._stop()
