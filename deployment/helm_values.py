"""Check a Helm values file for llm-d's model-service chart offline, as far as the chart itself says what it takes.

What is checked:
- the values Helm would validate: the chart's defaults (its values.yaml) with the file's values over them,
  merged as Helm merges them (maps key by key, a null removes the key, lists and scalars replace), against
  the chart's own `values.schema.json` (JSON Schema draft 7; Helm refuses to install values it rejects);
- each engine container and each volume against the Pod schema Kubernetes applies (the Container and
  Volume schemas embedded in a CustomResourceDefinition that carries a pod template, e.g. LeaderWorkerSet's),
  since the chart's schema lets any object through there;
- the container's fields against those the chart's template reads (`.container.<field>` in its
  `_helpers.tpl`): the chart writes the pod's container field by field, so a field it does not read
  would be dropped without a word.

What is not: the templates are not rendered (no Helm here), so what they compute (names, labels, the
routing sidecar, resources from `parallelism`) is read from the chart's source, not run.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from jsonschema import Draft7Validator

from deployment.crd import structural

ROLES = ("prefill", "decode")


def coalesce(defaults: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """`values` over `defaults` as Helm merges a values file into a chart's: maps merged key by key, a null removes
    the key, anything else replaces."""
    out = copy.deepcopy(defaults)
    for k, v in values.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = coalesce(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def template_fields(helpers: str) -> set[str]:
    """The container fields the chart's `llm-d-modelservice.container` template (and what it includes) reads."""
    return set(re.findall(r"\.container\.(\w+)", helpers))


def pod_schemas(crd: dict[str, Any]) -> tuple[Draft7Validator, Draft7Validator]:
    """Validators of a Container and of a Volume, from a CRD whose schema holds a pod template (LeaderWorkerSet)."""
    (version,) = [v for v in crd["spec"]["versions"] if v.get("storage", True)][:1]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["leaderWorkerTemplate"]
    pod = spec["properties"]["workerTemplate"]["properties"]["spec"]["properties"]
    return Draft7Validator(structural(pod["containers"]["items"])), Draft7Validator(structural(pod["volumes"]["items"]))


def _errors(validator: Draft7Validator, doc: Any, where: str) -> list[str]:
    out = []
    for e in validator.iter_errors(doc):
        path = where + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e.absolute_path)
        if e.validator == "additionalProperties" and e.validator_value is False:
            known = e.schema.get("properties", {})
            out += [f"{path}.{f}".lstrip(".") + ": unknown field" for f in e.instance if f not in known]
        else:
            out.append(f"{path.lstrip('.') or '<root>'}: {e.message}")
    return out


def check(
    values: dict[str, Any],
    schema: dict[str, Any],
    defaults: dict[str, Any],
    helpers: str,
    pod: tuple[Draft7Validator, Draft7Validator],
) -> list[str]:
    """What is wrong with `values` for the chart (its `schema`, `defaults` and `_helpers.tpl` text), one
    `path: message` each; [] when Helm would take it and the chart would write the containers as given."""
    errors = _errors(Draft7Validator(schema), coalesce(defaults, values), "")
    fields = template_fields(helpers)
    container_schema, volume_schema = pod
    for role in ROLES:
        spec = values.get(role) or {}
        for j, c in enumerate(spec.get("containers") or []):
            where = f"{role}.containers[{j}]"
            unread = sorted(set(c) - fields)
            errors += [f"{where}.{f}: the chart's template does not read it (dropped)" for f in unread]
            # the pod's container as the chart writes it: its fields, with extraConfig's merged in
            written = {k: v for k, v in c.items() if k in fields and k not in ("modelCommand", "mountModelVolume",
                                                                                  "extraConfig")}  # fmt: skip
            written.update(c.get("extraConfig") or {})
            errors += _errors(container_schema, written, where)
        for j, v in enumerate(spec.get("volumes") or []):
            errors += _errors(volume_schema, v, f"{role}.volumes[{j}]")
    return errors
