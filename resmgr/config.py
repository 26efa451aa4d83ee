"""Configuration: a YAML document with cri-resmgr's module sections.

Sections: `policy` (Active, AvailableResources, ReservedResources and one section per
policy), `dump` (Config rules, File), `logger` (Debug). The sections later modules
own (rdt, blockio, resource-manager.control, instrumentation) are accepted as
mappings and kept, so configs written for cri-resmgr load here.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

import policies
from resmgr import dump

DEFAULTS: dict[str, Any] = {
    "policy": {"Active": "none", "AvailableResources": {}, "ReservedResources": {}},
    "dump": {"Config": dump.DEFAULT_RULES, "File": ""},
    "logger": {"Debug": []},
}

_LATER_SECTIONS = {"rdt", "blockio", "resource-manager.control", "instrumentation"}
_POLICY_KEYS = {"Active", "AvailableResources", "ReservedResources", "ReservedPoolNamespaces"}


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


def validate(data: Any, origin: str = "config") -> Config:
    """Check the document's shape and merge it over the defaults."""
    doc = _mapping(data, origin)
    for key in doc:
        if key not in DEFAULTS and key not in _LATER_SECTIONS:
            raise ConfigError(f"{origin}: unknown section {key!r} (known: "
                              f"{', '.join(sorted(set(DEFAULTS) | _LATER_SECTIONS))})")
        _mapping(doc[key], f"{origin}: {key}")
    pol = _mapping(doc.get("policy"), f"{origin}: policy")
    for key in pol:
        if key not in _POLICY_KEYS and key not in policies.REGISTRY:
            raise ConfigError(f"{origin}: policy.{key}: unknown key (known: "
                              f"{', '.join(sorted(_POLICY_KEYS | set(policies.REGISTRY)))})")
    if "Active" in pol:
        if pol["Active"] is None:  # YAML reads `Active: null` as a null value: the null policy
            pol = {**pol, "Active": "null"}
        if not isinstance(pol["Active"], str):
            raise ConfigError(f"{origin}: policy.Active: expected a policy name")
        try:
            pol = {**pol, "Active": policies.canonical(pol["Active"])}
        except KeyError as err:
            raise ConfigError(f"{origin}: policy.Active: {err.args[0]}") from None
    dmp = _mapping(doc.get("dump"), f"{origin}: dump")
    for key in dmp:
        if key not in ("Config", "File"):
            raise ConfigError(f"{origin}: dump.{key}: unknown key (known: Config, File)")
    if "Config" in dmp:
        if not isinstance(dmp["Config"], str):
            raise ConfigError(f"{origin}: dump.Config: expected a rule string")
        try:
            dump.parse_rules(dmp["Config"])
        except dump.RuleError as err:
            raise ConfigError(f"{origin}: dump.Config: {err}") from None
    if "File" in dmp and not isinstance(dmp["File"] or "", str):
        raise ConfigError(f"{origin}: dump.File: expected a path")
    lg = _mapping(doc.get("logger"), f"{origin}: logger")
    for key in lg:
        if key != "Debug":
            raise ConfigError(f"{origin}: logger.{key}: unknown key (known: Debug)")
    if "Debug" in lg:
        debug = lg["Debug"]
        if isinstance(debug, str):
            debug = [s.strip() for s in debug.split(",") if s.strip()]
        if not isinstance(debug, list) or not all(isinstance(s, str) for s in debug):
            raise ConfigError(f"{origin}: logger.Debug: expected a list of sources or '*'")
        lg = {**lg, "Debug": debug}
    doc = {**doc, "policy": pol, "dump": dmp, "logger": lg}
    return Config(_merge(DEFAULTS, doc), origin)


def load_file(path: str) -> Config:
    """Load and validate a YAML config file; errors name the file and the problem."""
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise ConfigError(f"cannot read config file {path}: {err.strerror or err}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {path} is not valid YAML: {err}") from None
    return validate(data, origin=path)
