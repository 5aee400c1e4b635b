"""``tailguard admin …``: sign a command, send it to ``tailguard.admin``, print the reply.

::

    tailguard admin [--key-id K] [--keys-file F | --secret-env VAR] [--actor A]
                    [--timeout S] [--json] [--dry-run] COMMAND …

    slo list | slo get NAME | slo reset NAME
    slo set NAME [--target 0.995] [--threshold-ms 1200] [--ttft-ms …] [--itl-ms …] [--e2e-ms …]
    slo set --file slos.yaml                      add or replace SLOs from OpenSLO v1 YAML
    breach list [--service S] [--slo N] [--severity page|ticket]
    breach ack BREACH_ID [--note TEXT]
    silence add [--service S] [--model M] [--slo N] [--kind K] … --for 2h --reason TEXT
    silence remove SILENCE_ID | silence list [--all]
    snapshot --service S --model M [--variant V] [--tenant T] [--window 5m …]
    experiment create ID [--file experiments.yaml] [key=value …]
    experiment stop ID [reason=TEXT] | experiment get ID | experiment list
    rollback EXPERIMENT --reason TEXT [--arm ARM]
    key list | key rotate KEY_ID [--grace 300] | key revoke KEY_ID | key reload
    actions                                       what this deployment's workers accept
    send ACTION [key=value …] [--args JSON]       any action, arguments as given

The signing key: ``--keys-file`` (env ``TAILGUARD_ADMIN_KEYS``, the same
format as the worker's; only the chosen key's secret must be available) with
``--key-id`` (env ``TAILGUARD_ADMIN_KEY_ID``; optional when the file holds one
key), or ``--key-id`` with ``--secret-env NAME`` or ``TAILGUARD_ADMIN_SECRET``.

Exit status: 0 the command was accepted (the result is printed as JSON),
1 it was refused (``refused (code): message`` on stderr), 2 a local problem
(no broker, no key, no topic), 3 no reply within ``--timeout``.
"""

import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from tailguard.admin.client import build_command, send_command, signer_from
from tailguard.admin.errors import NoReply

__all__ = ["admin"]


def _emit(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=False))


def _run(ctx: click.Context, action: str, args: dict[str, Any]) -> None:
    o = ctx.obj
    signer = signer_from(
        key_id=o["key_id"], keys_file=o["keys_file"], secret_env=o["secret_env"], actor=o["actor"]
    )
    command = build_command(action, {k: v for k, v in args.items() if v is not None}, signer)
    if o["dry_run"]:
        _emit(command)
        return
    try:
        sent, reply = send_command(o["broker"], command, timeout_s=o["timeout"])
    except NoReply as exc:
        click.secho(f"error: {exc}", fg="red", err=True)
        sys.exit(3)
    if o["json"]:
        _emit(reply)
    elif reply.get("ok"):
        _emit(reply.get("result"))
    if not reply.get("ok"):
        error = reply.get("error") or {}
        click.secho(
            f"refused ({error.get('code')}): {error.get('message')}  "
            f"[command {command['command_id']}, offset {sent.offset}]",
            fg="red",
            err=True,
        )
        sys.exit(1)


