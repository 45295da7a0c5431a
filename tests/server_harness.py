"""Starts real uvicorn servers on 127.0.0.1 (random free port) for the server tests."""

from __future__ import annotations

import re
import threading
import time

import httpx


class RunningServer:
    """A cosyvino server on a background thread, using preloaded synthesizers."""

    def __init__(self, config, synthesizers):
        from cosyvino.server.runner import make_server

        self.server = make_server(config, "127.0.0.1", 0, synthesizers=synthesizers,
                                  log_level="warning")
        self.state = self.server.cosyvino_state
        self.thread = threading.Thread(target=self.server.run, name="test-uvicorn",
                                       daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not (self.server.started and self.server.port):
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("test server did not start")
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.server.port}"
        wait_ready(self.url, deadline)

    def stop(self) -> None:
        self.state.pool.cancel_all()  # no drain wait for requests a test left running
        self.server.should_exit = True
        self.thread.join(30)


def wait_ready(url: str, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/ready", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{url} never became ready")


def metric(url: str, name: str, labels: str = "") -> float:
    """Value of one sample in /metrics (0.0 when absent)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    pattern = re.escape(name + (("{" + labels + "}") if labels else "")) + r" ([0-9.e+-]+)"
    m = re.search(r"^" + pattern + "$", text, re.M)
    return float(m.group(1)) if m else 0.0
