"""What Python 3.10 lacks that the package uses (``requires-python`` is 3.10): one place, so the
rest imports it from here and reads as 3.11 code."""

from __future__ import annotations

import sys
from enum import Enum
from typing import Any

__all__ = ["StrEnum"]

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover - run by the 3.10 check in .ci/run

    class StrEnum(str, Enum):
        """:class:`enum.StrEnum` of Python 3.11: members are their values as strings (``str()``
        and ``format()`` give the value, not ``Class.NAME``); ``auto()`` gives the lowered name."""

        def __str__(self) -> str:
            return str.__str__(self)

        def __format__(self, spec: str) -> str:
            return str.__format__(str(self), spec)

        @staticmethod
        def _generate_next_value_(name: str, start: int, count: int, last_values: list[Any]) -> str:
            return name.lower()
