"""The machine's interrupts as /proc/interrupts lists them, and the patterns that name them: an
interrupt's number, or a glob over its description (chip, hardware IRQ, type, handlers)."""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Mapping

_LINE = re.compile(r"^\s*(\d+):((?:\s+\d+)*)\s*(.*)$")


def parse(text: str) -> dict[int, str]:
    """/proc/interrupts: each numbered interrupt's description, its columns joined by one space."""
    out = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            out[int(m.group(1))] = " ".join(m.group(3).split())
    return out


@functools.lru_cache(maxsize=8192)  # each sync asks of every interrupt again: descriptions seldom change
def matches(patterns: tuple[str, ...], description: str, irq: int = -1) -> bool:
    """Whether a pattern is the interrupt's number or a glob matching its description."""
    return any(p == str(irq) or fnmatch.fnmatchcase(description, p) for p in patterns)


def denied(patterns: tuple[str, ...], controllable: tuple[str, ...], present: Mapping[int, str]) -> list[str]:
    """What the patterns name of the present interrupts outside the controllable ones (none when
    every interrupt is controllable), each said as nri-plugins says it."""
    if not controllable:
        return []
    return [f"denied interrupt: irq {irq} ({description}) denied but matched by user pattern {p!r}"
            for irq, description in sorted(present.items()) if not matches(controllable, description, irq)
            for p in patterns if matches((p,), description, irq)]
