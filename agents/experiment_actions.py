"""The experiment guard's admin actions, over :class:`tailguard.agents.experiments.ExperimentsAPI`.

============================  ========  ==============================================
action                        role      what
============================  ========  ==============================================
``experiment.create``         operator  start guarding an experiment (a new generation
                                        of a stopped or rolled-back one)
``experiment.stop``           operator  stop guarding it: no more decisions
``release.rollback``          operator  publish a manual rollback (once per generation)
``experiment.get``            viewer    definition, status, per-arm counts, last decision
``experiment.list``           viewer    the experiments this worker knows of
============================  ========  ==============================================

Every action but ``experiment.list`` is *routed*: the admin agent forwards the
command to the partition of the internal admin topic that has the number of
the experiment's partition of ``tailguard.internal.experiments`` (both have
the partition count of ``tailguard.internal.series``, so faust assigns them to
the same worker). The handler therefore runs on the worker that owns the
experiment::

    tailguard admin experiment create … ─▶ admin agent ─▶ tailguard.internal.admin[p]
                                                               │ handler (owner of p)
                             ExperimentsAPI.create ◀───────────┘ waits ≤ 10 s
                                    │
            tailguard.internal.experiments[p] ─▶ guard agent (same worker): applies it
                                    │                 in order with the experiment's data,
                                    │                 publishes a rollback and waits for it
                                    ▼
                            ControlResult ─▶ the waiting handler ─▶ the one reply

- create / stop / rollback reply with what the guard did (``ok``) or why it
  refused, with the guard's code (``bad_args``, ``not_found``, ``conflict``).
  If the guard does not confirm within :data:`CONFIRM_S` seconds (a backlog
  of the experiment's events ahead of the command, a rebalance moving the
  partition away) the reply is ``failed`` and says so: the command is
  enqueued and may still apply — ``experiment get`` tells.
- get is answered from the owner's state at once (it is not queued behind the
  experiment's events).
- list runs on the worker that owns the admin topic and answers from what *it*
  knows: the experiments of its experiments files (every worker loads the
  same ones) and those whose state it holds. With several workers an
  experiment created through the admin plane that another worker owns is not
  listed; ``experiment get ID`` asks its owner.

Idempotency: the experiment commands carry the admin ``command_id``; the guard
applies a command id once and answers a re-delivery with the first result
(:mod:`tailguard.agents.experiments`), so a create re-run after a crash never
creates a second generation and a rollback is never published twice.
"""

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from faust.types import TP
from tailguard.agents.experiments import EXPERIMENTS, ControlResult, ExperimentsPlane
from tailguard.agents.settings import Settings
from tailguard.streams.errors import ConfigError
from tailguard.streams.experiment_def import ExperimentDef

from tailguard.admin.errors import CommandError
from tailguard.admin.keys import Role
from tailguard.admin.registry import ActionRegistry, Call

__all__ = ["CONFIRM_S", "ExperimentActions", "ResultWaiter", "register_experiment_actions"]

#: How long a create / stop / rollback waits for the owning worker's confirmation.
CONFIRM_S = 10.0
#: Keys of the definition the admin form takes beside ``experiment`` (the id).
_DEFINITION = "definition"


@dataclass
class ResultWaiter:
    """``command_id`` → the futures waiting for its :class:`ControlResult` (one event loop)."""

    waiting: dict[str, list[asyncio.Future[ControlResult]]] = field(default_factory=dict)

    async def sink(self, result: ControlResult) -> None:
        """The :meth:`ExperimentsAPI.on_result` sink: wake whoever waits for this command."""
        for future in self.waiting.pop(result.command_id, []):
            if not future.done():
                future.set_result(result)

    def expect(self, command_id: str) -> asyncio.Future[ControlResult]:
        """A future for ``command_id``'s result; register it *before* sending the command."""
        future: asyncio.Future[ControlResult] = asyncio.get_running_loop().create_future()
        self.waiting.setdefault(command_id, []).append(future)
        return future

    def forget(self, command_id: str, future: asyncio.Future[ControlResult]) -> None:
        held = self.waiting.get(command_id)
        if held is not None and future in held:
            held.remove(future)
            if not held:
                del self.waiting[command_id]


def _experiment_id(args: dict[str, Any]) -> str:
    value = args.get("experiment")
    if not isinstance(value, str) or not value:
        msg = "needs args.experiment (the experiment id, a non-empty string)"
        raise CommandError("bad_args", msg)
    return value


def _definition(call: Call, experiment: str) -> dict[str, Any]:
    """The definition mapping of a create: ``args.definition`` and/or the keys beside it."""
    given = call.args.get(_DEFINITION, {})
    if not isinstance(given, dict):
        msg = f"args.definition must be an object (an experiment definition), got {given!r}"
        raise CommandError("bad_args", msg)
    out = dict(given)
    out.update({k: v for k, v in call.args.items() if k not in ("experiment", _DEFINITION)})
    held = out.get("id", experiment)
    if held != experiment:
        msg = f"args.experiment is {experiment!r} but the definition's id is {held!r}"
        raise CommandError("bad_args", msg)
    out["id"] = experiment
    return out


