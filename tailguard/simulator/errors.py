"""Errors of the traffic simulator.

::

    TailguardError (Exception)
    ├── SimConfigError (TailguardError, ValueError)   a SimConfig/Incident/trace is invalid
    └── SimulatorError (TailguardError, RuntimeError) the simulator could not run
                                                       (broker unreachable, topic missing)

Every message says what was wrong and what to do about it.
"""

from tailguard.errors import TailguardError

__all__ = ["SimConfigError", "SimulatorError"]


class SimConfigError(TailguardError, ValueError):
    """A simulator configuration, incident spec or replay trace is invalid."""


class SimulatorError(TailguardError, RuntimeError):
    """The simulator could not run, e.g. the Kafka broker is unreachable."""
