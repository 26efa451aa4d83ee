"""The documentation keeps up with the code: every configuration key and every flag is in docs/."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from tests.support.helpers import ROOT

DOCS = "\n".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))


def schema_keys(schema: dict, path: str) -> list[tuple[str, str]]:
    """(path, key) for every key a schema names, options of any letter case by their name."""
    out = []
    for key, sub in (schema.get("properties") or {}).items():
        out.append((path, key))
        out += schema_keys(sub, f"{path}.{key}")
    for pattern, sub in (schema.get("patternProperties") or {}).items():
        key = re.sub(r"\[(.)[^]]*\]|\\(.)", lambda m: m.group(1) or m.group(2), pattern).strip("^$")
        out.append((path, key))
        out += schema_keys(sub, f"{path}.{key}")
    if isinstance(schema.get("items"), dict):
        out += schema_keys(schema["items"], f"{path}[]")
    for sub in (schema.get("$defs") or {}).values():
        out += schema_keys(sub, path)
    return out


def test_every_configuration_key_is_documented():
    missing = []
    for f in sorted((ROOT / "config" / "schemas").glob("*.schema.json")):
        for path, key in schema_keys(json.loads(f.read_text()), f.name.split(".schema")[0]):
            if key.lower() not in DOCS.lower():
                missing.append(f"{path}.{key}")
    assert not missing, f"not in docs/: {', '.join(missing)}"


def test_every_flag_is_documented():
    out = subprocess.run([sys.executable, "-m", "resmgr", "--help"], capture_output=True, text=True, cwd=ROOT,
                         timeout=60)
    flags = sorted(set(re.findall(r"(--[a-z][a-z0-9-]+)", out.stdout)) - {"--help"})
    assert flags, out.stderr
    missing = [f for f in flags if f"`{f}" not in DOCS and f"{f}`" not in DOCS and f" {f} " not in DOCS]
    assert not missing, f"not in docs/: {', '.join(missing)}"


def test_every_test_path_the_docs_name_exists():
    named = {m.group(0).rstrip(".") for text in (DOCS, (ROOT / "README.md").read_text())
             for m in re.finditer(r"tests/[A-Za-z0-9_/.-]+\.(?:py|txt)", text)}
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"docs name test files that do not exist: {', '.join(missing)}"
