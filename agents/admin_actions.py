"""Built-in admin actions: SLOs, breaches, silences, keys, series snapshots.

============================  ========  ==============================================
action                        role      what
============================  ========  ==============================================
``actions.list``              viewer    the registered actions, their roles
``slo.list``                  viewer    every SLO in force (overridden or not)
``slo.get``                   viewer    one SLO, with its base definition if overridden
``slo.set``                   admin     change a named SLO, or add/replace from OpenSLO
``slo.reset``                 admin     drop an override: the base definition returns
``breach.list``               viewer    open breaches (filters: service, slo, severity)
``breach.ack``                operator  acknowledge an open breach (note optional)
``silence.add``               operator  mute matching breaches until expiry
``silence.remove``            operator  end a silence
``silence.list``              viewer    active silences (``all: true``: expired too)
``series.snapshot``           viewer    current SLIs and burn rates of one series
``key.list``                  admin     key ids, roles, expiry — never secrets
``key.rotate``                admin     reload keys files; retire a key after a grace
``key.revoke``                admin     retire a key now
``key.reload``                admin     every worker re-reads its keys file
============================  ========  ==============================================

Arguments are in each handler's docstring; unknown arguments are refused
(``bad_args``) rather than ignored. SLO, silence, ack and key changes go
through the control topic (:mod:`tailguard.agents.control`).
"""

from collections.abc import Sequence
from typing import Any

from tailguard.agents.internal import partition_for, series_key
from tailguard.agents.settings import Settings
from tailguard.streams import WINDOWS
from tailguard.streams.breach import BreachState
from tailguard.streams.burn import evaluate
from tailguard.streams.burn_windows import window_counters

from tailguard.admin.errors import CommandError
from tailguard.admin.keys import Role, load_keyring
from tailguard.admin.registry import ActionRegistry, Call
from tailguard.admin.silences import Silence, silence_from_args
from tailguard.admin.slos import edit_slos, slo_to_dict

__all__ = ["register_builtin_actions"]

_SEP = "\x1f"


def _slo_summary(plane: Any, name: str) -> dict[str, Any]:
    spec = next(s for s in plane.book.specs if s.name == name)
    out = slo_to_dict(spec)
    out["overridden"] = name in plane.book.overrides
    return out


async def actions_list(call: Call) -> dict[str, Any]:
    """No arguments."""
    call.only()
    return {"actions": call.worker.registry.describe()}


async def slo_list(call: Call) -> dict[str, Any]:
    """No arguments."""
    call.only()
    plane = call.worker
    return {
        "slos": [
            {
                "name": s.name,
                "sli": s.sli,
                "target": s.target,
                "threshold_ms": s.threshold_ms,
                "ttft_ms": s.ttft_ms,
                "itl_ms": s.itl_ms,
                "e2e_ms": s.e2e_ms,
                "display_name": s.display_name,
                "overridden": s.name in plane.book.overrides,
                "source": s.source,
            }
            for s in plane.book.specs
        ],
        "version": plane.book.version,
    }


async def slo_get(call: Call) -> dict[str, Any]:
    """``name``."""
    call.only("name")
    name = call.require_str("name")
    plane = call.worker
    names = [s.name for s in plane.book.specs]
    if name not in names:
        raise CommandError("not_found", f"no SLO named {name!r}; known: {names}")
    out = {"slo": _slo_summary(plane, name)}
    base = next((s for s in plane.book.base if s.name == name), None)
    if name in plane.book.overrides and base is not None:
        out["base"] = slo_to_dict(base)
    return out


async def slo_set(call: Call) -> dict[str, Any]:
    """``name`` and any of ``target``, ``threshold_ms``, ``ttft_ms``, ``itl_ms``, ``e2e_ms``,
    ``display_name``; or ``openslo`` (an OpenSLO v1 YAML text) alone."""
    plane = call.worker
    changed = edit_slos(plane.book.specs, call.args, source=f"admin:{call.command_id}")
    overrides = {**plane.book.overrides, **{s.name: s for s in changed}}
    await _publish_slos(call, overrides)
    return {
        "changed": [_slo_summary(plane, s.name) for s in changed],
        "applies": "targets from the next evaluation (closed minute) of every series; "
        "thresholds to events folded from now on",
    }


