"""Plain-text tables for the command line."""

from __future__ import annotations


def columns(rows: list[tuple[str, ...]]) -> list[str]:
    """Rows as lines of left-aligned columns, two spaces apart."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows]
