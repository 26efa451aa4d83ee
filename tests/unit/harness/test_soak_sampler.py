"""The soak's sampler on real processes: what runs in a scope is read anew each time."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from harness.soak import sampler


def test_a_process_that_executes_another_program_is_seen_as_that_program():
    """runc's init is "exe" until it executes the container's process (a sandbox's `pause`): a name
    read once must not stand for the pid ever after, or every sandbox seen early runs "something"."""
    proc = subprocess.Popen(["sh", "-c", "read x; exec sleep 30"], stdin=subprocess.PIPE)
    try:
        pid = str(proc.pid)
        assert _becomes(pid, "sh")  # once the forked child has executed sh
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        assert _becomes(pid, "sleep")
    finally:
        proc.kill()
        proc.wait()


def _becomes(pid: str, name: str) -> bool:
    deadline = time.monotonic() + 10
    while sampler.comm(pid) != name and time.monotonic() < deadline:
        time.sleep(0.02)
    return sampler.comm(pid) == name


def test_runcs_init_under_any_of_its_names_is_not_the_containers_own_process():
    assert all(sampler.is_init(n) for n in ("exe", "runc", "runc:[2:INIT]"))
    assert not any(sampler.is_init(n) for n in ("pause", "sleep", "sh"))


def test_a_program_executed_from_a_descriptor_is_named_after_it_and_seen_as_runcs_init():
    """runc executes its init from a copy of itself it holds open, and the kernel names such a
    process after the descriptor ("6") until it executes the container's process: a sandbox scope
    "running something besides pause", a Burstable container seen on every CPU while being made."""
    script = ("import os; fd = os.open('/bin/sleep', os.O_RDONLY); os.set_inheritable(fd, True); "
              "os.execv(f'/proc/self/fd/{fd}', ['sleep', '30'])")
    proc = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 10
        while not sampler.comm(str(proc.pid)).isdigit() and time.monotonic() < deadline:
            time.sleep(0.02)
        name = sampler.comm(str(proc.pid))
        assert name.isdigit(), name
        assert sampler.is_init(name)
    finally:
        proc.kill()
        proc.wait()


def test_a_zombie_runs_nothing():
    """A container whose processes have exited but are not reaped yet runs nothing: its CPUs are
    free to be someone else's."""
    proc = subprocess.Popen(["sleep", "0"])
    deadline = time.monotonic() + 10
    while sampler.comm(str(proc.pid)) and time.monotonic() < deadline:  # exited, not reaped: a zombie
        time.sleep(0.02)
    assert sampler.comm(str(proc.pid)) == "" and Path(f"/proc/{proc.pid}").exists()
    proc.wait()


def test_the_journal_is_read_from_the_start_of_the_second_asked_for():
    # journalctl takes whole seconds: rounding 25.65 up to 26 dropped a line logged at 25.70.
    from harness.soak.guest import Guest
    from harness.vm import Result

    asked = []
    guest = Guest.__new__(Guest)
    guest.run = lambda cmd, timeout=60: asked.append(cmd) or Result(0, "", "")
    guest.journal("cri-resmgr", 1764391885.65)
    assert asked == ["journalctl -u cri-resmgr --no-pager -o cat --since @1764391885"]
