"""Errors of the alert subscribers.

::

    TailguardError (Exception)
    ├── AlertsConfigError (TailguardError, ValueError)   a bad option: webhook URL, header,
    │                                                     backoff, state file path
    ├── BadEvent (TailguardError, ValueError)            a record that is not a breach or
    │                                                     release event (skipped, counted)
    └── DeliveryStateError (TailguardError, OSError)     the delivery state file cannot be
                                                          read or written

Every message is one line that says what was wrong and what to do about it.
"""

from tailguard.errors import TailguardError

__all__ = ["AlertsConfigError", "BadEvent", "DeliveryStateError"]


class AlertsConfigError(TailguardError, ValueError):
    """An option of ``tailguard alerts`` is invalid."""


class BadEvent(TailguardError, ValueError):
    """A record of the breaches or releases topic is not a valid event."""


class DeliveryStateError(TailguardError, OSError):
    """The forwarder's delivery state file cannot be read or written."""