async def _publish_slos(call: Call, overrides: dict[str, Any]) -> None:
    """All overrides in one control record: a multi-SLO change applies atomically."""
    value = {
        "overrides": {n: slo_to_dict(s) for n, s in sorted(overrides.items())},
        "command_id": call.command_id,
        "by": call.actor,
    }
    await call.publish("slos", value)


async def slo_reset(call: Call) -> dict[str, Any]:
    """``name``: drop the admin override of an SLO."""
    call.only("name")
    name = call.require_str("name")
    plane = call.worker
    if name not in plane.book.overrides:
        raise CommandError("not_found", f"SLO {name!r} has no admin override to reset")
    overrides = {n: s for n, s in plane.book.overrides.items() if n != name}
    await _publish_slos(call, overrides)
    known = [s.name for s in plane.book.specs]
    return {"reset": name, "slo": _slo_summary(plane, name) if name in known else None}


def _annotated(plane: Any, breach: dict[str, Any]) -> dict[str, Any]:
    ack = plane.state.acks.get(breach["breach_id"])
    breach["acked"] = None if ack is None else {k: ack.get(k) for k in ("by", "at_ms", "note")}
    return breach


async def breach_list(call: Call) -> dict[str, Any]:
    """Optional filters ``service``, ``slo``, ``severity``, ``kind``."""
    call.only("service", "slo", "severity", "kind")
    plane = call.worker
    filters = {k: call.optional_str(k) for k in ("service", "slo", "severity", "kind")}
    out = []
    for breach in plane.view.open():
        if filters["service"] and (breach.get("series") or {}).get("service") != filters["service"]:
            continue
        if any(filters[k] and breach.get(k) != filters[k] for k in ("slo", "severity", "kind")):
            continue
        out.append(_annotated(plane, breach))
    return {"open": out, "count": len(out)}


async def breach_ack(call: Call) -> dict[str, Any]:
    """``breach_id``, optional ``note``."""
    call.only("breach_id", "note")
    breach_id = call.require_str("breach_id")
    note = call.optional_str("note", "") or ""
    plane = call.worker
    breach = plane.view.get(breach_id)
    if breach is None:
        raise CommandError(
            "not_found",
            f"no open breach {breach_id!r} (resolved, or not published yet); "
            "see `tailguard admin breach list`",
        )
    ack = {
        "breach_id": breach_id,
        "by": call.actor,
        "at_ms": call.ts_ms,
        "note": note,
        "command_id": call.command_id,
    }
    await call.publish(f"ack/{breach_id}", ack)
    return {"acked": ack, "breach": _annotated(plane, breach)}


async def silence_add(call: Call) -> dict[str, Any]:
    """Matchers ``service``, ``model``, ``variant``, ``tenant``, ``slo``, ``kind`` (globs),
    ``duration`` (``2h``) or ``until_ms``, ``reason``; ``all: true`` to match everything."""
    silence = silence_from_args(
        call.args, actor=call.actor, command_id=call.command_id, now_ms=call.ts_ms
    )
    await call.publish(f"silence/{silence.silence_id}", silence.to_dict())
    return {"silence": silence.to_dict(), "expiry": "wall-clock time"}


async def silence_remove(call: Call) -> dict[str, Any]:
    """``silence_id``."""
    call.only("silence_id")
    silence_id = call.require_str("silence_id")
    plane = call.worker
    held: Silence | None = plane.state.silences.get(silence_id)
    if held is None:
        raise CommandError("not_found", f"no silence {silence_id!r}; see silence.list")
    await call.publish(f"silence/{silence_id}", None)
    return {"removed": held.to_dict()}


async def silence_list(call: Call) -> dict[str, Any]:
    """Optional ``all`` (true: expired ones too)."""
    call.only("all")
    plane = call.worker
    if call.optional_bool("all"):
        items = sorted(plane.state.silences.values(), key=lambda s: s.ends_ms)
    else:
        items = plane.state.active_silences(call.now_ms)
    return {"silences": [s.to_dict() for s in items]}


