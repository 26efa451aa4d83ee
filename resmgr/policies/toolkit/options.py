"""Policy options, declared once: read from a configuration section and turned into JSON Schema.

Keys match case-insensitively, as cri-resmgr's and nri-plugins' Go decoders do, so
`PinCPU`, `pinCPU` and `pincpu` are one option and configurations written for either
project read the same. An unknown key or a value of the wrong type is a PolicyError naming
the key and what is accepted; the schema (`schema()`) says the same to the config loader.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from resmgr.policies.toolkit.errors import PolicyError

Check = Callable[[Any, str], Any]


@dataclass(frozen=True)
class Option:
    name: str  # as documented (CamelCase)
    kind: str  # boolean, integer, string, strings, cpu, object, objects, any
    default: Any = None
    help: str = ""
    choices: tuple[str, ...] = ()  # for strings: accepted values (case-insensitive)
    check: Check | None = field(default=None, compare=False)  # further conversion/validation
    items: tuple[Option, ...] = ()  # for objects: the options of each item (the schema says so)

    @property
    def key(self) -> str:
        return self.name.lower()


_TYPES = {"boolean": {"type": "boolean"}, "integer": {"type": "integer"}, "string": {"type": "string"},
          "strings": {"type": "array", "items": {"type": "string"}},
          "cpu": {"type": ["string", "number"]}, "object": {"type": ["object", "null"]},
          "objects": {"type": "array", "items": {"type": "object"}}, "any": {}}


def _typed(option: Option, value: Any, where: str) -> Any:
    kind = option.kind
    ok = {"boolean": lambda v: isinstance(v, bool),
          "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
          "string": lambda v: isinstance(v, str),
          "strings": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
          "cpu": lambda v: isinstance(v, str | int | float) and not isinstance(v, bool),
          "object": lambda v: v is None or isinstance(v, Mapping),
          "objects": lambda v: isinstance(v, list) and all(isinstance(x, Mapping) for x in v),
          "any": lambda v: True}[kind]
    if kind == "integer" and isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if not ok(value):
        raise PolicyError(f"{where}: expected {_describe(option)}, got {value!r}")
    if option.choices:
        lowered = {c.lower(): c for c in option.choices}
        if str(value).lower() not in lowered:
            raise PolicyError(f"{where}: {value!r} is not one of {', '.join(option.choices)}")
        value = lowered[str(value).lower()]
    return option.check(value, where) if option.check else value


def _describe(option: Option) -> str:
    return {"boolean": "true or false", "integer": "an integer", "string": "a string",
            "strings": "a list of strings", "cpu": "a cpuset or a CPU quantity", "object": "a mapping",
            "objects": "a list of mappings", "any": "a value"}[option.kind]


def read(section: Mapping[str, Any] | None, options: Sequence[Option], where: str) -> dict[str, Any]:
    """The options' values by name (defaults filled in); PolicyError for unknown keys or bad values."""
    if section is None:
        section = {}
    if not isinstance(section, Mapping):
        raise PolicyError(f"{where}: expected a mapping of options")
    by_key = {o.key: o for o in options}
    out = {o.name: o.default for o in options}
    seen: dict[str, str] = {}
    for key, value in section.items():
        option = by_key.get(str(key).lower())
        if option is None:
            raise PolicyError(f"{where}.{key}: unknown option (known: {', '.join(o.name for o in options)})")
        if option.name in seen:
            raise PolicyError(f"{where}: {seen[option.name]} and {key} are the same option")
        seen[option.name] = str(key)
        out[option.name] = _typed(option, value, f"{where}.{key}")
    return out


def reserved_namespaces(value: Any) -> list[str]:
    """ReservedPoolNamespaces (globs), one rule for every policy: kube-system always, as nri-plugins
    and cri-resmgr have it, and the namespaces given."""
    if value is None:
        value = []
    if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
        raise PolicyError("policy.ReservedPoolNamespaces: expected a list of namespaces (globs allowed)")
    return list(dict.fromkeys(["kube-system", *value]))


def in_namespaces(namespace: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(namespace, p) for p in patterns)


def case_free(name: str) -> str:
    """A regular expression matching name in any letter case (JSON Schema has no flags); the first
    letter of each bracket is name's own, so the name can be read back (config error messages)."""
    return "^" + "".join(f"[{c}{c.swapcase()}]" if c.isalpha() else re.escape(c) for c in name) + "$"


def schema(options: Sequence[Option], description: str = "") -> dict[str, Any]:
    """The JSON Schema of a section holding these options (keys in any letter case)."""
    props = {}
    for o in options:
        typed = dict(_TYPES[o.kind])
        if o.kind == "objects" and o.items:
            item = schema(o.items)
            item["type"] = "object"
            typed["items"] = item
        if o.help:
            typed["description"] = f"{o.name}: {o.help}"
        props[case_free(o.name)] = typed
    out: dict[str, Any] = {"type": ["object", "null"], "additionalProperties": False, "patternProperties": props}
    if description:
        out["description"] = description
    return out

