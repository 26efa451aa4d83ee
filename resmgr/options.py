"""Command-line options declared once, the same way for every program: cri-resmgr and its
subcommands, the node agent and the webhook.

A program's options are a dataclass whose fields are made by `opt`: the default, the flags (the
first names the option, the others are older names kept working), the --help text, the --help
group, and anything else argparse takes. `add_to(parser, Table)` makes the command line from the
table and `from_args(Table, args)` the table from what was parsed, so a new option is one field.
Durations, on/off switches, groups and log levels are read by the parsers here, one way everywhere.
"""

from __future__ import annotations

import argparse
import dataclasses
import grp
import re
from dataclasses import field
from typing import Any, TypeVar

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "": 1.0}

T = TypeVar("T")


def duration(text: str) -> float:
    """Seconds from '30', '2.5', '30s', '500ms', '5m' or '1h'."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h|)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"bad duration {text!r} (use e.g. 30s, 500ms, 5m; a bare number is seconds)")
    return float(m.group(1)) * _UNITS[m.group(2)]


def positive_duration(text: str) -> float:
    """A duration more than zero."""
    value = duration(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be more than 0")
    return value


def on_off(text: str) -> bool:
    if text not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"{text!r}: use on or off")
    return text == "on"


def group_id(text: str) -> int:
    """A group's ID from its name or number."""
    if text.isdigit():
        return int(text)
    try:
        return grp.getgrnam(text).gr_gid
    except KeyError:
        raise argparse.ArgumentTypeError(f"no group {text!r} on this host (give its name or GID)") from None


def opt(default: Any, *flags: str, help: str, group: str = "", exclusive: str = "", config: str = "",
        **argparse_kw: Any) -> Any:
    """A field of an options table: its default, its flags (none: set by the program, not the command
    line), its help, the --help group it is listed in ("": the program's own), options it excludes
    (those with the same `exclusive` name), the configuration file key it overrides, and anything else
    argparse takes (type, choices, metavar)."""
    return field(default=default, metadata={"flags": flags, "help": help, "group": group, "exclusive": exclusive,
                                            "config": config, "argparse": argparse_kw})


def flagged(table: type) -> list[dataclasses.Field]:
    """The table's fields that are command-line options."""
    return [f for f in dataclasses.fields(table) if f.metadata.get("flags")]


def add_to(parser: argparse.ArgumentParser, table: type) -> None:
    """Every option of the table, in its --help group."""
    groups: dict[str, Any] = {"": parser}
    for f in flagged(table):
        meta = f.metadata
        where = groups.get(meta["group"]) or groups.setdefault(meta["group"], parser.add_argument_group(meta["group"]))
        if meta["exclusive"]:
            key = f"{meta['group']}\0{meta['exclusive']}"
            where = groups.get(key) or groups.setdefault(key, where.add_mutually_exclusive_group())
        kw = dict(meta["argparse"])
        if f.type in ("bool", bool) and "type" not in kw:
            kw["action"] = "store_true"
        where.add_argument(*meta["flags"], dest=f.name, default=f.default, help=meta["help"], **kw)


def from_args(table: type[T], args: argparse.Namespace, **given: Any) -> T:
    """The table from parsed arguments; given sets the fields that are not options."""
    return table(**{f.name: getattr(args, f.name) for f in flagged(table)}, **given)
