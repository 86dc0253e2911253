"""Command-line values read without a pydantic validator per option, where typer would build one.

typer 0.2x turns each option's text into its Python value through a pydantic ``TypeAdapter`` that
it builds when the command runs, for every option, given or not: on `analyze` that imports
pydantic (~0.1 s) and builds 19 validators (~0.04 s), a fifth of a small trace's whole job. The
values our options take are plain (a path, a string, a number within bounds, a list of them), so
each command's options (:class:`QuickCommand`) read those themselves, giving exactly what typer's
validators give, and hand every other value (a number out of bounds, text that is not a plain
number, a path that cannot be read) to typer's own coercion, which words the error as before.
Where typer coerces no other way (older releases use click's types), nothing changes.

``tests/test_cli.py`` holds the two to the same values on every option of every command.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any, Final, get_args, get_origin

from typer.core import TyperCommand, TyperGroup

__all__ = ["QuickCommand", "QuickGroup", "quick_value"]


class _Typers:
    """The marker for a value this module leaves to typer."""


#: A value :func:`quick_value` leaves to typer's own coercion.
TYPERS: Final = _Typers()

#: Numbers read here; any other text (signs, exponents, ``inf``, underscores, spaces) is typer's.
_INT: Final = re.compile(r"0|[1-9][0-9]{0,17}")
_FLOAT: Final = re.compile(r"(?:0|[1-9][0-9]{0,14})(?:\.[0-9]{1,15})?")


def _number(kind: type[int] | type[float], value: Any, info: Any) -> Any:
    if getattr(info, "clamp", False):
        return TYPERS
    plain = type(value) is kind or (kind is float and type(value) is int)
    if not plain and not (type(value) is str and (_INT if kind is int else _FLOAT).fullmatch(value)):
        return TYPERS
    number = kind(value)
    if kind is float and not math.isfinite(number):
        return TYPERS
    low, high = getattr(info, "min", None), getattr(info, "max", None)
    if (low is not None and not number >= low) or (high is not None and not number <= high):
        return TYPERS  # typer's bounds message
    return number


def _plain_path(info: Any) -> bool:
    """Whether the option asks nothing of its path but, when it exists, that it be readable."""
    return (
        getattr(info, "path_type", None) is None
        and not getattr(info, "exists", True)
        and getattr(info, "file_okay", False)
        and getattr(info, "dir_okay", False)
        and not getattr(info, "writable", True)
        and not getattr(info, "resolve_path", True)
        and not getattr(info, "allow_dash", True)
    )


def _path(value: Any, info: Any) -> Any:
    if type(value) is str and value and "\0" not in value:
        path = Path(value)
    elif type(value) is type(Path()):
        path = value
    else:
        return TYPERS
    try:
        os.stat(path)
    except OSError:
        return path  # not there (yet): typer's path needs only exist when asked to
    if getattr(info, "readable", True) and not os.access(path, os.R_OK):
        return TYPERS  # typer's "is not readable" message
    return path


def _leaf(annotation: Any, info: Any, value: Any) -> Any:
    if getattr(info, "parser", None) is not None:
        return TYPERS
    if annotation is str:
        return value if type(value) is str else TYPERS
    if annotation is bool:
        return value if type(value) is bool else TYPERS
    if annotation is int or annotation is float:
        return _number(annotation, value, info)
    if annotation is Path and _plain_path(info):
        return _path(value, info)
    return TYPERS


def quick_value(annotation: Any, info: Any, value: Any, *, multiple: bool) -> Any:
    """The value typer's coercion gives ``value`` for an option of type ``annotation`` (without
    ``None``) and settings ``info``, or :data:`TYPERS` where it is not read here."""
    if value is None:
        return () if multiple else None
    if multiple and isinstance(value, str):
        return TYPERS
    if get_origin(annotation) is list:
        if not isinstance(value, (list, tuple)):
            return TYPERS
        (item,) = get_args(annotation)
        items = [_leaf(item, info, one) for one in value]
        return TYPERS if any(one is TYPERS for one in items) else items
    return _leaf(annotation, info, value)


class _Quick:
    """One option's coercion: :func:`quick_value`, else typer's own (built on first need)."""

    def __init__(self, descriptor: Any, build: Any) -> None:
        self._descriptor = descriptor
        self._build = build
        self._typers: Any = None

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        multiple = bool(param.multiple or param.nargs == -1)
        quick = quick_value(
            self._descriptor.annotation, self._descriptor.parameter_info, value, multiple=multiple
        )
        if quick is not TYPERS:
            return quick
        if self._typers is None:
            self._typers = self._build(self._descriptor)
        return self._typers.coerce(value, param=param, ctx=ctx)


def _builder() -> Any:
    try:
        from typer._coercion import build_runtime_param
    except ImportError:  # a typer that coerces through click's types: nothing to replace
        return None
    return build_runtime_param


def _quick_options(params: list[Any]) -> None:
    build = _builder()
    if build is None:
        return
    for param in params:
        if getattr(param, "_runtime_param", False) is None and hasattr(param, "type_descriptor"):
            param._runtime_param = _Quick(param.type_descriptor, build)


class _QuickOptions:
    """Options read as :func:`quick_value` says (mixed into typer's command and group classes)."""

    params: list[Any]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _quick_options(self.params)

    def get_help_option(self, ctx: Any) -> Any:
        """``--help``, made when first asked for, read the same way."""
        option = super().get_help_option(ctx)  # type: ignore[misc]
        _quick_options([option])
        return option


class QuickCommand(_QuickOptions, TyperCommand):
    """A typer command whose options read their values as :func:`quick_value` says."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        """The usage line's words, a required argument as its name (``SCRIPT``, as the help
        and the docs write it): typer 0.29 writes ``{SCRIPT}``, braces no shell or doc uses."""
        return [_REQUIRED.sub(r"\1\2", piece) for piece in super().collect_usage_pieces(ctx)]


_REQUIRED: Final = re.compile(r"\A\{([A-Z_]+)\}(\.\.\.)?\Z")


class QuickGroup(_QuickOptions, TyperGroup):
    """The typer group of the commands, its own options (``--version``) read the same way."""
