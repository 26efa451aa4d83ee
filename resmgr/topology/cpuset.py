"""CPUSet: an immutable set of CPU (or memory node) IDs in the kernel's list syntax.

Backed by an int bitmask, so unions, intersections and differences are single
integer operations even on machines with hundreds of CPUs.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator


class CPUSetError(ValueError):
    pass


class CPUSet:
    __slots__ = ("_bits",)

    def __init__(self, ids: Iterable[int] = ()) -> None:
        bits = 0
        for i in ids:
            if i < 0:
                raise CPUSetError(f"negative CPU id {i}")
            bits |= 1 << i
        self._bits = bits

    @classmethod
    def from_bits(cls, bits: int) -> CPUSet:
        s = cls.__new__(cls)
        s._bits = bits
        return s

    @classmethod
    def parse_or_empty(cls, text: str) -> CPUSet:
        """parse, with an unreadable value (a runtime's odd cpuset) taken as no CPUs."""
        try:
            return cls.parse(text)
        except ValueError:
            return cls.from_bits(0)

    @classmethod
    def parse(cls, text: str) -> CPUSet:
        """Parse the kernel list syntax: '0-3,8,10-11' (whitespace and an empty string allowed)."""
        return cls.from_bits(_parse_bits(text))

    # -- set protocol ----------------------------------------------------------------
    def __iter__(self) -> Iterator[int]:
        bits = self._bits
        while bits:
            low = bits & -bits
            yield low.bit_length() - 1
            bits ^= low

    def __len__(self) -> int:
        return self._bits.bit_count()

    def __bool__(self) -> bool:
        return self._bits != 0

    def __contains__(self, cpu: object) -> bool:
        return isinstance(cpu, int) and cpu >= 0 and bool(self._bits >> cpu & 1)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CPUSet) and other._bits == self._bits

    def __hash__(self) -> int:
        return hash(self._bits)

    def __or__(self, other: CPUSet) -> CPUSet:
        return CPUSet.from_bits(self._bits | other._bits)

    def __and__(self, other: CPUSet) -> CPUSet:
        return CPUSet.from_bits(self._bits & other._bits)

    def __sub__(self, other: CPUSet) -> CPUSet:
        return CPUSet.from_bits(self._bits & ~other._bits)

    def __xor__(self, other: CPUSet) -> CPUSet:
        return CPUSet.from_bits(self._bits ^ other._bits)

    def __le__(self, other: CPUSet) -> bool:
        return self._bits & ~other._bits == 0

    def __ge__(self, other: CPUSet) -> bool:
        return other <= self

    def isdisjoint(self, other: CPUSet) -> bool:
        return self._bits & other._bits == 0

    @property
    def bits(self) -> int:
        return self._bits

    def sorted(self) -> list[int]:
        return list(self)

    def first(self, n: int) -> CPUSet:
        """The n lowest IDs."""
        out = 0
        bits = self._bits
        for _ in range(n):
            if not bits:
                break
            low = bits & -bits
            out |= low
            bits ^= low
        return CPUSet.from_bits(out)

    def __str__(self) -> str:
        return _format(self._bits)

    def __repr__(self) -> str:
        return f"CPUSet({str(self)!r})"


@functools.lru_cache(maxsize=4096)
def _format(bits: int) -> str:
    """Kernel list syntax, one run at a time (policies format the same sets over and over)."""
    parts = []
    while bits:
        start = (bits & -bits).bit_length() - 1
        x = bits >> start
        run = ((x + 1) & ~x).bit_length() - 1  # trailing ones of x
        parts.append(str(start) if run == 1 else f"{start}-{start + run - 1}")
        bits &= ~(((1 << run) - 1) << start)
    return ",".join(parts)


EMPTY = CPUSet()


def union(sets: Iterable[CPUSet]) -> CPUSet:
    """Every CPU of the sets."""
    out = EMPTY
    for cpus in sets:
        out |= cpus
    return out


# The same few lists are parsed again and again (each decision, each push): parsed once each.
@functools.lru_cache(maxsize=4096)
def _parse_bits(text: str) -> int:
    bits = 0
    text = text.strip()
    if not text:
        return 0
    for part in text.split(","):
        part = part.strip()
        lo, dash, hi = part.partition("-")
        try:
            if dash:
                a, b = int(lo), int(hi)
                if a > b or a < 0:
                    raise CPUSetError(f"bad CPU range {part!r} in {text!r}")
                bits |= ((1 << (b - a + 1)) - 1) << a
            else:
                a = int(part)
                if a < 0:
                    raise CPUSetError(f"negative CPU id in {text!r}")
                bits |= 1 << a
        except ValueError as err:
            if isinstance(err, CPUSetError):
                raise
            raise CPUSetError(f"bad CPU list {text!r}: {part!r} is not a number or range") from None
    return bits