@dataclass
class ExperimentActions:
    """The handlers; ``owned`` says whether this worker owns an internal experiments partition."""

    plane: ExperimentsPlane
    owned: Callable[[int], bool]
    worker: str
    waiter: ResultWaiter = field(default_factory=ResultWaiter)
    confirm_s: float = CONFIRM_S

    def route(self, args: dict[str, Any]) -> int:
        return int(self.plane.api.route(_experiment_id(args)))

    async def _confirmed(
        self, call: Call, experiment: str, send: Callable[[], Any]
    ) -> dict[str, Any]:
        """Send a command to the guard and wait for its result; the reply's ``result``."""
        future = self.waiter.expect(call.command_id)
        try:
            await send()
            try:
                result = await asyncio.wait_for(asyncio.shield(future), self.confirm_s)
            except TimeoutError:
                partition = self.plane.api.route(experiment)
                msg = (
                    f"{call.action} {experiment}: enqueued, but the worker owning the experiment "
                    f"(partition {partition} of {EXPERIMENTS}) did not confirm within "
                    f"{self.confirm_s:g} s (a backlog of its events, or a rebalance); it may "
                    f"still apply — check with `tailguard admin experiment get {experiment}`"
                )
                raise CommandError("failed", msg) from None
        finally:
            self.waiter.forget(call.command_id, future)
        if not result.ok:
            raise CommandError(result.code or "failed", result.detail)
        return {
            "experiment": experiment,
            **result.result,
            "detail": result.detail,
            "partition": call.partition,
            "worker": self.worker,
        }

    async def create(self, call: Call) -> dict[str, Any]:
        """``experiment`` and the definition: ``definition`` (an object) and/or its keys
        (``arms``, ``guardrails``, ``min_samples``, …) as arguments beside it."""
        experiment = _experiment_id(call.args)
        mapping = _definition(call, experiment)
        api = self.plane.api
        try:  # refused here at once, with the field at fault (the guard checks it again)
            defn = ExperimentDef.from_mapping(mapping)
        except ConfigError as exc:
            raise CommandError("bad_args", str(exc)) from None

        async def send() -> None:
            await api.create(
                mapping, command_id=call.command_id, actor=call.actor, ts_ms=call.ts_ms
            )

        out = await self._confirmed(call, experiment, send)
        out["definition"] = defn.to_mapping()
        return out

    async def stop(self, call: Call) -> dict[str, Any]:
        """``experiment``, optional ``reason``."""
        call.only("experiment", "reason")
        experiment = _experiment_id(call.args)
        reason = call.optional_str("reason", "") or ""

        async def send() -> None:
            await self.plane.api.stop(
                experiment,
                command_id=call.command_id,
                actor=call.actor,
                ts_ms=call.ts_ms,
                reason=reason,
            )

        return await self._confirmed(call, experiment, send)

    async def rollback(self, call: Call) -> dict[str, Any]:
        """``experiment``, optional ``reason`` and ``arm`` (default: every treatment)."""
        call.only("experiment", "reason", "arm")
        experiment = _experiment_id(call.args)
        reason = call.optional_str("reason", "") or ""
        arm = call.optional_str("arm")

        async def send() -> None:
            await self.plane.api.rollback(
                experiment,
                command_id=call.command_id,
                actor=call.actor,
                ts_ms=call.ts_ms,
                reason=reason,
                arm=arm or None,
            )

        return await self._confirmed(call, experiment, send)

    async def get(self, call: Call) -> dict[str, Any]:
        """``experiment``: answered by the worker owning it, from its current state."""
        call.only("experiment")
        experiment = _experiment_id(call.args)
        held = self.plane.api.get_local(experiment)
        if held is None:
            msg = (
                f"no experiment {experiment!r} on the worker owning its partition "
                f"({call.partition}): not created through the admin plane and not in the "
                "experiments files"
            )
            raise CommandError("not_found", msg)
        return {
            "experiment": experiment,
            **held,
            "partition": call.partition,
            "worker": self.worker,
        }

    async def list_(self, call: Call) -> dict[str, Any]:
        """No arguments: what this worker knows (see the module docstring)."""
        call.only()
        api = self.plane.api
        rows = []
        for experiment in api.list_local():
            partition = api.route(experiment)
            row: dict[str, Any] = {
                "experiment": experiment,
                "partition": partition,
                "in_experiments_file": experiment in self.plane.definitions,
                "status": None,
            }
            if self.owned(partition):
                held = api.get_local(experiment)
                if held is not None:
                    last = held.get("last_decision")
                    row.update(
                        status=held.get("status"),
                        generation=held.get("generation"),
                        last_decision=None if last is None else last.get("decision"),
                    )
            rows.append(row)
        return {
            "experiments": rows,
            "count": len(rows),
            "scope": (
                "the experiments files' experiments and those whose state this worker holds; "
                "status is shown for those whose partition this worker owns (others: "
                "`experiment get ID`)"
            ),
            "worker": self.worker,
        }


def register_experiment_actions(
    registry: ActionRegistry,
    plane: ExperimentsPlane,
    settings: Settings,
    *,
    app: Any = None,
    worker: str = "",
    confirm_s: float = CONFIRM_S,
) -> ExperimentActions:
    """Register the real handlers over the ``experiment.*`` / ``release.rollback`` stubs."""
    topic = settings.topic_prefix + EXPERIMENTS

    def owned(partition: int) -> bool:
        if app is None:
            return True
        return TP(topic, partition) in app.assignor.assigned_actives()

    actions = ExperimentActions(plane, owned, worker, confirm_s=confirm_s)
    plane.api.on_result(actions.waiter.sink)
    route = actions.route
    for name, handler, role, summary, routed in (
        ("experiment.create", actions.create, Role.operator, "start guarding an experiment", True),
        ("experiment.stop", actions.stop, Role.operator, "stop guarding an experiment", True),
        (
            "release.rollback",
            actions.rollback,
            Role.operator,
            "roll an experiment back by hand (once per generation)",
            True,
        ),
        (
            "experiment.get",
            actions.get,
            Role.viewer,
            "an experiment's state, arms and latest decision (answered by its owner)",
            True,
        ),
        (
            "experiment.list",
            actions.list_,
            Role.viewer,
            "the experiments this worker knows (files, and state it holds)",
            False,
        ),
    ):
        registry.register(
            name, handler, role=role, summary=summary, route=route if routed else None
        )
    return actions
