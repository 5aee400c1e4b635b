"""Experiment definitions from YAML → :class:`~tailguard.streams.experiment_def.ExperimentDef`.

A file holds one list of experiments (more files: more ``--experiments-file``)::

    apiVersion: tailguard/v1
    kind: Experiments
    experiments:
      - id: canary-prompt-v2
        unit: unit_id
        arms: [{name: control, weight: 0.5}, {name: treatment, weight: 0.5}]
        guardrails:
          ttft_p95: {max_ratio: 1.10}
          success_rate: {min: 0.992}
        min_samples: {units: 200, requests: 1000, sessions: 200}

The keys of one experiment are documented in
:mod:`tailguard.streams.experiment_def`; ``infra/experiments/canary.yaml`` is a
complete example. Every error is an :class:`ExperimentConfigError` whose
message starts with ``<file>:<line>:`` (the line of the experiment at fault).
"""

from os import PathLike
from pathlib import Path
from typing import Any

import yaml
from tailguard.schemas.errors import SchemaError
from tailguard.streams.errors import ConfigError
from tailguard.streams.experiment_def import ExperimentDef

__all__ = ["ExperimentConfigError", "load_experiments", "parse_experiments"]


class ExperimentConfigError(SchemaError):
    """An experiment file that cannot be used; the message starts with ``file:line:``.

    ::

        TailguardError (Exception)
        └── SchemaError (TailguardError, ValueError)
            └── ExperimentConfigError
    """


def load_experiments(path: str | PathLike[str]) -> dict[str, ExperimentDef]:
    """Every experiment of a YAML file, by id."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        msg = f"{p}:0: cannot read the experiments file: {exc.strerror or exc}"
        raise ExperimentConfigError(msg) from exc
    return parse_experiments(text, str(p))


def parse_experiments(text: str, name: str = "<string>") -> dict[str, ExperimentDef]:
    """Every experiment of YAML ``text`` (``name`` prefixes the error messages)."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 0
        msg = f"{name}:{line}: not valid YAML: {getattr(exc, 'problem', None) or exc}"
        raise ExperimentConfigError(msg) from exc
    if not isinstance(data, dict) or not isinstance(data.get("experiments"), list):
        msg = f"{name}:1: expected a mapping with an 'experiments' list"
        raise ExperimentConfigError(msg)
    lines = [1] * len(data["experiments"])
    if isinstance(root, yaml.MappingNode):
        for key, value in root.value:
            if key.value == "experiments" and isinstance(value, yaml.SequenceNode):
                lines = [item.start_mark.line + 1 for item in value.value]
    out: dict[str, ExperimentDef] = {}
    for i, item in enumerate(data["experiments"]):
        try:
            defn = ExperimentDef.from_mapping(item)
        except ConfigError as exc:
            msg = f"{name}:{lines[i]}: {exc}"
            raise ExperimentConfigError(msg) from exc
        if defn.id in out:
            msg = f"{name}:{lines[i]}: experiment id {defn.id!r} is defined twice"
            raise ExperimentConfigError(msg)
        out[defn.id] = defn
    return out
