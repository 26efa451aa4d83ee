"""Configuration as a document: its schema and validation (`document.py`), the custom resource's and
its OpenAPI schema (`custom.py`, `openapi.py`), CRI dump rules. Applying it is resmgr/control/'s."""

from resmgr.config.document import MODULES, Config, ConfigError, from_map, load_file, validate

__all__ = ["MODULES", "Config", "ConfigError", "from_map", "load_file", "validate"]
