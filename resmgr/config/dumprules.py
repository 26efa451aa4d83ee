"""Dump rules: per-method dump levels chosen by ordered regex rules.

Rules are `level:regexp` items separated by commas, applied in order so later
rules win; `reset` drops the rules before it. Levels: off, short (one line per
call), full (request and reply as YAML, with latency). A rule's regexp must match
the whole method name (e.g. CreateContainer). Parsed here so a configuration is
checked without the relay that dumps.
"""

from __future__ import annotations

import re
from enum import IntEnum

DEFAULT_RULES = "off:.*,short:((Create)|(Start)|(Run)|(Update)|(Stop)|(Remove)).*,off:.*Image.*"


class Level(IntEnum):
    OFF = 0
    SHORT = 1
    FULL = 2


class RuleError(ValueError):
    pass


def parse_rules(spec: str) -> list[tuple[Level, re.Pattern[str]]]:
    rules: list[tuple[Level, re.Pattern[str]]] = []
    # Split on commas that start a new `level:` item, so regexps may contain commas.
    items = re.split(r",(?=\s*(?:off|short|full|reset)\b)", spec.strip()) if spec.strip() else []
    for item in items:
        item = item.strip()
        if item == "reset":
            rules.clear()
            continue
        level, sep, pattern = item.partition(":")
        if not sep:
            raise RuleError(f"dump rule {item!r}: expected level:regexp (levels: off, short, full)")
        try:
            lvl = Level[level.strip().upper()]
        except KeyError:
            raise RuleError(f"dump rule {item!r}: unknown level {level!r} (use off, short or full)") from None
        try:
            rules.append((lvl, re.compile(pattern)))
        except re.error as err:
            raise RuleError(f"dump rule {item!r}: bad regexp: {err}") from None
    return rules
