"""The admin action registry: action name → handler and the role it needs.

The admin agent dispatches every authenticated command through a registry;
anything a worker can be told to do is an entry here. Built-in actions (SLOs,
breaches, silences, keys, series snapshots) are registered by
:mod:`tailguard.agents.admin`; other modules add theirs the same way.

Registering an action (e.g. the experiment guard)::

    from tailguard.admin.registry import Call, CommandError

    async def create(call: Call) -> dict[str, Any]:
        experiment = call.require_str("experiment")        # bad_args if missing
        if experiment in engine.experiments:
            raise CommandError("conflict", f"experiment {experiment!r} already exists")
        ...                                                # act; may await
        return {"experiment": experiment, "state": "running"}   # → reply.result

    pipeline.admin.registry.register(
        "experiment.create", create, role="operator",
        summary="start guarding an experiment",
    )

- ``role``: ``viewer`` (queries), ``operator`` (acks, silences, experiments,
  rollbacks) or ``admin`` (SLOs, keys). The gate refuses a key below it with
  ``forbidden`` before the handler runs.
- The handler gets a :class:`Call` (the verified command, its arguments, actor,
  key and role, the worker's wall clock) and returns a JSON-able dict — the
  reply's ``result`` — or raises :class:`CommandError` with a code of
  :data:`tailguard.admin.gate.CODES` (``bad_args``, ``not_found``,
  ``conflict``, ``not_enabled``…). Any other exception becomes a ``failed``
  reply; it never stops the worker. Exactly one reply and one audit record
  are written per command whatever the handler does.
- ``route``: for an action that only the owner of some state can answer,
  ``route(args) -> partition`` names a partition of the internal admin query
  topic (co-partitioned with ``tailguard.internal.series``); the command is
  then forwarded and the handler runs on the worker that owns that partition
  (``call.partition`` is set). Without ``route`` the handler runs on the
  worker that owns the single admin partition.
- ``call.publish(key, value)`` writes a record to the compacted control topic
  and returns once this worker has applied it; every worker applies control
  records (:mod:`tailguard.agents.control`). Use it for state that every
  worker must see; ``value=None`` deletes the key.
- Handlers must be idempotent for one ``command_id``: a command re-delivered
  after a crash runs again (derive ids from ``call.command_id``).

Placeholders: ``experiment.create``, ``experiment.stop``, ``experiment.get``,
``experiment.list`` and ``release.rollback`` are registered as *stubs* that
refuse with ``not_enabled`` ("experiments are not enabled on this worker")
until a real handler is registered; registering over a stub needs no
``replace=True``. A worker registers the real ones
(:mod:`tailguard.agents.experiment_actions`, over the experiment guard's API);
the stubs remain for a registry built without the guard.
"""

import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from tailguard.admin.errors import CommandError, RegistryError
from tailguard.admin.keys import Role

__all__ = [
    "EXPERIMENT_STUBS",
    "Action",
    "ActionRegistry",
    "Call",
    "CommandError",
    "Handler",
    "Publisher",
]

