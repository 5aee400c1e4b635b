"""Errors of the gateway.

::

    TailguardError (Exception)
    └── GatewayError (TailguardError, RuntimeError)
        └── RoutingConfigError (GatewayError, ValueError)   a routing file that cannot work
"""

from tailguard.errors import TailguardError

__all__ = ["GatewayError", "RoutingConfigError"]


class GatewayError(TailguardError, RuntimeError):
    """Base class of errors from ``tailguard.gateway``."""


class RoutingConfigError(GatewayError, ValueError):
    """A routing configuration that cannot be used; the message says where and why."""
