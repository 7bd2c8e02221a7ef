"""What differs between the Python versions the project runs on (3.10 and later), in one place.

`enum.StrEnum` and `typing.Self` arrived in 3.11. On 3.10 StrEnum's fallback is the same idea, a
str subclass whose members compare, hash and format as their values, and Self comes from
typing_extensions (installed with torch).
"""

from __future__ import annotations

import sys

if sys.version_info >= (3, 11):
    from enum import StrEnum  # novermin: this branch runs on 3.11+ only
    from typing import Self  # novermin
else:
    from enum import Enum

    from typing_extensions import Self

    class StrEnum(str, Enum):
        """Members are strings: `Kind.A == "a"`, and `str(Kind.A)` and f-strings give "a"."""

        def __str__(self) -> str:
            return str(self.value)

        def __format__(self, spec: str) -> str:
            return format(str(self.value), spec)

__all__ = ["Self", "StrEnum"]
