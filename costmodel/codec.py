"""The JSON form of a frozen record tree, written and read by one generic pair: `to_data` and `from_data`.

A record is a frozen dataclass whose fields are plain values (bool, int, float, str, a `StrEnum`), optional
values (`X | None`), tuples of them (`tuple[X, ...]`, `tuple[X, Y]`), mappings of them (`dict[str, X]`) and other
records. `to_data` writes such a tree as JSON data (records as objects, tuples as lists); `from_data(cls, data,
where)` reads it back, checking every value's type against the field's annotation and letting each record check
its own invariants as it is made (`__post_init__`). A class with a JSON form of its own (a calibration), or one
that also reads the forms of earlier releases, gives `to_json()` and a static `from_json(data, where)`, and is
written and read through them; these may hand the rest to `fields_data` and `from_fields`, the generic pair
without the class's own hooks.

A field may be absent from the data where it has a default (a file written before the field existed). A key the
record does not have is refused, unless the class lists it in `JSON_DERIVED`: values written beside the record for
a reader's convenience (plan.json's `ep_group`), not read back.

Every error is a `RecordError` naming the place in the data (`plan.json: islands[3].tp: ...`).
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal, TypeVar

from costmodel.cli import UserError

T = TypeVar("T")


class RecordError(UserError):
    """Data that is not the JSON form of the record it is read as; the message names where."""


def to_data(value: Any) -> Any:
    """`value` (a record, or anything a record holds) as JSON data."""
    if hasattr(value, "to_json") and not isinstance(value, type):
        return value.to_json()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return fields_data(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (tuple, list)):
        return [to_data(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): to_data(v) for k, v in value.items()}
    return value


def fields_data(record: Any) -> dict[str, Any]:
    """A record's fields as JSON data, whatever `to_json` its class has."""
    return {f.name: to_data(getattr(record, f.name)) for f in dataclasses.fields(record)}


def from_data(cls: type[T], data: Any, where: str) -> T:
    """The record of class `cls` whose JSON data is `data`; `where` (the file) prefixes every error."""
    return _read(cls, data, Place(where))


def from_fields(cls: type[T], data: Any, where: str) -> T:
    """The record of class `cls` read field by field from `data`, whatever `from_json` its class has."""
    return _record(cls, data, Place(where))


@dataclass(frozen=True)
class Place:
    """Where a value sits: the file (`where`) and the path inside it (`islands[3].hosts`)."""

    where: str
    path: str = ""

    def at(self, key: str | int) -> Place:
        step = f"[{key}]" if isinstance(key, int) else (f".{key}" if self.path else str(key))
        return Place(self.where, self.path + step)

    def says(self, message: str) -> RecordError:
        """`where: path: message` (the record's own words about itself)."""
        return RecordError(f"{self.where}: {self.path}: {message}" if self.path else f"{self.where}: {message}")

    def must(self, what: str, data: Any) -> RecordError:
        """`where: path must be <what>, got <data>` (a value of the wrong kind)."""
        return RecordError(f"{self.where}: {self.path or 'the data'} must be {what}, got {data!r:.80}")

    @property
    def text(self) -> str:
        return f"{self.where}: {self.path}" if self.path else self.where


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _read(tp: Any, data: Any, at: Place) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return data
    if origin is Literal:
        if data not in args:
            raise at.must(f"one of {list(args)}", data)
        return data
    if origin in (typing.Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        kinds = [a for a in args if a is not type(None)]
        if len(kinds) == 1:
            return _read(kinds[0], data, at)
        for kind in kinds:  # the first that reads it (e.g. `int | str`)
            try:
                return _read(kind, data, at)
            except RecordError:
                continue
        raise at.must(f"one of {[_name(k) for k in kinds]}", data)
    if origin is tuple:
        if not isinstance(data, (list, tuple)):
            raise at.must("a list", data)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_read(args[0], v, at.at(k)) for k, v in enumerate(data))
        if len(data) != len(args):
            raise at.must(f"a list of {len(args)} ({', '.join(map(_name, args))})", data)
        return tuple(_read(a, v, at.at(k)) for k, (a, v) in enumerate(zip(args, data, strict=True)))
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        if not isinstance(data, Mapping):
            raise at.must("an object", data)
        value = args[1] if len(args) == 2 else Any
        return {str(k): _read(value, v, at.at(str(k))) for k, v in data.items()}
    if isinstance(tp, type) and hasattr(tp, "from_json"):
        try:
            return tp.from_json(data, at.text)
        except RecordError:
            raise
        except ValueError as err:  # the class's own reader names where itself
            raise RecordError(str(err)) from None
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _record(tp, data, at)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(data)
        except ValueError:
            raise at.must(f"one of {[m.value for m in tp]}", data) from None
    return _plain(tp, data, at)


def _record(cls: type, data: Any, at: Place) -> Any:
    if not isinstance(data, Mapping):
        raise at.must(f"an object (a {cls.__name__})", data)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    extra = sorted(set(data) - set(fields) - set(getattr(cls, "JSON_DERIVED", ())))
    if extra:
        raise at.says(f"`{extra[0]}` is not a field of {cls.__name__} (its fields: {sorted(fields)})")
    hints, kw = _hints(cls), {}
    for name, f in fields.items():
        if name in data:
            kw[name] = _read(hints[name], data[name], at.at(name))
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise at.says(f"no `{name}` ({cls.__name__} has {sorted(fields)})")
    try:
        return cls(**kw)
    except RecordError:
        raise
    except ValueError as err:  # the record's own invariants (PlanError, SpecError, ... are ValueErrors)
        raise at.says(str(err)) from None


def _plain(tp: Any, data: Any, at: Place) -> Any:
    if tp is bool:
        if not isinstance(data, bool):
            raise at.must("true or false", data)
        return data
    if tp is int:
        if isinstance(data, bool) or not isinstance(data, int):
            raise at.must("a whole number", data)
        return data
    if tp is float:
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            raise at.must("a number", data)
        return float(data)
    if tp is str:
        if not isinstance(data, str):
            raise at.must("a text", data)
        return data
    raise TypeError(f"{at.text}: no JSON reading for the type {tp!r}")  # a field type this module does not know


def _name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))
