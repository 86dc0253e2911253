"""The kind of class every result type is: a frozen :class:`msgspec.Struct` with fields that carry
the JSON codec's metadata.

A result type is declared once (``class Step(Model, frozen=True, kw_only=True): ...``) and its
fields are declared as a dataclass's are: ``field(default=..., default_factory=..., metadata=...,
compare=False, repr=False)``. msgspec makes the class in C: making the package's 120-odd result
types at start-up costs about 4 % of what frozen slotted dataclasses cost (whose methods Python
compiles from source at every start: 0.07-0.09 s of a single-trace ``analyze``'s 0.5 s; see
``benchmarks/bench_classes.py``).

What a dataclass does that a Struct does not, :class:`ModelMeta` adds where a class asks for it:

- a field's ``metadata`` (what the codec, :mod:`traceinsight.results.codec`, reads: ``check``,
  ``key``, ``local`` …) is kept in :func:`fields_of`;
- a field with ``compare=False`` (what only a live analysis knows: a stored result equals the live
  one without it) is left out of ``__eq__`` and ``__hash__``, and one with ``repr=False`` out of
  ``__repr__``, by methods written once here (a class without such fields keeps msgspec's).

:func:`replace`, :func:`fields_of` and :func:`as_dict` are what ``dataclasses.replace``,
``dataclasses.fields`` and ``dataclasses.asdict`` are to a dataclass.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, TypeVar

import msgspec
from msgspec import NODEFAULT

__all__ = [
    "CODE",
    "COUNT",
    "DURATION",
    "ID",
    "LOCAL",
    "SHARE",
    "Field",
    "Model",
    "ModelMeta",
    "as_dict",
    "field",
    "fields_of",
    "replace",
]

if TYPE_CHECKING:  # what tells a type checker that ``field`` is a field's declaration (PEP 681)
    from typing_extensions import dataclass_transform
else:

    def dataclass_transform(**_: object) -> Callable[[type], type]:
        return lambda cls: cls


_M = TypeVar("_M", bound="Model")

#: The codec's checks on a stored value (see :mod:`traceinsight.results.codec`): a share 0 to 1,
#: a duration 0 to 10^15 µs, a count (an integer ≥ 0), an id (lowercase words), code (newlines kept).
SHARE: Final = {"check": "share"}
DURATION: Final = {"check": "duration"}
COUNT: Final = {"check": "count"}
ID: Final = {"check": "id"}
CODE: Final = {"check": "code"}
#: Not part of the JSON: what a live analysis knows beside it.
LOCAL: Final = {"local": True}
#: What the codec reads of a field (``check``, ``key``, ``local`` …: :mod:`traceinsight.results.codec`).
Metadata = Mapping[str, Any]
_NO_METADATA: Final[Metadata] = MappingProxyType({})


class Field:
    """One field of a result type, as declared: its name, default, and the codec's metadata."""

    __slots__ = ("compare", "default", "default_factory", "metadata", "name", "repr")

    def __init__(
        self,
        name: str,
        default: object = NODEFAULT,
        default_factory: object = NODEFAULT,
        metadata: Metadata = _NO_METADATA,
        compare: bool = True,
        repr: bool = True,
    ) -> None:
        self.name = name
        self.default = default
        self.default_factory = default_factory
        self.metadata = metadata
        self.compare = compare
        self.repr = repr

    @property
    def has_default(self) -> bool:
        """Whether the field may be left out when the class is made."""
        return self.default is not NODEFAULT or self.default_factory is not NODEFAULT

    def __repr__(self) -> str:
        return f"Field({self.name!r}, metadata={dict(self.metadata)!r})"


def field(
    *,
    default: object = NODEFAULT,
    default_factory: Callable[[], object] | object = NODEFAULT,
    metadata: Metadata | None = None,
    compare: bool = True,
    repr: bool = True,
) -> Any:
    """A field's default and what the codec and equality make of it (``dataclasses.field``'s
    arguments of the same names)."""
    if default is not NODEFAULT and default_factory is not NODEFAULT:
        raise ValueError("a field takes a default or a default factory, not both")
    return Field("", default, default_factory, MappingProxyType(dict(metadata or {})), compare, repr)


