"""The readiness file the chart's probes read, and the probe command itself."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import time
from pathlib import Path

from resmgr.readyfile import ReadyFile

HELPERS = Path(__file__).resolve().parents[3] / "deployment" / "helm" / "cri-resmgr" / "templates" / "_helpers.tpl"


def chart_probe(path: Path) -> list[str]:
    """The command of the chart's readyFileProbe for path."""
    text = HELPERS.read_text()
    block = text[text.index('define "cri-resmgr.readyFileProbe"'):]
    line = re.search(r"command: (\[.*\])", block)
    assert line is not None
    return json.loads(line.group(1).replace("{{ . }}", str(path)))


def probe(path: Path) -> bool:
    return subprocess.run(chart_probe(path), timeout=10).returncode == 0


def test_the_file_is_there_while_ready_and_gone_when_not_or_stopped(tmp_path):
    path = tmp_path / "ready"
    why_not = ["starting"]

    async def until(check) -> None:
        async with asyncio.timeout(5):
            while not check():
                await asyncio.sleep(0.01)

    async def go() -> None:
        task = asyncio.create_task(ReadyFile(str(path), "test").keep(lambda: why_not[0], period=0.05, waiting=0.05))
        await asyncio.sleep(0.1)
        assert not path.exists()  # judged not ready
        why_not[0] = ""
        await until(path.exists)
        why_not[0] = "runtime gone"
        await until(lambda: not path.exists())
        why_not[0] = ""
        await until(path.exists)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert not path.exists()  # gone with the task

    asyncio.run(go())


def test_the_probe_passes_on_a_fresh_file_and_fails_on_a_stale_or_missing_one(tmp_path):
    path = tmp_path / "ready"
    assert not probe(path)
    ReadyFile(str(path), "test").set("")
    assert probe(path)
    old = time.time() - 120  # a daemon whose loop hung two minutes ago
    os.utime(path, (old, old))
    assert not probe(path)
    ReadyFile(str(path), "test").set("the runtime is not reachable")
    assert not path.exists() and not probe(path)