_NAME = re.compile(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+")


class Publisher(Protocol):
    """Writes a control record and waits until this worker applied it."""

    async def __call__(self, key: str, value: Mapping[str, Any] | None) -> int: ...


@dataclass(slots=True)
class Call:
    """One authenticated, authorised command, as a handler sees it."""

    command_id: str
    action: str
    actor: str
    key_id: str
    role: Role
    args: dict[str, Any]
    ts_ms: int
    now_ms: int
    #: Partition of the internal query topic a routed action runs for (else None).
    partition: int | None = None
    #: The worker's services (built-in handlers use it; others may ignore it).
    worker: Any = None
    publisher: Publisher | None = field(default=None, repr=False)

    async def publish(self, key: str, value: Mapping[str, Any] | None) -> int:
        """Write ``key → value`` to the control topic; returns its offset once applied here."""
        if self.publisher is None:
            msg = "this worker has no control topic publisher"
            raise CommandError("failed", msg)
        return await self.publisher(key, value)

    # -- argument helpers: each raises CommandError("bad_args", …) with a precise message

    def _arg(self, name: str, kinds: tuple[type, ...], what: str, default: Any) -> Any:
        if name not in self.args:
            if default is _REQUIRED:
                raise CommandError("bad_args", f"{self.action} needs args.{name} ({what})")
            return default
        value = self.args[name]
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise CommandError(
                "bad_args", f"args.{name} must be {what}, got {type(value).__name__} {value!r}"
            )
        return value

    def require_str(self, name: str) -> str:
        value: str = self._arg(name, (str,), "a non-empty string", _REQUIRED)
        if not value:
            raise CommandError("bad_args", f"args.{name} must be a non-empty string")
        return value

    def optional_str(self, name: str, default: str | None = None) -> str | None:
        value: str | None = self._arg(name, (str,), "a string", default)
        return value

    def optional_number(self, name: str, default: float | None = None) -> float | None:
        value = self._arg(name, (int, float), "a number", default)
        return None if value is None else float(value)

    def optional_bool(self, name: str, default: bool = False) -> bool:
        value: bool = self._arg(name, (bool,), "true or false", default)
        return value

    def only(self, *names: str) -> None:
        """Refuse arguments the action does not know (a typo must not be silently ignored)."""
        unknown = sorted(set(self.args) - set(names))
        if unknown:
            allowed = ", ".join(names) or "none"
            raise CommandError(
                "bad_args", f"{self.action} does not take {unknown}; its arguments: {allowed}"
            )


_REQUIRED: Any = object()

Handler = Callable[[Call], Awaitable[dict[str, Any]]]


@dataclass(frozen=True, slots=True)
class Action:
    """One registered action."""

    name: str
    handler: Handler
    role: Role
    summary: str = ""
    route: Callable[[dict[str, Any]], int] | None = None
    #: A placeholder that refuses with ``not_enabled``; replaced without ``replace=True``.
    stub: bool = False

    def describe(self) -> dict[str, Any]:
        return {
            "action": self.name,
            "role": self.role.name,
            "summary": self.summary,
            "enabled": not self.stub,
            "routed": self.route is not None,
        }


class ActionRegistry:
    """Action name → :class:`Action`."""

    def __init__(self) -> None:
        self._actions: dict[str, Action] = {}

    def register(
        self,
        name: str,
        handler: Handler,
        *,
        role: str | Role,
        summary: str = "",
        route: Callable[[dict[str, Any]], int] | None = None,
        replace: bool = False,
        stub: bool = False,
    ) -> Action:
        """Add ``name`` (dotted lower-case, e.g. ``experiment.create``); see the module doc."""
        if not isinstance(name, str) or _NAME.fullmatch(name) is None:
            msg = f"action names are dotted lower-case words like 'slo.set', got {name!r}"
            raise RegistryError(msg)
        if not callable(handler):
            msg = f"handler of {name!r} must be an async callable, got {handler!r}"
            raise RegistryError(msg)
        try:
            needs = Role.parse(role, f"role of {name!r}")
        except ValueError as exc:
            raise RegistryError(str(exc)) from None
        held = self._actions.get(name)
        if held is not None and not held.stub and not replace:
            msg = f"action {name!r} is already registered; pass replace=True to override it"
            raise RegistryError(msg)
        action = Action(name, handler, needs, summary, route, stub)
        self._actions[name] = action
        return action

    def get(self, name: str) -> Action | None:
        return self._actions.get(name)

    def names(self) -> list[str]:
        return sorted(self._actions)

    def describe(self) -> list[dict[str, Any]]:
        return [self._actions[n].describe() for n in self.names()]

    def __contains__(self, name: object) -> bool:
        return name in self._actions


def _not_enabled(name: str) -> Handler:
    async def refuse(call: Call) -> dict[str, Any]:
        raise CommandError(
            "not_enabled",
            f"experiments are not enabled on this worker: no handler is registered for "
            f"{name!r} (the experiment guard registers it when it runs in the worker)",
        )

    return refuse


#: Placeholder actions of the experiment guard: name → (role, summary).
EXPERIMENT_STUBS: dict[str, tuple[str, str]] = {
    "experiment.create": ("operator", "start guarding an experiment (arms, guardrails)"),
    "experiment.stop": ("operator", "stop guarding an experiment"),
    "experiment.get": ("viewer", "an experiment's state, arms and latest decision"),
    "experiment.list": ("viewer", "the experiments this deployment guards"),
    "release.rollback": ("operator", "roll an experiment or gray release back by hand"),
}


def register_experiment_stubs(registry: ActionRegistry) -> None:
    """Register the not-enabled placeholders (skipping names that are already real)."""
    for name, (role, summary) in EXPERIMENT_STUBS.items():
        held = registry.get(name)
        if held is None or held.stub:
            registry.register(name, _not_enabled(name), role=role, summary=summary, stub=True)
