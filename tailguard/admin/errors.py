"""Errors of the admin plane.

::

    TailguardError (Exception)
    └── AdminError (TailguardError, RuntimeError)
        ├── KeyFileError (AdminError, ValueError)      the keys file cannot be used
        ├── CommandError (AdminError, ValueError)      a command is refused: .code, .message
        ├── RegistryError (AdminError, ValueError)     an action cannot be registered
        └── NoReply (AdminError, TimeoutError)          the CLI got no reply in time

``CommandError.code`` is one of :data:`tailguard.admin.gate.CODES`; it becomes
``error.code`` of the ``tailguard.admin_reply.v1`` reply.
"""

from tailguard.errors import TailguardError

__all__ = ["AdminError", "CommandError", "KeyFileError", "NoReply", "RegistryError"]


class AdminError(TailguardError, RuntimeError):
    """Base class of errors from ``tailguard.admin``."""


class KeyFileError(AdminError, ValueError):
    """The admin keys file is missing, unreadable or wrong; the message says where."""


class CommandError(AdminError, ValueError):
    """A command is refused; ``code`` is machine-readable, ``message`` says what to do."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class RegistryError(AdminError, ValueError):
    """An action name, role or handler cannot be registered."""


class NoReply(AdminError, TimeoutError):
    """No reply to a command arrived within the CLI's timeout."""
