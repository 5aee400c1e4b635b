"""The admin plane's pure parts, shared by the worker and the CLI (no faust, no Kafka).

- :mod:`.keys`: keys files, roles (viewer < operator < admin), retirements;
- :mod:`.gate`: parse → signature → freshness, refusal codes, the replay window;
- :mod:`.registry`: action name → handler and role; the experiment stubs;
- :mod:`.slos`, :mod:`.silences`: what ``slo set`` and ``silence add`` mean;
- :mod:`.records`: reply and audit payloads (nothing secret in them);
- :mod:`.client`, :mod:`.cli`: ``tailguard admin …``.

Signing itself (canonical JSON, HMAC-SHA256) is part of the wire contract:
:mod:`tailguard.schemas.signing`. The faust wiring is
:mod:`tailguard.agents.admin` and :mod:`tailguard.agents.control`.
"""
