"""tailguard: keep LLM serving inside its latency SLOs.

The import root joins three folders of the repository:

- ``tailguard.streams``  (``streams/``)  pure computation over event streams;
- ``tailguard.schemas``  (``schemas/``)  wire contracts, codecs, validation;
- ``tailguard.agents``   (``agents/``)   faust wiring: app, topics, tables, agents.

``tailguard.cli`` is the ``tailguard`` command; ``tailguard.simulator`` the
traffic simulator.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