def _pairs(items: tuple[str, ...]) -> dict[str, Any]:
    """``key=value`` pairs; a value that parses as JSON is used as such (numbers, lists…)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected key=value, got {item!r}")
        try:
            out[key] = json.loads(raw)
        except ValueError:
            out[key] = raw
    return out


@click.group()
@click.option(
    "--broker",
    default=lambda: os.environ.get("TAILGUARD_BROKER", "localhost:9092"),
    show_default="env TAILGUARD_BROKER or localhost:9092",
    help="Kafka bootstrap servers.",
)
@click.option("--key-id", envvar="TAILGUARD_ADMIN_KEY_ID", default=None, help="Signing key id.")
@click.option(
    "--keys-file",
    envvar="TAILGUARD_ADMIN_KEYS",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Keys file holding the signing key (env TAILGUARD_ADMIN_KEYS).",
)
@click.option("--secret-env", default=None, help="Read the key's secret from this env variable.")
@click.option("--actor", envvar="TAILGUARD_ADMIN_ACTOR", default=None, help="Who is acting.")
@click.option("--timeout", type=float, default=15.0, show_default=True, help="Seconds to wait.")
@click.option("--json", "as_json", is_flag=True, help="Print the whole reply record.")
@click.option("--dry-run", is_flag=True, help="Print the signed command; send nothing.")
@click.pass_context
def admin(
    ctx: click.Context,
    broker: str,
    key_id: str | None,
    keys_file: Path | None,
    secret_env: str | None,
    actor: str | None,
    timeout: float,
    as_json: bool,
    dry_run: bool,
) -> None:
    """Sign and send an admin command to the workers; print their reply."""
    ctx.obj = {
        "broker": broker,
        "key_id": key_id,
        "keys_file": str(keys_file) if keys_file else None,
        "secret_env": secret_env,
        "actor": actor,
        "timeout": timeout,
        "json": as_json,
        "dry_run": dry_run,
    }


@admin.command("send")
@click.argument("action")
@click.argument("pairs", nargs=-1)
@click.option("--args", "args_json", default=None, help="Arguments as one JSON object.")
@click.pass_context
def send(ctx: click.Context, action: str, pairs: tuple[str, ...], args_json: str | None) -> None:
    """Any ACTION with key=value arguments (or --args JSON)."""
    args: dict[str, Any] = {}
    if args_json:
        try:
            args = json.loads(args_json)
        except ValueError as exc:
            raise click.BadParameter(f"--args is not JSON: {exc}") from None
        if not isinstance(args, dict):
            raise click.BadParameter("--args must be a JSON object")
    args.update(_pairs(pairs))
    _run(ctx, action, args)


@admin.command("actions")
@click.pass_context
def actions(ctx: click.Context) -> None:
    """The actions the workers accept and the role each needs."""
    _run(ctx, "actions.list", {})


# --- slo ---------------------------------------------------------------------


@admin.group()
def slo() -> None:
    """SLO definitions in force (changes need the admin role)."""


@slo.command("list")
@click.pass_context
def slo_list(ctx: click.Context) -> None:
    _run(ctx, "slo.list", {})


@slo.command("get")
@click.argument("name")
@click.pass_context
def slo_get(ctx: click.Context, name: str) -> None:
    _run(ctx, "slo.get", {"name": name})


@slo.command("set")
@click.argument("name", required=False)
@click.option("--target", type=float, default=None, help="New objective, e.g. 0.995.")
@click.option("--threshold-ms", type=float, default=None, help="Threshold of the SLO's SLI.")
@click.option("--ttft-ms", type=float, default=None)
@click.option("--itl-ms", type=float, default=None)
@click.option("--e2e-ms", type=float, default=None)
@click.option("--display-name", default=None)
@click.option(
    "--file",
    "file_",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="OpenSLO v1 YAML: add or replace every SLO in it.",
)
@click.pass_context
def slo_set(
    ctx: click.Context,
    name: str | None,
    target: float | None,
    threshold_ms: float | None,
    ttft_ms: float | None,
    itl_ms: float | None,
    e2e_ms: float | None,
    display_name: str | None,
    file_: Path | None,
) -> None:
    """Change NAME's target or thresholds, or load SLOs from --file."""
    if file_ is not None:
        if name is not None:
            raise click.UsageError("give either NAME with changes or --file, not both")
        _run(ctx, "slo.set", {"openslo": file_.read_text(encoding="utf-8")})
        return
    if name is None:
        raise click.UsageError("name the SLO to change (or give --file)")
    _run(
        ctx,
        "slo.set",
        {
            "name": name,
            "target": target,
            "threshold_ms": threshold_ms,
            "ttft_ms": ttft_ms,
            "itl_ms": itl_ms,
            "e2e_ms": e2e_ms,
            "display_name": display_name,
        },
    )


