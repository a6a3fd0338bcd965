"""A headless Chromium driven over the DevTools protocol: a page opened, JavaScript run in it, its answers read
(the review page's test: clicks, playback, seeking, as a person's browser does them)."""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
import time
import urllib.request

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    def __init__(self, profile, timeout_s: float = 60.0):
        """Chromium with its profile in `profile` (a folder of the test's)."""
        import websocket

        self.process = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-port=0",
             "--autoplay-policy=no-user-gesture-required", "--mute-audio", f"--user-data-dir={profile}",
             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + timeout_s
        port = None
        while port is None:
            line = self.process.stderr.readline()
            found = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
            if found:
                port = int(found.group(1))
            elif not line and self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("chromium did not start its DevTools server")
        pages = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10).read())
        page = next(p for p in pages if p["type"] == "page")
        self.socket = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=timeout_s)
        self.ids = itertools.count(1)

    def call(self, method: str, **params) -> dict:
        ask = next(self.ids)
        self.socket.send(json.dumps({"id": ask, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv())
            if message.get("id") == ask:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]

    def open(self, url: str) -> None:
        self.call("Page.enable")
        self.call("Page.navigate", url=url)

    def run(self, script: str):
        """The value of a JavaScript expression (a promise is awaited); an exception in it raises here."""
        result = self.call("Runtime.evaluate", expression=script, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(result["exceptionDetails"].get("exception", {}).get("description")
                               or result["exceptionDetails"]["text"])
        return result["result"].get("value")

    def wait_for(self, script: str, timeout_s: float = 30.0):
        """The expression's value once it is truthy."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.run(script)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{script} stayed {value!r} for {timeout_s:g} s")
            time.sleep(0.1)

    def close(self) -> None:
        try:
            self.socket.close()
        finally:
            self.process.kill()
            self.process.wait()
