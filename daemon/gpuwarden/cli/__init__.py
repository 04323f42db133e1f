"""The ``gpuwarden`` command line: one module per command family.

``main`` builds the parser and dispatches; ``common`` holds what every command needs (the
config, the playbook paths, the state directory). The families: ``status`` (status, record),
``check`` (check, drill, schema), ``run`` (the daemon and its start-up self-check),
``incidents`` (incidents, incident, ack, reset-breaker), ``notify`` (notify-test, outbox),
``cloud`` (cloud, cloud reap) and ``doctor``. Their views: ``status_view`` and ``inventory``
here, ``journal.view`` for incidents. No lower layer imports this package.
"""