def _series_of(args: dict[str, Any]) -> tuple[str, str, str, str]:
    values = []
    for name, default in (
        ("service", None),
        ("model", None),
        ("variant", "default"),
        ("tenant", "default"),
    ):
        value = args.get(name, default)
        if not isinstance(value, str) or not value:
            raise CommandError("bad_args", f"series.snapshot needs args.{name} (a string)")
        values.append(value)
    return values[0], values[1], values[2], values[3]


def _snapshot_route(partitions: int) -> Any:
    def route(args: dict[str, Any]) -> int:
        return partition_for(series_key(*_series_of(args)), partitions)

    return route


async def series_snapshot(call: Call) -> dict[str, Any]:
    """``service``, ``model``, optional ``variant``, ``tenant``, ``windows`` (list, e.g. 1m,5m).

    Runs on the worker owning the series' partition (routed): current SLIs of
    each window (including the open minute), and per SLO the burn rate of
    every window the alert rules read, what the rules say now, and the open
    breach if any.
    """
    from tailguard.agents.sli import snapshot_payload

    call.only("service", "model", "variant", "tenant", "windows")
    plane = call.worker
    series = _series_of(call.args)
    key = series_key(*series)
    windows = call.args.get("windows", list(plane.settings.sli_windows))
    if (
        not isinstance(windows, list)
        or not windows
        or any(not isinstance(w, str) or w not in WINDOWS for w in windows)
    ):
        raise CommandError("bad_args", f"args.windows must be a list of {sorted(WINDOWS)}")
    state = plane.lookup_series(key)
    if state is None or state.default_end() is None:
        raise CommandError(
            "not_found",
            f"series {key!r} has no state on the worker owning partition {call.partition} "
            "(no events received for it, or its name is spelled differently)",
        )
    end = state.default_end()
    slis = {}
    for window in windows:
        payload = snapshot_payload(series, state, window, end, final=False, now_ms=call.now_ms)
        for gone in ("schema", "event_id", "ts_ms", "series", "final"):
            payload.pop(gone, None)
        slis[window] = payload
    engine = plane.engine
    counters = window_counters(state, engine.burn, end)
    slos = []
    states = getattr(engine, "_states", {})
    for spec in engine.specs_for(series):
        verdict = evaluate(spec, engine.burn, counters)
        skey = f"{key}{_SEP}{spec.name}".encode()
        raw = states.get(skey)
        if raw is None:
            raw = engine.state_table.get(skey)
        breach = None
        if raw is not None:
            bs = BreachState.from_bytes(raw, key=skey)
            if bs.is_open:
                breach = {
                    "breach_id": bs.breach_id,
                    "severity": bs.severity,
                    "opened_ms": bs.opened_ms,
                    "seq": bs.seq,
                }
        slos.append(
            {
                "slo": spec.name,
                "sli": spec.sli,
                "target": spec.target,
                "threshold_ms": spec.threshold_ms,
                "burn_rates": dict(verdict.burn_rates),
                "sli_values": dict(verdict.sli),
                "events": dict(verdict.events),
                "severity_now": verdict.severity,
                "firing": [f.rule.name for f in verdict.firing],
                "gated": [f.rule.name for f in verdict.gated],
                "budget_remaining": verdict.budget_remaining,
                "open_breach": breach,
            }
        )
    thresholds = state.thresholds
    return {
        "series": dict(zip(("service", "model", "variant", "tenant"), series, strict=True)),
        "partition": call.partition,
        "watermark_ms": state.watermark_ms,
        "window_end_ms": end,
        "thresholds": {
            "ttft_ms": thresholds.ttft_ms,
            "itl_ms": thresholds.itl_ms,
            "e2e_ms": thresholds.e2e_ms,
        },
        "windows": slis,
        "slos": slos,
        "worker": plane.worker,
    }


async def key_list(call: Call) -> dict[str, Any]:
    """No arguments."""
    call.only()
    return {"keys": call.worker.keyring.describe(call.now_ms)}


def _reloaded(call: Call) -> Any:
    plane = call.worker
    path = plane.settings.admin_keys_file
    if path is None:
        raise CommandError("not_enabled", "this worker has no admin keys file to reload")
    fresh = load_keyring(path)  # KeyFileError → "failed" with the file's problem
    plane.keyring = plane.keyring.with_keys_of(fresh)
    return plane.keyring


