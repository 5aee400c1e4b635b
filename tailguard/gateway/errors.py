"""Errors of the gateway.

::

    TailguardError (Exception)
    └── GatewayError (TailguardError, RuntimeError)
        ├── RoutingConfigError (GatewayError, ValueError)   a routing file that cannot work
        ├── UpstreamError (GatewayError, ConnectionError)   the upstream failed a request
        │   ├── UpstreamUnreachable   could not connect, or it closed before answering
        │   ├── UpstreamReset         it reset the connection before answering
        │   └── UpstreamBroken        its response broke off or does not parse
        └── ClientGone (GatewayError, ConnectionError)      the client left mid-response
"""

from tailguard.errors import TailguardError

__all__ = [
    "ClientGone",
    "GatewayError",
    "RoutingConfigError",
    "UpstreamBroken",
    "UpstreamError",
    "UpstreamReset",
    "UpstreamUnreachable",
]


class GatewayError(TailguardError, RuntimeError):
    """Base class of errors from ``tailguard.gateway``."""


class RoutingConfigError(GatewayError, ValueError):
    """A routing configuration that cannot be used; the message says where and why."""


class UpstreamError(GatewayError, ConnectionError):
    """The upstream failed one request; the message says how."""


class UpstreamUnreachable(UpstreamError):
    """No connection to the upstream, or it closed the connection before answering."""


class UpstreamReset(UpstreamError):
    """The upstream reset the connection before answering."""


class UpstreamBroken(UpstreamError):
    """The upstream's response broke off mid-body or is not HTTP/1.1."""


class ClientGone(GatewayError, ConnectionError):
    """The client's connection closed while its response was being relayed."""
