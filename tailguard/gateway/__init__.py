"""``tailguard gateway``: an OpenAI-compatible streaming reverse proxy that measures.

Every ``/v1/chat/completions`` and ``/v1/completions`` request it forwards
becomes one ``tailguard.inference.v1`` event (TTFT, every chunk gap, E2E,
tokens, status), published off the request path; experiment traffic is
assigned by layered hashing and follows ``tailguard.releases``.

- :mod:`.routing`: layers, experiments, arms; the deterministic assignment (pure);
- :mod:`.config`: the routing file (an experiments file with a ``routing:`` section);
- :mod:`.meter`: what one response looks like, chunk by chunk (pure);
- :mod:`.publisher`: bounded buffer + background confluent-kafka producer;
- :mod:`.releases`: follows ``tailguard.releases``, persists, audits;
- :mod:`.server`: the aiohttp proxy;
- :mod:`.upstream`: a simulated OpenAI-compatible upstream (tests, bench, demo).
"""
