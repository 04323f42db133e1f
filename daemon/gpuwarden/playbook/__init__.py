"""Playbooks: the rule language on-call staff write, its fields, and its expression compiler."""
