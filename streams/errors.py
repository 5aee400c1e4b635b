"""Errors raised by the pure stream computations.

::

    TailguardError (Exception)
    └── StreamsError (TailguardError, ValueError)
        ├── ConfigError          a ring or window configuration that cannot work
        └── CorruptStateError    bytes that do not restore to a state
"""

from tailguard.errors import TailguardError

__all__ = ["ConfigError", "CorruptStateError", "StreamsError"]


class StreamsError(TailguardError, ValueError):
    """Base class of errors from ``tailguard.streams``."""


class ConfigError(StreamsError):
    """A configuration value is out of range; the message names it and the valid range."""


class CorruptStateError(StreamsError):
    """Stored state bytes could not be decoded; the message names the key and the cause."""
