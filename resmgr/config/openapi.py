"""Our JSON Schemas as a Kubernetes structural OpenAPI schema, for the configuration CRD.

The API server accepts only structural schemas: one type per node (or int-or-string),
no `$ref`, no `patternProperties`, no type unions. It also prunes fields a schema does
not name, silently. So the conversion keeps what the API server can check early (types,
enums, bounds, descriptions for `kubectl explain`) and leaves the rest to the daemon:
objects keep unknown fields (`x-kubernetes-preserve-unknown-fields`), so a misspelt key
reaches the daemon and is reported with its path instead of vanishing; unions and
`anyOf` become "anything" for the same reason; case-insensitive option patterns are
listed under their canonical names.
"""

from __future__ import annotations

import re
from typing import Any

ANY: dict[str, Any] = {"x-kubernetes-preserve-unknown-fields": True}
_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string"}


def canonical_key(pattern: str) -> str:
    """`^[Pp][Ii][Nn]...$` reads back as PinCPU: the name a case-insensitive pattern spells."""
    return re.sub(r"\[(.)[^]]*\]|\\(.)", lambda m: m.group(1) or m.group(2), pattern).strip("^$")


def _resolve(ref: str, root: dict[str, Any]) -> dict[str, Any]:
    if not ref.startswith("#/"):
        raise ValueError(f"only local references are supported, not {ref!r}")
    node: Any = root
    for part in ref[2:].split("/"):
        node = node[part]
    return node


def _types(schema: dict[str, Any]) -> list[str]:
    t = schema.get("type")
    if t is None and "enum" in schema:
        return sorted({_JSON_TYPES.get(type(v), "null") for v in schema["enum"]})
    if t is None and any(k in schema for k in ("properties", "patternProperties", "additionalProperties")):
        return ["object"]
    return [t] if isinstance(t, str) else list(t or [])


def convert(schema: dict[str, Any], root: dict[str, Any] | None = None,
            seen: tuple[str, ...] = ()) -> dict[str, Any]:
    """The structural counterpart of one JSON Schema node."""
    root = root if root is not None else schema
    if "$ref" in schema:
        ref = schema["$ref"]
        if ref in seen:  # a recursive type (nested balloon components): checked by the daemon
            return {**ANY, "type": "object", **_description(schema)}
        target = {**_resolve(ref, root), **{k: v for k, v in schema.items() if k != "$ref"}}
        return convert(target, root, (*seen, ref))
    out = _description(schema)
    if "anyOf" in schema or "oneOf" in schema:
        return {**out, **ANY}
    types = _types(schema)
    nullable = "null" in types
    types = [t for t in types if t != "null"]
    if sorted(types) == ["integer", "string"]:
        return {**out, "x-kubernetes-int-or-string": True}
    if len(types) != 1:
        return {**out, **ANY}
    kind = types[0]
    out["type"] = kind
    if nullable:
        out["nullable"] = True
    if kind == "object":
        out.update(_object(schema, root, seen))
    elif kind == "array":
        items = schema.get("items")
        out["items"] = convert(items, root, seen) if isinstance(items, dict) else dict(ANY)
        for key in ("minItems", "maxItems"):
            if key in schema:
                out[key] = schema[key]
    else:
        if "enum" in schema and not nullable:
            out["enum"] = [v for v in schema["enum"] if _JSON_TYPES.get(type(v)) == kind
                           or (kind == "number" and isinstance(v, int))]
        for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength"):
            if key in schema and not isinstance(schema[key], bool):
                out[key] = schema[key]
    return out


def _description(schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": schema["description"]} if schema.get("description") else {}


def _object(schema: dict[str, Any], root: dict[str, Any], seen: tuple[str, ...]) -> dict[str, Any]:
    props = {name: convert(sub, root, seen) for name, sub in (schema.get("properties") or {}).items()}
    for pattern, sub in (schema.get("patternProperties") or {}).items():
        props.setdefault(canonical_key(pattern), convert(sub, root, seen))
    out: dict[str, Any] = {}
    extra = schema.get("additionalProperties")
    if props:
        out["properties"] = props
        out.update(ANY)  # unknown and differently-cased keys reach the daemon, which names them
    elif isinstance(extra, dict):
        out["additionalProperties"] = convert(extra, root, seen)
    else:
        out.update(ANY)
    return out