async def key_rotate(call: Call) -> dict[str, Any]:
    """``key_id``, optional ``grace_s`` (default 300): reload every worker's keys file, then
    retire ``key_id`` after the grace period. The replacement key (same role or higher)
    must already be in the keys file."""
    call.only("key_id", "grace_s")
    key_id = call.require_str("key_id")
    grace = call.optional_number("grace_s", 300.0)
    if grace is None or not 0 <= grace <= 7 * 86_400:
        raise CommandError("bad_args", "args.grace_s must be between 0 and 604800 seconds")
    keyring = _reloaded(call)
    old = keyring.get(key_id)
    if old is None:
        raise CommandError("not_found", f"no key {key_id!r} in the keys file")
    others = [
        k
        for k in keyring.all()
        if k.key_id != key_id and k.role >= old.role and k.usable_at(call.now_ms) is None
    ]
    if not others:
        raise CommandError(
            "conflict",
            f"no other usable key with role {old.role.name} or higher: add the replacement key "
            "to every worker's keys file first, then rotate",
        )
    await call.publish("keys/reload", {"at_ms": call.ts_ms, "command_id": call.command_id})
    retired_ms = call.ts_ms + int(grace * 1000)
    await call.publish(
        f"key/{key_id}",
        {"retired_ms": retired_ms, "by": call.actor, "command_id": call.command_id},
    )
    return {
        "retired": key_id,
        "retired_ms": retired_ms,
        "replacements": [k.key_id for k in others],
        "keys": call.worker.keyring.describe(call.now_ms),
    }


async def key_revoke(call: Call) -> dict[str, Any]:
    """``key_id``: refuse it from now on (its id is never usable again)."""
    call.only("key_id")
    key_id = call.require_str("key_id")
    plane = call.worker
    if plane.keyring.get(key_id) is None:
        raise CommandError("not_found", f"no key {key_id!r} in the keys file")
    await call.publish(
        f"key/{key_id}",
        {"retired_ms": call.ts_ms, "by": call.actor, "command_id": call.command_id},
    )
    return {"revoked": key_id, "keys": plane.keyring.describe(call.now_ms)}


async def key_reload(call: Call) -> dict[str, Any]:
    """No arguments: every worker re-reads its keys file."""
    call.only()
    _reloaded(call)
    await call.publish("keys/reload", {"at_ms": call.ts_ms, "command_id": call.command_id})
    return {"keys": call.worker.keyring.describe(call.now_ms)}


_BUILTIN: Sequence[tuple[str, Any, Role, str]] = (
    ("actions.list", actions_list, Role.viewer, "the registered actions and their roles"),
    ("slo.list", slo_list, Role.viewer, "every SLO in force"),
    ("slo.get", slo_get, Role.viewer, "one SLO (and its base definition if overridden)"),
    ("slo.set", slo_set, Role.admin, "change an SLO, or add/replace SLOs from OpenSLO YAML"),
    ("slo.reset", slo_reset, Role.admin, "drop an SLO's admin override"),
    ("breach.list", breach_list, Role.viewer, "open breaches"),
    ("breach.ack", breach_ack, Role.operator, "acknowledge an open breach"),
    ("silence.add", silence_add, Role.operator, "mute matching breaches until expiry"),
    ("silence.remove", silence_remove, Role.operator, "end a silence"),
    ("silence.list", silence_list, Role.viewer, "active silences"),
    ("key.list", key_list, Role.admin, "key ids, roles, expiry (never secrets)"),
    ("key.rotate", key_rotate, Role.admin, "reload keys files; retire a key after a grace"),
    ("key.revoke", key_revoke, Role.admin, "retire a key now"),
    ("key.reload", key_reload, Role.admin, "every worker re-reads its keys file"),
)


def register_builtin_actions(registry: ActionRegistry, settings: Settings) -> None:
    for name, handler, role, summary in _BUILTIN:
        registry.register(name, handler, role=role, summary=summary)
    registry.register(
        "series.snapshot",
        series_snapshot,
        role=Role.viewer,
        summary="current SLIs and burn rates of one series (answered by its owner)",
        route=_snapshot_route(settings.partitions),
    )
