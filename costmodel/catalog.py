"""Load GPU and model descriptions from the YAML catalogue in `conf/gpu/` and `conf/model/`.

Every error names the file, the field and what would be valid. Plain YAML, no Hydra: the
pipeline composes configs with Hydra and hands the GPU/model names to these loaders.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

import yaml

from costmodel.specs import GPU, UNPRICED_ATTENTIONS, Model, SpecError

CONF_DIR = Path(os.environ.get("ARCHIPELAGO_CONF", Path(__file__).resolve().parents[1] / "conf"))

T = TypeVar("T")


class CatalogError(ValueError):
    """A catalogue entry that is missing, unknown or malformed; the message says how to fix it."""


def build(cls: type[T], data: Mapping[str, Any], source: str) -> T:
    """Construct dataclass `cls` from a mapping, checking fields and types; errors name `source`."""
    if not isinstance(data, Mapping):
        raise CatalogError(f"{source}: expected a mapping of fields, got {type(data).__name__}")
    flds = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(flds))
    if unknown:
        raise CatalogError(f"{source}: unknown field(s) {unknown}; valid fields: {sorted(flds)}")
    missing = sorted(
        n
        for n, f in flds.items()
        if n not in data and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    )
    if missing:
        raise CatalogError(f"{source}: missing field(s) {missing}")
    values: dict[str, Any] = {}
    for name, value in data.items():
        kind = flds[name].type
        record = _record_type(cls, name)
        if record is not None and value is not None:  # a block of its own (a GPU's `device`)
            if not isinstance(value, Mapping):
                raise CatalogError(f"{source}: field `{name}` must be a block of fields, got {value!r}")
            values[name] = build(record, value, f"{source}: {name}")
            continue
        if kind == "int" and (isinstance(value, bool) or not isinstance(value, int)):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                raise CatalogError(f"{source}: field `{name}` must be a whole number, got {value!r}")
        elif kind == "float" and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise CatalogError(f"{source}: field `{name}` must be a number, got {value!r}")
        elif kind == "str" and not isinstance(value, str):
            raise CatalogError(f"{source}: field `{name}` must be text, got {value!r}")
        values[name] = float(value) if kind == "float" else value
    try:
        return cls(**values)
    except SpecError as err:
        raise CatalogError(f"{source}: {err}") from None


def _record_type(cls: type, name: str) -> type | None:
    """The record class field `name` of `cls` holds (`Device` for `device: Device | None`), or None."""
    hint = typing.get_type_hints(cls)[name]
    kinds = typing.get_args(hint) or (hint,)
    return next((k for k in kinds if isinstance(k, type) and dataclasses.is_dataclass(k)), None)


def _entries(group: str) -> dict[str, Path]:
    folder = CONF_DIR / group
    return {p.stem: p for p in sorted(folder.glob("*.yaml"))}


def _read(group: str, name: str, what: str) -> tuple[dict[str, Any], str]:
    entries = _entries(group)
    if name not in entries:
        raise CatalogError(f"unknown {what} {name!r}; choose from {sorted(entries)} (or add conf/{group}/{name}.yaml)")
    path = entries[name]
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise CatalogError(f"{path}: not valid YAML ({err})") from None
    return data, str(path)


def gpu_names() -> list[str]:
    return sorted(_entries("gpu"))


def model_names() -> list[str]:
    return sorted(_entries("model"))


def priced_model_names() -> list[str]:
    """The catalogue's models the cost model prices: the others (an attention kind it does not price) are refused
    when loaded, saying why."""
    return [n for n in model_names() if not _unpriced(n)]


def _unpriced(name: str) -> bool:
    data, _ = _read("model", name, "model")
    return data.get("attention") in UNPRICED_ATTENTIONS


@cache
def load_gpu(name: str) -> GPU:
    data, source = _read("gpu", name, "GPU")
    if data.get("name", name) != name:
        raise CatalogError(f"{source}: field `name` must match the file name {name!r}, got {data['name']!r}")
    return build(GPU, {"name": name, **data}, source)


@cache
def load_model(name: str) -> Model:
    data, source = _read("model", name, "model")
    return build(Model, {"name": name, **data}, source)
