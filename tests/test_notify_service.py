"""Per-rule notification timing over the config's defaults."""

from __future__ import annotations

from gpuwarden.config import Config
from gpuwarden.notify.facts import timings
from gpuwarden.notify.grouping import Timing
from gpuwarden.playbook.schema import Rule


def test_a_rule_may_override_the_grouping_of_its_messages() -> None:
    cfg = Config.model_validate(
        {"notify": {"group_wait": "20s", "group_interval": "2m", "repeat": "30m"}}
    )
    rules = [
        Rule.model_validate({"name": "fast", "when": "true", "group_wait": 0, "repeat": "10m"}),
        Rule.model_validate({"name": "plain", "when": "true"}),
    ]
    timing = timings(cfg, rules)
    assert timing("fast") == Timing(group_wait=0.0, group_interval=120.0, repeat=600.0)
    assert timing("plain") == Timing(group_wait=20.0, group_interval=120.0, repeat=1800.0)
    assert timing("unknown") == timing("plain")