class ModelMeta(msgspec.StructMeta):
    """msgspec's metaclass, keeping each field's :class:`Field` and writing ``__eq__``,
    ``__hash__`` and ``__repr__`` where a field is left out of them (see the module doc)."""

    def __new__(
        mcls, name: str, bases: tuple[type, ...], namespace: dict[str, object], **config: Any
    ) -> ModelMeta:
        declared: dict[str, Field] = {}
        for key, value in list(namespace.items()):
            if isinstance(value, Field):
                declared[key] = Field(
                    key, value.default, value.default_factory, value.metadata, value.compare, value.repr
                )
                namespace[key] = _struct_field(value)
        inherited: dict[str, Field] = {}
        for base in reversed(bases):
            inherited.update({item.name: item for item in getattr(base, "__model_fields__", ())})
        compared = [key for key, item in {**inherited, **declared}.items() if not item.compare]
        shown = [key for key, item in {**inherited, **declared}.items() if not item.repr]
        inherited_frozen = any(
            getattr(getattr(base, "__struct_config__", None), "frozen", False) for base in bases
        )
        frozen = config.get("frozen", inherited_frozen)
        if compared and config.get("eq", True) and "__eq__" not in namespace:
            namespace["__eq__"] = _equality
            if frozen and "__hash__" not in namespace:
                namespace["__hash__"] = _hash
        # rich draws a Struct from its ``__rich_repr__`` (every field), before its ``__repr__``.
        if "__repr__" in namespace:
            namespace.setdefault("__rich_repr__", _as_repr)
        elif shown:
            namespace["__repr__"] = _repr
            namespace.setdefault("__rich_repr__", _rich_repr)
        cls = super().__new__(mcls, name, bases, namespace, **config)
        every = []
        for key, default in zip(cls.__struct_fields__, _defaults(cls), strict=True):
            made = declared.get(key) or inherited.get(key)
            if made is None:
                made = Field(key, *default)
            every.append(made)
        cls.__model_fields__ = tuple(every)  # type: ignore[attr-defined]
        cls.__model_compared__ = tuple(item.name for item in every if item.compare)  # type: ignore[attr-defined]
        cls.__model_shown__ = tuple(item.name for item in every if item.repr)  # type: ignore[attr-defined]
        return cls


def _struct_field(declared: Field) -> object:
    """msgspec's field for ``declared`` (its default, or its default's factory)."""
    if callable(declared.default_factory):  # NODEFAULT is not
        return msgspec.field(default_factory=declared.default_factory)
    if declared.default is not NODEFAULT:
        return msgspec.field(default=declared.default)
    return msgspec.field()


def _defaults(cls: ModelMeta) -> list[tuple[object, object]]:
    """(default, default factory) of each field of the Struct ``cls``, in its fields' order."""
    defaults: tuple[object, ...] = cls.__struct_defaults__
    pairs: list[tuple[object, object]] = [(NODEFAULT, NODEFAULT)] * (
        len(cls.__struct_fields__) - len(defaults)
    )
    for default in defaults:
        if isinstance(default, msgspec._core.Factory):
            pairs.append((NODEFAULT, default.factory))
        else:
            pairs.append((default, NODEFAULT))
    return pairs


def _equality(self: Model, other: object) -> object:
    if type(other) is not type(self):
        return NotImplemented
    names: tuple[str, ...] = type(self).__model_compared__  # type: ignore[attr-defined]
    mine = tuple(getattr(self, name) for name in names)
    equal: bool = mine == tuple(getattr(other, name) for name in names)
    return equal


def _hash(self: Model) -> int:
    names: tuple[str, ...] = type(self).__model_compared__  # type: ignore[attr-defined]
    return hash(tuple(getattr(self, name) for name in names))


def _rich_repr(self: Model) -> Iterator[tuple[str, object]]:
    """What rich shows of a result: the fields its ``repr`` shows."""
    names: tuple[str, ...] = type(self).__model_shown__  # type: ignore[attr-defined]
    for name in names:
        yield name, getattr(self, name)


def _as_repr(self: Model) -> None:
    """Nothing: rich shows the class's own ``repr`` (a result's one line)."""
    return None


def _repr(self: Model) -> str:
    names: tuple[str, ...] = type(self).__model_shown__  # type: ignore[attr-defined]
    inner = ", ".join(f"{name}={getattr(self, name)!r}" for name in names)
    return f"{type(self).__qualname__}({inner})"


@dataclass_transform(field_specifiers=(field,))
class Model(msgspec.Struct, frozen=True, metaclass=ModelMeta):
    """The base of every result type (see the module doc)."""


def fields_of(cls: object) -> tuple[Field, ...]:
    """The fields of the result type ``cls`` (or of its instance), in order."""
    every: tuple[Field, ...] = getattr(cls, "__model_fields__")  # noqa: B009 (set by ModelMeta)
    return every


def replace(value: _M, /, **changes: object) -> _M:
    """``value`` with the fields in ``changes`` set otherwise (``__post_init__`` runs again)."""
    return msgspec.structs.replace(value, **changes)


def as_dict(value: object) -> Any:
    """A result as plain data, as ``dataclasses.asdict`` makes it: each result a dict of its
    fields, recursively through tuples, lists and dicts (which are copied)."""
    if isinstance(value, Model):
        return {item.name: as_dict(getattr(value, item.name)) for item in fields_of(value)}
    if isinstance(value, (tuple, list)):
        return type(value)(as_dict(item) for item in value)
    if isinstance(value, dict):
        return {as_dict(key): as_dict(item) for key, item in value.items()}
    return value
