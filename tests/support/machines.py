"""Machines generated for tests: their sysfs trees live in one directory per test run, removed
when the run ends (a run of the unit tier makes hundreds)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from resmgr.topology.generate import generate, parse_spec
from resmgr.topology.model import Topology
from resmgr.topology.sysfs import discover

# In memory where it can be: a tree is hundreds of small files, slow to write to a busy disk.
_RUN = tempfile.TemporaryDirectory(prefix="crirm-machines-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)


def scratch() -> Path:
    """A new empty directory, removed with the run's."""
    return Path(tempfile.mkdtemp(dir=_RUN.name))


def tree(spec: str) -> Path:
    """The sysfs tree of the machine spec ("sockets=2,cores=4,threads=2"), as `--machine` takes it."""
    return generate(parse_spec(spec), scratch())


def machine(spec: str) -> Topology:
    return discover(str(tree(spec)))
