"""Bursting to cloud GPUs: capped, tagged, idempotent launches, and a reaper that ends them.

``tags`` and ``plan`` are pure (what to tag, what the caps allow, what to reap); ``store`` keeps
the instances gpuwarden launched in the journal file; ``ec2`` is the thin adapter over boto3
(imported only when a profile is used); ``service`` puts them together for the ``provision``
executor, the reaper and ``gpuwarden cloud``.
"""
