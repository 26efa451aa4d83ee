"""Configuration: cri-resmgr's module sections, each validated by a JSON Schema.

Sections (modules): `policy`, `dump`, `logger`, `rdt`, `blockio`, `hooks`, `instrumentation`,
`resource-manager.control`; their schemas live in `config/schemas/`. A configuration
comes either as one YAML document (a file) or as a map of key -> YAML text (a
ConfigMap's data), where a key names a section or a dotted path into one
(`policy.topology-aware`). Unknown keys, wrong types and bad values are errors that
name the key path; nothing is applied from a configuration with any error.
"""

from __future__ import annotations

import copy
import functools
import importlib
import json
import logging
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from fastjsonschema import JsonSchemaValueException

from resmgr import policies
from resmgr.config import custom
from resmgr.config import dumprules as dump
from resmgr.config.openapi import canonical_key

if TYPE_CHECKING:
    import jsonschema

log = logging.getLogger(__name__)

# A source checkout has them in config/schemas; an installed copy in <prefix>/share/cri-resmgr/schemas.
SCHEMA_DIR = next((d for d in (Path(__file__).resolve().parents[2] / "config" / "schemas",
                               Path(sys.prefix) / "share" / "cri-resmgr" / "schemas") if d.is_dir()),
                  Path(sys.prefix) / "share" / "cri-resmgr" / "schemas")
MODULES = ("policy", "dump", "logger", "rdt", "blockio", "cpu", "hooks", "instrumentation", "resource-manager.control")

DEFAULTS: dict[str, Any] = {
    "policy": {"Active": "none", "AvailableResources": {}, "ReservedResources": {}},
    "dump": {"Config": dump.DEFAULT_RULES, "File": ""},
    "logger": {"Debug": []},
}


class ConfigError(Exception):
    pass


@dataclass
class Config:
    data: dict[str, Any] = field(default_factory=lambda: copy.deepcopy(DEFAULTS))
    source: str = "built-in defaults"

    @property
    def policy_name(self) -> str:
        return self.data["policy"]["Active"]

    @property
    def dump_rules(self) -> str:
        return self.data["dump"]["Config"]

    @property
    def dump_file(self) -> str:
        return self.data["dump"].get("File") or ""

    @property
    def debug_sources(self) -> list[str]:
        return list(self.data["logger"].get("Debug") or [])

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.data, sort_keys=False, default_flow_style=False)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def validator_module(module: str) -> str:
    """Where a section's validator generated ahead as code lives (scripts/genschemas.py writes it):
    resource-manager.control -> resmgr.generated.schemas.resource_manager_control."""
    return "resmgr.generated.schemas." + module.replace(".", "_").replace("-", "_")


@functools.cache
def _fast(module: str) -> Callable[[Any], Any]:
    """The section's generated validator: cheap to load and run."""
    return importlib.import_module(validator_module(module)).validate  # type: ignore[no-any-return]