@slo.command("reset")
@click.argument("name")
@click.pass_context
def slo_reset(ctx: click.Context, name: str) -> None:
    """Drop NAME's admin override (back to the worker's SLO file)."""
    _run(ctx, "slo.reset", {"name": name})


# --- breaches ----------------------------------------------------------------


@admin.group()
def breach() -> None:
    """Open breaches."""


@breach.command("list")
@click.option("--service", default=None)
@click.option("--slo", "slo_name", default=None)
@click.option("--severity", type=click.Choice(["page", "ticket"]), default=None)
@click.option("--kind", default=None)
@click.pass_context
def breach_list(
    ctx: click.Context,
    service: str | None,
    slo_name: str | None,
    severity: str | None,
    kind: str | None,
) -> None:
    _run(
        ctx,
        "breach.list",
        {"service": service, "slo": slo_name, "severity": severity, "kind": kind},
    )


@breach.command("ack")
@click.argument("breach_id")
@click.option("--note", default=None)
@click.pass_context
def breach_ack(ctx: click.Context, breach_id: str, note: str | None) -> None:
    _run(ctx, "breach.ack", {"breach_id": breach_id, "note": note})


# --- silences ----------------------------------------------------------------


@admin.group()
def silence() -> None:
    """Mute breach alerts (records are marked silenced: true) until expiry."""


@silence.command("add")
@click.option("--service", default=None)
@click.option("--model", default=None)
@click.option("--variant", default=None)
@click.option("--tenant", default=None)
@click.option("--slo", "slo_name", default=None)
@click.option("--kind", default=None, help="burn_rate, silent_degradation, …")
@click.option("--for", "duration", default=None, help="How long: 90s, 15m, 2h, 1d.")
@click.option("--until-ms", type=int, default=None, help="Or until this epoch ms.")
@click.option("--reason", required=True)
@click.option("--all", "all_", is_flag=True, help="Allow a silence that matches every breach.")
@click.pass_context
def silence_add(
    ctx: click.Context,
    service: str | None,
    model: str | None,
    variant: str | None,
    tenant: str | None,
    slo_name: str | None,
    kind: str | None,
    duration: str | None,
    until_ms: int | None,
    reason: str,
    all_: bool,
) -> None:
    _run(
        ctx,
        "silence.add",
        {
            "service": service,
            "model": model,
            "variant": variant,
            "tenant": tenant,
            "slo": slo_name,
            "kind": kind,
            "duration": duration,
            "until_ms": until_ms,
            "reason": reason,
            "all": True if all_ else None,
        },
    )


@silence.command("remove")
@click.argument("silence_id")
@click.pass_context
def silence_remove(ctx: click.Context, silence_id: str) -> None:
    _run(ctx, "silence.remove", {"silence_id": silence_id})


@silence.command("list")
@click.option("--all", "all_", is_flag=True, help="Include expired silences.")
@click.pass_context
def silence_list(ctx: click.Context, all_: bool) -> None:
    _run(ctx, "silence.list", {"all": True if all_ else None})


# --- series snapshot ---------------------------------------------------------


@admin.command("snapshot")
@click.option("--service", required=True)
@click.option("--model", required=True)
@click.option("--variant", default=None)
@click.option("--tenant", default=None)
@click.option("--window", "windows", multiple=True, help="Windows to show (repeatable).")
@click.pass_context
def snapshot(
    ctx: click.Context,
    service: str,
    model: str,
    variant: str | None,
    tenant: str | None,
    windows: tuple[str, ...],
) -> None:
    """Current SLIs and burn rates of one series (answered by the worker that owns it)."""
    _run(
        ctx,
        "series.snapshot",
        {
            "service": service,
            "model": model,
            "variant": variant,
            "tenant": tenant,
            "windows": list(windows) or None,
        },
    )


