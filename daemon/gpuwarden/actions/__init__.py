"""Executors: one module per step kind, each ``execute(intent, ctx) -> Outcome``."""
