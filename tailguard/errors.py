"""The root of tailguard's error tree.

::

    TailguardError (Exception)
    ├── tailguard.schemas.errors.SchemaError (TailguardError, ValueError)
    ├── tailguard.streams.errors.StreamsError (TailguardError, ValueError)
    └── tailguard.agents.errors.AgentError (TailguardError, RuntimeError)

Every message says what was wrong and what to do about it.
"""

__all__ = ["TailguardError"]


class TailguardError(Exception):
    """Base class of every error tailguard raises on purpose."""
