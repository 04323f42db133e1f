"""The pure rule engine: history, rule evaluation, incidents and escalation, victim planning."""
