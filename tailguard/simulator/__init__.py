"""Realistic LLM serving traffic for tailguard: ``tailguard.inference.v1`` events.

- :mod:`~tailguard.simulator.config`   :class:`SimConfig`, :class:`Incident`, fleet specs
- :mod:`~tailguard.simulator.arrivals` Poisson, bursty (MMPP) and trace-replay arrivals
- :mod:`~tailguard.simulator.model`    the latency model, :func:`generate`, :func:`generate_batches`
- :mod:`~tailguard.simulator.kv`       KV-cache snapshots per instance (:class:`KvTracker`)
- :mod:`~tailguard.simulator.producer` :func:`run`: events → Kafka (confluent-kafka)
- :mod:`~tailguard.simulator.cli`      the ``tailguard simulate`` command

Replay mode is meant for the Azure LLM inference trace 2023 (CC-BY 4.0; Patel,
Choukse, Zhang, Shah, Goiri, Maleki, Bianchini, "Splitwise: Efficient
generative LLM inference using phase splitting", ISCA 2024).

Example::

    from tailguard.simulator import Incident, SimConfig, Target, generate

    cfg = SimConfig(rate=50, duration_s=300, seed=7, incidents=[
        Incident("silent_collapse", 60, 240, Target(service="chat")),
    ])
    for event in generate(cfg):
        ...
"""

from tailguard.simulator.arrivals import Trace, load_trace
from tailguard.simulator.config import (
    ARRIVAL_KINDS,
    AZURE_TRACE_ATTRIBUTION,
    DEFAULT_SERVICES,
    INCIDENT_KINDS,
    Incident,
    ModelSpec,
    ServiceSpec,
    SimConfig,
    Target,
)
from tailguard.simulator.errors import SimConfigError, SimulatorError
from tailguard.simulator.kv import KvTracker
from tailguard.simulator.model import generate, generate_batches
from tailguard.simulator.producer import INFERENCE_TOPIC, Stats, run

__all__ = [
    "ARRIVAL_KINDS",
    "AZURE_TRACE_ATTRIBUTION",
    "DEFAULT_SERVICES",
    "INCIDENT_KINDS",
    "INFERENCE_TOPIC",
    "Incident",
    "KvTracker",
    "ModelSpec",
    "ServiceSpec",
    "SimConfig",
    "SimConfigError",
    "SimulatorError",
    "Stats",
    "Target",
    "Trace",
    "generate",
    "generate_batches",
    "load_trace",
    "run",
]
