"""Which series an SLO applies to: shell-style globs per series label.

A worker asks every SLO whether it applies to each series it meets for the
first time, and again whenever the SLOs change; with thousands of series
appearing at once that question is on the hot path. Each label's patterns are
therefore compiled once into the cheapest test that answers exactly as
:func:`fnmatch.fnmatchcase` would: always true for ``*``, a set lookup for
literal names, one regular expression for the rest.
"""

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from fnmatch import translate

from tailguard.streams.errors import ConfigError

__all__ = ["Selector"]

_LABELS = ("service", "model", "variant", "tenant")
_GLOB = re.compile(r"[*?\[]")


def _always(_value: str) -> bool:
    return True


def _compile(patterns: tuple[str, ...]) -> Callable[[str], object]:
    """A test whose truth is ``any(fnmatchcase(value, p) for p in patterns)``."""
    if "*" in patterns:
        return _always
    if not any(_GLOB.search(p) for p in patterns):
        return frozenset(patterns).__contains__
    return re.compile("|".join(f"(?:{translate(p)})" for p in patterns)).match


@dataclass(frozen=True, slots=True)
class Selector:
    """Which series an SLO applies to: shell-style globs (``*``, ``?``, ``[ab]``) per label.

    A series matches when each of its labels matches at least one pattern of
    that label. The default matches every series.
    """

    service: tuple[str, ...] = ("*",)
    model: tuple[str, ...] = ("*",)
    variant: tuple[str, ...] = ("*",)
    tenant: tuple[str, ...] = ("*",)
    #: One compiled test per label, in the order of :data:`_LABELS`.
    _tests: tuple[Callable[[str], object], ...] = field(
        init=False, repr=False, compare=False, hash=False
    )

    def __post_init__(self) -> None:
        for name in _LABELS:
            patterns = getattr(self, name)
            if not isinstance(patterns, tuple) or not patterns:
                msg = f"selector {name} must be a non-empty tuple of patterns, got {patterns!r}"
                raise ConfigError(msg)
            for pattern in patterns:
                if not isinstance(pattern, str) or not pattern:
                    msg = f"selector {name} pattern must be a non-empty string, got {pattern!r}"
                    raise ConfigError(msg)
        tests = tuple(_compile(getattr(self, name)) for name in _LABELS)
        object.__setattr__(self, "_tests", tests)

    def matches(
        self, service: str, model: str, variant: str = "default", tenant: str = "default"
    ) -> bool:
        s, m, v, t = self._tests
        return bool(s(service) and m(model) and v(variant) and t(tenant))
