"""A runtime hook plugin for tests: tests/support/hookserver.py as a process, and its registration file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.helpers import ROOT, wait_socket


class Plugin:
    """tests/support/hookserver.py as a process, and its registration file."""

    def __init__(self, workdir: Path, name: str, *args: str) -> None:
        self.workdir, self.name = workdir, name
        self.socket = str(workdir / f"{name}.sock")
        self.record = workdir / f"{name}.jsonl"
        self.args = [sys.executable, "-m", "tests.support.hookserver", "--socket", self.socket, "--name", name,
                     "--record", str(self.record), *args]
        self.proc: subprocess.Popen | None = None

    def start(self, *args: str) -> Plugin:
        self.proc = subprocess.Popen([*self.args, *args], cwd=ROOT, stderr=subprocess.DEVNULL)
        wait_socket(self.socket, proc=self.proc)
        return self

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(10)

    def register(self, hookdir: Path, hooks: list[str], policy: str = "Ignore", file: str = "",
                 **extra: object) -> Path:
        path = hookdir / (file or f"{self.name}.json")
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"remote-endpoint": self.socket, "failure-policy": policy,
                                   "runtime-hooks": hooks, **extra}))
        os.replace(tmp, path)
        return path

    def calls(self, hook: str = "") -> list[dict]:
        if not self.record.exists():
            return []
        lines = [json.loads(line) for line in self.record.read_text().splitlines() if line]
        return [c for c in lines if not hook or c["hook"] == hook]
