"""Check a custom resource (a manifest's dict) against its CustomResourceDefinition, offline.

What is checked, as the API server would on `kubectl apply --validate=strict`:
- `apiVersion` is `<the CRD's group>/<a served version>` and `kind` is the CRD's kind;
- the document against that version's `openAPIV3Schema` with `jsonschema` (Draft 7), after translating
  Kubernetes' structural-schema extensions: `x-kubernetes-int-or-string` (an integer or a string),
  `nullable` (null allowed), `x-kubernetes-preserve-unknown-fields` (anything beyond the listed fields),
  `x-kubernetes-embedded-resource` (apiVersion, kind and metadata of an object inside);
- unknown fields: every object that does not preserve unknown fields is closed (`additionalProperties:
  false`), since the API server prunes, that is silently drops, what its schema does not list;
- `metadata` (the root's and an embedded resource's) as a small ObjectMeta: a name, string labels and
  annotations.

What is not: CEL rules (`x-kubernetes-validations`: listed, not evaluated), `format` (int32, date-time...),
list-map key uniqueness (`x-kubernetes-list-type: map`), defaults, admission webhooks and whatever the
operator itself checks when it reconciles.

Errors read `<path>: <what is wrong>`, e.g. `spec.leaderWorkerTemplate.size: Required value`.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft7Validator

OBJECT_META = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "generateName": {"type": "string"},
        "namespace": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}  # the other ObjectMeta fields (uid, ownerReferences, ...) are let through


def load_crd(path: str | Path) -> dict[str, Any]:
    """The CustomResourceDefinition in the YAML file `path` (gzipped if it ends with .gz)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for doc in yaml.safe_load_all(f):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                return doc
    raise ValueError(f"{path}: no CustomResourceDefinition in it")


def structural(s: dict[str, Any], root: bool = False) -> dict[str, Any]:
    """The JSON Schema that a Kubernetes structural schema `s` means (see the module docstring)."""
    out = {k: v for k, v in s.items() if k not in ("properties", "items", "additionalProperties", "description")}
    preserve = s.get("x-kubernetes-preserve-unknown-fields", False)
    if s.get("x-kubernetes-int-or-string"):
        out.pop("anyOf", None)
        out["type"] = ["integer", "string"]
    if "items" in s:
        out["items"] = structural(s["items"])
    props = {k: structural(v) for k, v in s.get("properties", {}).items()}
    if s.get("x-kubernetes-embedded-resource"):
        props = {"apiVersion": {"type": "string"}, "kind": {"type": "string"}, **props, "metadata": OBJECT_META}
        out["required"] = sorted({*s.get("required", []), "apiVersion", "kind"})
    if root:
        props["metadata"] = {**OBJECT_META, "required": ["name"]}
    if props:
        out["properties"] = props
    if isinstance(s.get("additionalProperties"), dict):
        out["additionalProperties"] = structural(s["additionalProperties"])
    elif s.get("type") == "object" and not preserve and "additionalProperties" not in s:
        out["additionalProperties"] = False  # pruned by the API server: strict validation calls it unknown
    if s.get("nullable"):
        t = out.get("type")
        out["type"] = [*(t if isinstance(t, list) else [t] if t else []), "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    return out


_VALIDATORS: dict[tuple[int, str], tuple[dict[str, Any], Draft7Validator]] = {}


def _validator(crd: dict[str, Any], version: str) -> Draft7Validator:
    key = (id(crd), version)
    if key not in _VALIDATORS or _VALIDATORS[key][0] is not crd:
        (v,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
        _VALIDATORS[key] = (crd, Draft7Validator(structural(v["schema"]["openAPIV3Schema"], root=True)))
    return _VALIDATORS[key][1]


def _path(parts: Any) -> str:
    text = ""
    for p in parts:
        text += f"[{p}]" if isinstance(p, int) else f".{p}" if text else str(p)
    return text


def _join(path: str, field: str) -> str:
    return f"{path}.{field}" if path else field


def validate(doc: dict[str, Any], crd: dict[str, Any]) -> list[str]:
    """What is wrong with the custom resource `doc` for `crd`, one `path: message` each; [] when valid."""
    spec = crd["spec"]
    group, kind = spec["group"], spec["names"]["kind"]
    served = [v["name"] for v in spec["versions"] if v.get("served", True)]
    api = str(doc.get("apiVersion", ""))
    errors = []
    if doc.get("kind") != kind:
        errors.append(f"kind: {doc.get('kind')!r} is not {kind!r}")
    if "/" not in api or api.split("/", 1)[0] != group or api.split("/", 1)[1] not in served:
        wanted = " or ".join(f"{group}/{v}" for v in served)
        return [*errors, f"apiVersion: {api!r} is not served by {spec['names']['plural']}.{group} ({wanted})"]
    found: list[str] = []
    for e in _validator(crd, api.split("/", 1)[1]).iter_errors(doc):
        path = _path(e.absolute_path)
        if e.validator == "required":
            missing = [f for f in e.validator_value if f not in e.instance]
            found += [f"{_join(path, f)}: Required value" for f in missing]
        elif e.validator == "additionalProperties" and e.validator_value is False:
            known = e.schema.get("properties", {})
            found += [f"{_join(path, f)}: unknown field" for f in e.instance if f not in known]
        else:
            found.append(f"{path or '<root>'}: {e.message}")
    return errors + sorted(found)
