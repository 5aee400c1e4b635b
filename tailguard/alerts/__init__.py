"""Subscribers of tailguard's output: ``tailguard alerts follow`` and ``tailguard alerts forward``.

::

    events.py        a breach / release record → AlertEvent; filters; release severities
    alertmanager.py  AlertEvent → Alertmanager webhook message (version 4), fingerprints
    delivery.py      what was delivered (a small state file) and the retry backoff
    webhook.py       the HTTP port: one POST, its outcome (and an in-memory double for tests)
    forward.py       the forwarder loop: consume, POST until 2xx, record, commit
    follow.py        the terminal view of breaches and decisions as they arrive
    cli.py           the ``tailguard alerts`` command group
"""
