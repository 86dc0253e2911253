"""What the package's result types cost to make at start-up, as they are declared
(:class:`traceinsight.model.Model`: frozen msgspec Structs) and as the frozen slotted dataclasses
they were until issue 50.

Python 3.11 makes each method a frozen slotted dataclass gets (``__init__``, ``__repr__``,
``__eq__``, ``__hash__``, ``__setattr__``, ``__delattr__``) by compiling its source text, at every
start; msgspec makes a Struct in C. This imports what a single-trace ``analyze`` imports, then
makes every result type of the package again from its own fields, in one process, three ways: as
declared (a ``Model``, its fields' metadata kept); as a frozen slotted dataclass with the same
fields, metadata, ``compare`` and ``repr``; and as a bare frozen ``msgspec.Struct`` (what
``Model``'s own bookkeeping adds). The time of the imports themselves is printed first, for scale.
Medians of ``--repeat`` rounds. Usage::

    python benchmarks/bench_classes.py              # about 5 s
    python benchmarks/bench_classes.py --repeat 9
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
from msgspec import NODEFAULT

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from traceinsight.model import Model, field, fields_of

#: What a single-trace ``analyze`` imports of the package (numpy and polars before it, apart).
PACKAGE_MODULES = (
    "traceinsight.commands.analyze",
    "traceinsight.commands.common",
    "traceinsight.load.loader",
    "traceinsight.analysis",
    "traceinsight.rules",
)


def import_package() -> float:
    """Import numpy and polars, then :data:`PACKAGE_MODULES`; seconds the latter took."""
    importlib.import_module("numpy")
    importlib.import_module("polars")
    start = time.perf_counter()
    for name in PACKAGE_MODULES:
        importlib.import_module(name)
    return time.perf_counter() - start


def package_types() -> list[type]:
    """Every result type the imports above made, once each."""
    found: dict[type, None] = {}
    for name, module in list(sys.modules.items()):
        if name.startswith("traceinsight"):
            for value in vars(module).values():
                if isinstance(value, type) and issubclass(value, Model) and value.__module__ == name:
                    found[value] = None
    return list(found)


def as_model(cls: type) -> type:
    """``cls`` made again as declared: a ``Model`` with the same fields and their metadata."""
    namespace: dict[str, Any] = {"__annotations__": {}, "__module__": cls.__module__}
    for item in fields_of(cls):
        namespace["__annotations__"][item.name] = cls.__annotations__.get(item.name, "object")
        namespace[item.name] = field(
            default=item.default,
            default_factory=item.default_factory,
            metadata=item.metadata,
            compare=item.compare,
            repr=item.repr,
        )
    return type(Model)(cls.__name__, (Model,), namespace, frozen=True, kw_only=True)


def as_dataclass(cls: type) -> type:
    """``cls``'s fields as a frozen slotted dataclass (what the result types were before)."""
    namespace: dict[str, Any] = {"__annotations__": {}, "__module__": cls.__module__}
    for item in fields_of(cls):
        namespace["__annotations__"][item.name] = cls.__annotations__.get(item.name, "object")
        namespace[item.name] = dataclasses.field(
            default=dataclasses.MISSING if item.default is NODEFAULT else item.default,
            default_factory=(
                dataclasses.MISSING if item.default_factory is NODEFAULT else item.default_factory
            ),
            compare=item.compare,
            repr=item.repr,
            metadata=item.metadata,
            kw_only=True,
        )
    made = type(cls.__name__, (), namespace)
    return dataclasses.dataclass(frozen=True, slots=True)(made)


def as_struct(cls: type) -> type:
    """A bare frozen ``msgspec.Struct`` with ``cls``'s field names and defaults."""
    fields: list[tuple[str, type] | tuple[str, type, object]] = []
    for item in fields_of(cls):
        if item.default_factory is not NODEFAULT:
            fields.append((item.name, object, msgspec.field(default_factory=item.default_factory)))
        elif item.default is not NODEFAULT:
            fields.append((item.name, object, item.default))
        else:
            fields.append((item.name, object))
    return msgspec.defstruct(cls.__name__, fields, frozen=True, kw_only=True)


def median_ms(make: Callable[[type], type], classes: list[type], repeat: int) -> float:
    rounds = []
    for _ in range(repeat):
        start = time.perf_counter()
        for cls in classes:
            make(cls)
        rounds.append(time.perf_counter() - start)
    return statistics.median(rounds) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="rounds per way (median)")
    repeat = parser.parse_args().repeat
    import_s = import_package()
    classes = package_types()
    fields = sum(len(fields_of(cls)) for cls in classes)
    print(
        f"the package's imports of a single-trace analyze (typer, rich, jinja2 ... included): {import_s * 1000:.1f} ms"
    )
    print(f"{len(classes)} result types, {fields} fields, made again (median of {repeat}):")
    ways: list[tuple[str, Callable[[type], type]]] = [
        ("as declared (Model)", as_model),
        ("frozen slotted dataclass", as_dataclass),
        ("bare frozen msgspec.Struct", as_struct),
    ]
    declared = None
    for label, make in ways:
        ms = median_ms(make, classes, repeat)
        declared = ms if declared is None else declared
        print(f"  {label:36} {ms:7.1f} ms  ({ms / declared:.2f}x)")


if __name__ == "__main__":
    main()
