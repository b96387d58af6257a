"""Hydra schemas derived from frozen config values, and back.

Components own their settings as frozen dataclasses with tuple fields (`DLRMConfig`,
`SyntheticConfig`, ...). Hydra merges YAML and overrides into *mutable* structured
configs with List fields, so `schema_of(cls)` builds that twin (same name, fields and
defaults; tuple -> List, nested values -> their schemas) and `value_of(obj)` turns a
composed, type-checked schema object back into the frozen value.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Dict, List, Optional

_SCHEMAS: dict[type, type] = {}


def schema_of(cls: type) -> type:
    """The mutable structured-config twin of the frozen dataclass ``cls`` (cached)."""
    if cls in _SCHEMAS:
        return _SCHEMAS[cls]
    hints = typing.get_type_hints(cls)
    specs = []
    for f in dataclasses.fields(cls):
        kind = _hydra_type(hints[f.name])
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            specs.append((f.name, kind, dataclasses.field(default=dataclasses.MISSING)))
            continue
        if isinstance(default, tuple):
            specs.append((f.name, kind, dataclasses.field(default_factory=lambda d=default: list(d))))
        elif isinstance(default, dict):
            specs.append((f.name, kind, dataclasses.field(default_factory=lambda d=default: dict(d))))
        elif dataclasses.is_dataclass(default):
            specs.append((f.name, kind, dataclasses.field(default_factory=lambda d=default: _to_schema(d))))
        else:
            specs.append((f.name, kind, dataclasses.field(default=default)))
    schema = dataclasses.make_dataclass(cls.__name__, specs, namespace={"__value_class__": cls, "__doc__": cls.__doc__})
    _SCHEMAS[cls] = schema
    return schema


def value_of(obj: Any) -> Any:
    """A composed schema object (from `OmegaConf.to_object`) as its frozen value, recursively."""
    value_class = getattr(type(obj), "__value_class__", None)
    if value_class is not None:
        return value_class(**{f.name: value_of(getattr(obj, f.name)) for f in dataclasses.fields(obj)})
    if isinstance(obj, (list, tuple)):
        return tuple(value_of(v) for v in obj)
    if isinstance(obj, dict):
        return {k: value_of(v) for k, v in obj.items()}
    return obj


def _to_schema(value: Any) -> Any:
    return schema_of(type(value))(**{f.name: _to_schema(getattr(value, f.name)) for f in dataclasses.fields(value)}) \
        if dataclasses.is_dataclass(value) else (list(value) if isinstance(value, tuple) else value)


def _hydra_type(kind: Any) -> Any:
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is tuple:
        return List[_hydra_type(args[0])]  # type: ignore[misc]
    if origin in (list, typing.List):
        return List[_hydra_type(args[0])]  # type: ignore[misc]
    if origin in (dict, typing.Dict) or origin is typing.Mapping:
        return Dict[args[0], _hydra_type(args[1])]  # type: ignore[misc]
    if origin is typing.Union or type(kind).__name__ == "UnionType":
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return Optional[_hydra_type(rest[0])]
        return Any
    if dataclasses.is_dataclass(kind):
        return schema_of(kind)
    return kind
