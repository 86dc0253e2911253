"""What the package's dataclasses cost to make at start-up, and what each plain way to make them
cheaper would win (issue 50: the cache of their generated methods is gone).

Python 3.11 makes each method a frozen slotted dataclass gets (``__init__``, ``__repr__``,
``__eq__``, ``__hash__``, ``__setattr__``, ``__delattr__``) by compiling its source text, at every
start. This imports what a single-trace ``analyze`` imports, then makes every dataclass of the
package again from its own fields, in one process, in four ways: as declared; without ``__eq__``
(and so without ``__hash__``); without ``__eq__`` and ``__repr__``; and as a frozen
``msgspec.Struct`` with the same fields (made in C; no method compiled). The time of the imports
themselves is printed first, for scale. Medians of ``--repeat`` rounds. Usage::

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

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

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


def package_dataclasses() -> list[type]:
    """Every dataclass the imports above made, once each."""
    found: dict[type, None] = {}
    for name, module in list(sys.modules.items()):
        if name.startswith("traceinsight"):
            for value in vars(module).values():
                if isinstance(value, type) and dataclasses.is_dataclass(value) and value.__module__ == name:
                    found[value] = None
    return list(found)


def as_dataclass(cls: type, *, eq: bool | None = None, repr_: bool | None = None) -> type:
    """``cls`` made again from its fields (types as written, defaults, flags), ``eq``/``repr``
    overridden when given."""
    params = cls.__dataclass_params__  # type: ignore[attr-defined]
    namespace: dict[str, object] = {"__annotations__": {}, "__module__": cls.__module__}
    for field in dataclasses.fields(cls):
        namespace["__annotations__"][field.name] = field.type  # type: ignore[index]
        namespace[field.name] = dataclasses.field(
            default=field.default,
            default_factory=field.default_factory,
            compare=field.compare,
            repr=field.repr,
            metadata=field.metadata,
            kw_only=field.kw_only,
        )
    made = type(cls.__name__, (), namespace)
    return dataclasses.dataclass(
        frozen=params.frozen,
        eq=params.eq if eq is None else eq,
        repr=params.repr if repr_ is None else repr_,
        slots="__slots__" in vars(cls),
    )(made)


def as_struct(cls: type) -> type:
    """A frozen ``msgspec.Struct`` with ``cls``'s field names and defaults (keyword-only, so that
    the defaults may come in any order)."""
    fields: list[tuple[str, type] | tuple[str, type, object]] = []
    for field in dataclasses.fields(cls):
        if field.default is not dataclasses.MISSING:
            fields.append((field.name, object, field.default))
        elif field.default_factory is not dataclasses.MISSING:
            fields.append((field.name, object, msgspec.field(default_factory=field.default_factory)))
        else:
            fields.append((field.name, object))
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
    classes = package_dataclasses()
    fields = sum(len(dataclasses.fields(cls)) for cls in classes)
    print(
        f"the package's imports of a single-trace analyze (typer, rich, jinja2 ... included): {import_s * 1000:.1f} ms"
    )
    print(f"{len(classes)} dataclasses, {fields} fields, made again (median of {repeat}):")
    ways: list[tuple[str, Callable[[type], type]]] = [
        ("as declared", as_dataclass),
        ("eq=False (no __eq__, no __hash__)", lambda cls: as_dataclass(cls, eq=False)),
        ("eq=False, repr=False", lambda cls: as_dataclass(cls, eq=False, repr_=False)),
        ("frozen msgspec.Struct", as_struct),
    ]
    declared = None
    for label, make in ways:
        ms = median_ms(make, classes, repeat)
        declared = ms if declared is None else declared
        print(f"  {label:36} {ms:7.1f} ms  ({ms / declared:.2f}x)")


if __name__ == "__main__":
    main()
