"""The validators generated ahead as code (scripts/genschemas.py) against the generic one.

The daemon trusts the generated validator's yes and asks the generic one (jsonschema) only
after a no, so the generated one must never accept what the generic one refuses. Every sample
configuration and state, and every one-value change to them, is put to both.
"""

from __future__ import annotations

import copy
import importlib
import json
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from fastjsonschema import JsonSchemaValueException

from resmgr.config.document import MODULES, validator_module
from resmgr.config.openapi import canonical_key
from resmgr.engine import statefile
from resmgr.model import Container, Pod, Resources

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[3]
ODD = ["x", -1, 0, 1.5, 10**12, True, None, {}, [], {"Unknown": 1}, ["x"]]


def _mutations(doc: Any) -> Iterator[Any]:
    """doc with one value replaced by an odd one, or one unknown key added, each way there is."""
    yield doc
    if isinstance(doc, dict):
        for key in list(doc):
            for inner in _mutations(doc[key]):
                yield {**doc, key: inner}
        yield {**doc, "NoSuchOption": 1}
    elif isinstance(doc, list):
        for i, item in enumerate(doc[:2]):
            for inner in _mutations(item):
                yield doc[:i] + [inner] + doc[i + 1:]
    else:
        yield from ODD


def _agree(fast: Any, generic: jsonschema.protocols.Validator, doc: Any) -> tuple[bool, bool]:
    try:
        fast(copy.deepcopy(doc))
        fast_ok = True
    except JsonSchemaValueException:
        fast_ok = False
    return fast_ok, generic.is_valid(doc)


def _full(schema: dict[str, Any], root: dict[str, Any], depth: int = 0) -> Any:
    """A document with every property the schema names filled in with a value of its kind."""
    if "$ref" in schema:
        target: Any = root
        for part in schema["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        return _full(target, root, depth)
    if "anyOf" in schema:
        return _full(schema["anyOf"][0], root, depth)
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type")
    kind = kind[0] if isinstance(kind, list) else kind
    if kind == "object" or "properties" in schema:
        if depth > 4:
            return {}
        out = {k: _full(v, root, depth + 1) for k, v in schema.get("properties", {}).items()}
        for pattern, value in schema.get("patternProperties", {}).items():
            out[canonical_key(pattern)] = _full(value, root, depth + 1)
        if isinstance(schema.get("additionalProperties"), dict):
            out["Sample"] = _full(schema["additionalProperties"], root, depth + 1)
        return out
    if kind == "array":
        return [_full(schema.get("items", {}), root, depth + 1)]
    if kind in ("integer", "number"):
        return schema.get("minimum", 1)
    return {"string": "x", "boolean": True, "null": None}.get(kind, "x")


def _samples() -> dict[str, list[Any]]:
    """Sections by module from the sample configuration and the sample ConfigMaps."""
    out: dict[str, list[Any]] = {m: [] for m in MODULES}
    docs = [yaml.safe_load((ROOT / "config" / "cri-resmgr.sample.yaml").read_text())]
    for cm in yaml.safe_load_all((ROOT / "config" / "kubernetes" / "configmaps.yaml").read_text()):
        for key, text in ((cm or {}).get("data") or {}).items():
            docs.append({key: yaml.safe_load(text)})
    for doc in docs:
        for module, section in (doc or {}).items():
            if module in out and isinstance(section, dict):
                out[module].append(section)
    return out


@pytest.mark.parametrize("module", MODULES)
def test_the_generated_validator_never_accepts_what_the_generic_one_refuses(module):
    fast = importlib.import_module(validator_module(module)).validate
    schema = json.loads((ROOT / "config" / "schemas" / f"{module}.schema.json").read_text())
    generic = jsonschema.validators.validator_for(schema)(schema)
    tried = refused = 0
    for sample in [*_samples()[module], _full(schema, schema)]:
        for doc in _mutations(sample):
            fast_ok, generic_ok = _agree(fast, generic, doc)
            assert generic_ok or not fast_ok, f"{module}: the generated validator accepts {doc!r}"
            tried, refused = tried + 1, refused + (not generic_ok)
    assert tried > 10 and (refused or module in ("hooks",)), (tried, refused)


def test_the_generated_state_validator_never_accepts_what_the_generic_one_refuses():
    from resmgr.generated.schemas import statefile as fast_state

    res = Resources(cpuset_cpus="0-1", cpuset_mems="0", cpu_shares=2048, cpu_quota=200000, cpu_period=100000,
                    memory_limit_in_bytes=1 << 30)
    pod = Pod(id="p1", uid="u1", name="p", namespace="default", cgroup_parent="/kubepods/podu1")
    c = Container(id="c1", pod_id="p1", name="c", requested=res, resources=res, classes={"rdt": "gold"})
    state = {"version": 1, "pods": [pod.to_dict()], "containers": [c.to_dict()]}
    generic = jsonschema.Draft202012Validator(statefile.SCHEMA)
    assert generic.is_valid(state), list(generic.iter_errors(state))[:1]
    for doc in _mutations(state):
        fast_ok, generic_ok = _agree(fast_state.validate, generic, doc)
        assert generic_ok or not fast_ok, f"the generated validator accepts {doc!r}"


def test_generated_validators_are_current():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import genschemas
    finally:
        sys.path.pop(0)
    with tempfile.TemporaryDirectory() as tmp:
        for path in genschemas.generate(Path(tmp)):
            committed = ROOT / path.relative_to(tmp)
            assert committed.exists() and committed.read_text() == path.read_text(), \
                f"{committed} is stale: run .venv/bin/python scripts/genschemas.py"