# --- experiments -------------------------------------------------------------


@admin.group()
def experiment() -> None:
    """A/B experiments and gray releases (when the experiment guard runs)."""


def _experiment(name: str, action: str, doc: str) -> None:
    @experiment.command(name, help=doc)
    @click.argument("experiment_id")
    @click.argument("pairs", nargs=-1)
    @click.pass_context
    def run(ctx: click.Context, experiment_id: str, pairs: tuple[str, ...]) -> None:
        _run(ctx, action, {"experiment": experiment_id, **_pairs(pairs)})


@experiment.command("create")
@click.argument("experiment_id")
@click.argument("pairs", nargs=-1)
@click.option(
    "--file",
    "file_",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="An experiments file (the worker's --experiments-file format): EXPERIMENT_ID's "
    "definition is taken from it; key=value pairs override its keys.",
)
@click.pass_context
def experiment_create(
    ctx: click.Context, experiment_id: str, pairs: tuple[str, ...], file_: Path | None
) -> None:
    """Start guarding EXPERIMENT_ID (a new generation of a stopped or rolled-back one).

    \b
    The definition (keys: tailguard/streams/experiment_def.py) comes from --file
    and/or key=value pairs, values as JSON, e.g.
      experiment create canary 'arms=["control","treatment"]' \\
          'guardrails={"ttft_p95":{"max_ratio":1.1}}' 'min_samples={"requests":500}'
    """
    definition: dict[str, Any] = {}
    if file_ is not None:
        from tailguard.schemas.experiments import ExperimentConfigError, load_experiments

        try:
            found = load_experiments(file_)
        except ExperimentConfigError as exc:
            raise click.BadParameter(str(exc), param_hint="--file") from None
        if experiment_id not in found:
            msg = f"{file_} defines {sorted(found)}, not {experiment_id!r}"
            raise click.BadParameter(msg, param_hint="--file")
        definition = found[experiment_id].to_mapping()
    definition.update(_pairs(pairs))
    _run(ctx, "experiment.create", {"experiment": experiment_id, "definition": definition})


_experiment("stop", "experiment.stop", "Stop guarding EXPERIMENT_ID (optional reason=TEXT).")
_experiment("get", "experiment.get", "State and latest decision of EXPERIMENT_ID.")


@experiment.command("list")
@click.pass_context
def experiment_list(ctx: click.Context) -> None:
    _run(ctx, "experiment.list", {})


@admin.command("rollback")
@click.argument("experiment_id")
@click.option("--reason", required=True)
@click.option(
    "--arm", default=None, help="The treatment arm to roll back (default: every treatment)."
)
@click.pass_context
def rollback(ctx: click.Context, experiment_id: str, reason: str, arm: str | None) -> None:
    """Roll an experiment or gray release back by hand."""
    _run(ctx, "release.rollback", {"experiment": experiment_id, "reason": reason, "arm": arm})


# --- keys --------------------------------------------------------------------


@admin.group()
def key() -> None:
    """Signing keys (admin role)."""


@key.command("list")
@click.pass_context
def key_list(ctx: click.Context) -> None:
    _run(ctx, "key.list", {})


@key.command("rotate")
@click.argument("key_id")
@click.option("--grace", type=float, default=300.0, show_default=True, help="Seconds left.")
@click.pass_context
def key_rotate(ctx: click.Context, key_id: str, grace: float) -> None:
    """Reload every worker's keys file, then retire KEY_ID after --grace seconds."""
    _run(ctx, "key.rotate", {"key_id": key_id, "grace_s": grace})


@key.command("revoke")
@click.argument("key_id")
@click.pass_context
def key_revoke(ctx: click.Context, key_id: str) -> None:
    _run(ctx, "key.revoke", {"key_id": key_id})


@key.command("reload")
@click.pass_context
def key_reload(ctx: click.Context) -> None:
    _run(ctx, "key.reload", {})
