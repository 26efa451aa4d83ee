"""Configuration: the validated document, where it comes from, applying it, the agent's link."""

from resmgr.config.document import MODULES, Config, ConfigError, from_map, load_file, validate

__all__ = ["MODULES", "Config", "ConfigError", "from_map", "load_file", "validate"]
