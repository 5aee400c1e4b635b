"""Errors of the faust wiring.

::

    TailguardError (Exception)
    └── AgentError (TailguardError, RuntimeError)
        └── SettingsError (AgentError, ValueError)   a worker setting that cannot work
"""

from tailguard.errors import TailguardError

__all__ = ["AgentError", "SettingsError"]


class AgentError(TailguardError, RuntimeError):
    """Base class of errors from ``tailguard.agents``."""


class SettingsError(AgentError, ValueError):
    """A worker setting is invalid; the message names it and the valid values."""