@functools.cache
def _validator(module: str) -> jsonschema.protocols.Validator:
    """The generic validator, loaded only for a section the generated one refuses: it names the
    problem (every error, unknown keys) and has the last word."""
    import jsonschema

    schema = json.loads((SCHEMA_DIR / f"{module}.schema.json").read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _describe(error: jsonschema.ValidationError, module: str) -> str:
    """`path: problem` for the first schema violation, with unknown keys named."""
    path = ".".join([module, *(str(p) for p in error.absolute_path)])
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        patterns = list(error.schema.get("patternProperties", {}))
        # Policy options match in any letter case: `^[Pp][Ii][Nn]...$` reads back as PinCPU.
        known = sorted([*error.schema.get("properties", {}), *(canonical_key(p) for p in patterns)])
        props = error.schema.get("properties", {})
        unknown = sorted(str(k) for k in error.instance
                         if k not in props and not any(re.search(p, str(k)) for p in patterns))
        if unknown:
            hint = f" (known: {', '.join(known)})" if known else ""
            return f"{path}.{unknown[0]}: unknown key{hint}"
    return f"{path}: {error.message}"


def _odd_key(value: Any, path: str) -> str:
    """Where value holds a key that is not a string (YAML allows `~: x` or `1: x`), "" if nowhere."""
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                return f"{path}.{k!r}"
            if where := _odd_key(v, f"{path}.{k}"):
                return where
    elif isinstance(value, list):
        for i, v in enumerate(value):
            if where := _odd_key(v, f"{path}[{i}]"):
                return where
    return ""


def _check(module: str, section: dict[str, Any], origin: str) -> None:
    if where := _odd_key(section, module):
        raise ConfigError(f"{origin}: {where}: a key must be a string")
    try:
        _fast(module)(section)
        return
    except JsonSchemaValueException:
        pass
    errors = sorted(_validator(module).iter_errors(section), key=lambda e: [str(p) for p in e.absolute_path])
    if errors:
        raise ConfigError(f"{origin}: {_describe(errors[0], module)}")


# What cri-resource-manager's own files define and cri-resmgr does not act on: left out with a
# warning that names it, so those files load as they are (a typo anywhere else is still an error).
_CLASSES = "nri-plugins' per-container CPU class map; the pool classes (SharedPoolCPUClass, ...) are applied"
LEFT_OUT = {
    ("logger", "Klog"): "klog's own settings; cri-resmgr logs through Python's logging",
    ("resource-manager.control", "page-migration"): "cri-resource-manager's page migration (idle pages moved "
    "between DRAM and PMEM by a scanner), not done here; memory nodes are still pinned by memory type",
    # A misspelling in cri-resource-manager's own balloons samples, which its loader ignores.
    ("policy", "balloons", "BalloonTypes", "*", "PreferNewBalloon"): "not an option (PreferNewBalloons is); "
    "cri-resource-manager ignores it",
    # One in nri-plugins' own test configuration, which its loader ignores too.
    ("policy", "balloons", "BalloonTypes", "*", "AllocationPriority"): "not an option (AllocatorPriority is); "
    "nri-plugins ignores it",
    # nri-plugins' options that cannot move a placement here: CPU priorities and the per-container
    # CPU class map.
    **{("policy", policy, key): why for policy, key, why in (
        ("topology-aware", "DefaultCPUPriority", "CPU priorities (performance and efficient cores) are chosen by "
         "the prefer-core-type annotation here"),
        ("topology-aware", "CPUClasses", _CLASSES))},
}


def _leave_out(doc: dict[str, Any], origin: str) -> dict[str, Any]:
    """doc without the LEFT_OUT sections and keys, each named in a warning (keys below a section
    match case-insensitively, as option names do; "*" is every item of a list)."""
    out = dict(doc)
    for path, why in LEFT_OUT.items():
        out = _without(out, path, (), why, origin)
    return out


def _without(node: Any, path: tuple[str, ...], at: tuple[str, ...], why: str, origin: str) -> Any:
    key, rest = path[0], path[1:]
    if key == "*":
        if not isinstance(node, list):
            return node
        return [_without(item, rest, (*at, str(i)), why, origin) for i, item in enumerate(node)]
    if not isinstance(node, dict):
        return node
    fold = bool(at)  # section names are exact, option names are not
    name = next((k for k in node if k == key or (fold and isinstance(k, str) and k.lower() == key.lower())), None)
    if name is None:
        return node
    node = dict(node)
    if rest:
        node[name] = _without(node[name], rest, (*at, name), why, origin)
    else:
        del node[name]
        log.warning("%s: %s left out (%s)", origin, ".".join((*at, name)), why)
    return node


def validate(data: Any, origin: str = "config") -> Config:
    """Check the document (or an nri-plugins policy resource) against the module schemas and merge
    it over the defaults."""
    if custom.is_custom_resource(data):
        try:
            data, left_out = custom.translate(data)
        except custom.NotAPolicy as err:
            raise ConfigError(f"{origin}: {err}") from None
        if left_out:
            log.warning("%s: %s left out (nri-plugins' own settings, no counterpart here)", origin,
                        ", ".join(left_out))
    doc = _leave_out(_mapping(data, origin), origin)
    for key in doc:
        if key not in MODULES:
            raise ConfigError(f"{origin}: unknown section {key!r} (known: {', '.join(sorted(MODULES))})")
    doc = {key: _mapping(value, f"{origin}: {key}") for key, value in doc.items()}
    for key, section in doc.items():
        _check(key, section, origin)
    pol = doc.get("policy", {})
    if "Active" in pol:
        if pol["Active"] is None:  # YAML reads `Active: null` as a null value: the null policy
            pol = {**pol, "Active": "null"}
        try:
            pol = {**pol, "Active": policies.canonical(pol["Active"])}
        except KeyError as err:
            raise ConfigError(f"{origin}: policy.Active: {err.args[0]}") from None
    dmp = doc.get("dump", {})
    if "Config" in dmp:
        try:
            dump.parse_rules(dmp["Config"])
        except dump.RuleError as err:
            raise ConfigError(f"{origin}: dump.Config: {err}") from None
    lg = doc.get("logger", {})
    if isinstance(lg.get("Debug"), str):
        lg = {**lg, "Debug": [s.strip() for s in lg["Debug"].split(",") if s.strip()]}
    elif "Debug" in lg and lg["Debug"] is None:
        lg = {**lg, "Debug": []}
    doc = {**doc, "policy": pol, "dump": dmp, "logger": lg}
    return Config(_merge(DEFAULTS, doc), origin)


def _split(key: str) -> list[str]:
    """A ConfigMap key as a path: the longest section name it starts with, then dotted parts."""
    for module in sorted(MODULES, key=len, reverse=True):
        if key == module:
            return [module]
        if key.startswith(module + "."):
            return [module, *key[len(module) + 1:].split(".")]
    return [key]


def from_map(data: Mapping[str, str], origin: str = "ConfigMap") -> Config:
    """Validate ConfigMap data: each key a section or dotted path, each value YAML text."""
    doc: dict[str, Any] = {}
    for key in sorted(data, key=lambda k: (k.count("."), k)):  # sections before their sub-keys
        try:
            value = yaml.safe_load(data[key])
        except yaml.YAMLError as err:
            raise ConfigError(f"{origin}: {key}: not valid YAML: {_one_line(str(err))}") from None
        except RecursionError:
            raise ConfigError(f"{origin}: {key}: nested too deeply") from None
        path = _split(key)
        node = doc
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"{origin}: {key}: {part} is not a mapping")
            node = child
        if isinstance(node.get(path[-1]), dict) and isinstance(value, dict):
            node[path[-1]] = _merge(node[path[-1]], value)
        else:
            node[path[-1]] = value
    return validate(doc, origin)


def load_file(path: str) -> Config:
    """Load and validate a YAML config file; errors name the file and the problem."""
    try:
        raw = Path(path).read_bytes()
    except OSError as err:
        raise ConfigError(f"cannot read config file {path}: {err.strerror or err}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte {err.start}: {raw[err.start:err.start + 1]!r})"
                          ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {path} is not valid YAML: {_one_line(str(err))}") from None
    except RecursionError:
        raise ConfigError(f"config file {path} is nested too deeply") from None
    if data is None:
        # An empty file is far more likely a truncated write than a wish for the defaults.
        raise ConfigError(f"config file {path} is empty (write `{{}}` for the built-in defaults)")
    return validate(data, origin=path)


def _one_line(text: str) -> str:
    return " ".join(text.split())
