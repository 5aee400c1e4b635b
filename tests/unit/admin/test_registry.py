"""The action registry: roles, stubs that refuse precisely, argument helpers."""

import asyncio
from typing import Any

import pytest

from tailguard.admin.errors import CommandError, RegistryError
from tailguard.admin.keys import Role
from tailguard.admin.registry import ActionRegistry, Call, register_experiment_stubs


async def _ok(call: Call) -> dict[str, Any]:
    return {"ok": True}


def _call(action: str = "x.y", **args: Any) -> Call:
    return Call(
        command_id="c",
        action=action,
        actor="a",
        key_id="k",
        role=Role.admin,
        args=args,
        ts_ms=0,
        now_ms=0,
    )


def test_actions_register_with_a_role() -> None:
    registry = ActionRegistry()
    action = registry.register("experiment.create", _ok, role="operator", summary="s")
    assert registry.get("experiment.create") is action and action.role is Role.operator
    assert registry.describe() == [
        {
            "action": "experiment.create",
            "role": "operator",
            "summary": "s",
            "enabled": True,
            "routed": False,
        }
    ]


@pytest.mark.parametrize("name", ["Slo.Set", "slo", "slo set", "", "slo."])
def test_action_names_are_dotted_lower_case(name: str) -> None:
    with pytest.raises(RegistryError):
        ActionRegistry().register(name, _ok, role="viewer")


def test_an_unknown_role_is_refused() -> None:
    with pytest.raises(RegistryError, match="viewer, operator, admin"):
        ActionRegistry().register("a.b", _ok, role="root")


def test_registering_twice_needs_replace() -> None:
    registry = ActionRegistry()
    registry.register("a.b", _ok, role="viewer")
    with pytest.raises(RegistryError, match="replace=True"):
        registry.register("a.b", _ok, role="viewer")
    registry.register("a.b", _ok, role="admin", replace=True)
    assert registry.get("a.b").role is Role.admin  # type: ignore[union-attr]


def test_experiment_stubs_refuse_until_a_handler_is_registered() -> None:
    registry = ActionRegistry()
    register_experiment_stubs(registry)
    stub = registry.get("experiment.create")
    assert stub is not None and stub.stub and stub.role is Role.operator
    with pytest.raises(CommandError) as caught:
        asyncio.run(stub.handler(_call("experiment.create")))
    assert caught.value.code == "not_enabled"
    assert "experiments are not enabled on this worker" in caught.value.message
    registry.register("experiment.create", _ok, role="operator")  # over a stub: no replace
    assert not registry.get("experiment.create").stub  # type: ignore[union-attr]
    register_experiment_stubs(registry)  # does not put the stub back
    assert not registry.get("experiment.create").stub  # type: ignore[union-attr]
    assert registry.get("release.rollback").role is Role.operator  # type: ignore[union-attr]
    assert registry.get("experiment.get").role is Role.viewer  # type: ignore[union-attr]


def test_argument_helpers_refuse_precisely() -> None:
    call = _call(name="ttft", n=3, flag=True)
    assert call.require_str("name") == "ttft"
    assert call.optional_number("n") == 3.0
    assert call.optional_bool("flag") is True
    for probe, needle in (
        (lambda: call.require_str("missing"), "needs args.missing"),
        (lambda: call.require_str("n"), "must be a non-empty string"),
        (lambda: call.optional_number("flag"), "must be a number"),
        (lambda: call.only("name"), "does not take ['flag', 'n']"),
    ):
        with pytest.raises(CommandError, match=needle.replace("[", r"\[").replace("]", r"\]")):
            probe()
