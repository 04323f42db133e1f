"""Notifications as the daemon wires them: per-rule timing over the config's defaults, and
what a stop and a restart during an open incident send (a real outbox in a journal file)."""

from __future__ import annotations

from pathlib import Path

from gpuwarden.config import Config
from gpuwarden.journal.journal import Journal
from gpuwarden.journal.schema import Access
from gpuwarden.model import Intent, Reason, RuleChange, Snapshot, Transition
from gpuwarden.notify.facts import timings
from gpuwarden.notify.grouping import Timing
from gpuwarden.notify.outbox import Outbox
from gpuwarden.notify.service import Notifications
from gpuwarden.playbook.schema import NotifyParams, Rule


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


# -- a stop and a restart during an open incident ----------------------------------------------

T0 = 1_773_457_080.0  # 2026-03-14 02:58 UTC


REPEAT = 3600.0


def _incident_fires(journal: Journal, told: Notifications) -> None:
    firing = RuleChange(
        Transition.FIRING, "squeeze", "gpu:0", T0, Reason.FOR_ELAPSED, "inc-1", where="GPU 0"
    )
    notify = Intent(
        id="inc-1/0",
        incident="inc-1",
        rule="squeeze",
        scope="gpu:0",
        step=0,
        kind="notify",
        label="notify",
        time=T0,
        reason=Reason.STEP_DUE,
        severity="critical",
        gpu=0,
        params=NotifyParams(targets=("oncall",)),
        where="GPU 0",
    )
    written = journal.record_all([firing, notify], T0)
    told.observe(written, Snapshot("node-1", T0, ()), (), T0)


def _outbox(path: Path) -> list[tuple[str, str, float]]:
    with Outbox.open_readonly(path) as outbox:
        return [(r.kind, r.title, r.next_attempt_at) for r in outbox.rows()]


def test_a_stop_sends_no_reminder_and_a_restart_keeps_the_reminder_times(tmp_path: Path) -> None:
    cfg = Config.model_validate(
        {
            "notify": {
                "group_wait": "0s",
                "group_interval": "1m",
                "repeat": REPEAT,
                "targets": {"oncall": {"urls": ["json://127.0.0.1:9/hook"]}},
            }
        }
    )
    path = tmp_path / "journal.db"

    def notifications() -> Notifications:
        return Notifications(cfg, path, host="gpu-node-07", background=False, access=Access.WRITE)

    with Journal(path) as journal:
        told = notifications()
        _incident_fires(journal, told)
        assert told.flush(T0) == 1  # the open message
        told.close(T0 + 1200)  # a stop 20 minutes in: nothing new to say
        assert [k for k, _t, _at in _outbox(path)] == ["open"]

        # Restarted 30 minutes in: the group is taken back as it was, nothing is said again.
        again = notifications()
        (found,) = journal.open_incidents()
        again.restore(found.incident, journal.timeline("inc-1"), T0 + 1800)
        assert again.flush(T0 + 1800) == 0
        assert again.flush(T0 + REPEAT - 1) == 0
        # The reminder is due an hour after the open message, as if nothing had stopped.
        assert again.flush(T0 + REPEAT) == 1
        kinds = _outbox(path)
        assert [k for k, _t, _at in kinds] == ["open", "reminder"]
        assert kinds[1][1].endswith("open 1h00m")
        again.close(T0 + REPEAT + 60)
    assert [k for k, _t, _at in _outbox(path)] == ["open", "reminder"]


def test_a_stop_in_quiet_hours_queues_the_message_for_when_they_end(tmp_path: Path) -> None:
    cfg = Config.model_validate(
        {
            "timezone": "UTC",
            "notify": {
                "group_wait": "5m",  # still held back by grouping when the daemon stops
                "targets": {
                    "oncall": {"urls": ["json://127.0.0.1:9/hook"], "quiet_hours": "00:00-07:00"}
                },
            },
        }
    )
    path = tmp_path / "journal.db"
    with Journal(path) as journal:
        told = Notifications(cfg, path, host="gpu-node-07", background=False)
        firing = RuleChange(
            Transition.FIRING, "warm", "gpu:0", T0, Reason.FOR_ELAPSED, "inc-2", where="GPU 0"
        )
        notify = Intent(
            id="inc-2/0",
            incident="inc-2",
            rule="warm",
            scope="gpu:0",
            step=0,
            kind="notify",
            label="notify",
            time=T0,
            reason=Reason.STEP_DUE,
            severity="warning",
            gpu=0,
            params=NotifyParams(targets=("oncall",)),
            where="GPU 0",
        )
        told.observe(journal.record_all([firing, notify], T0), Snapshot("node-1", T0, ()), (), T0)
        told.close(T0 + 60)  # 02:59 UTC: quiet until 07:00
    ((kind, _title, due),) = _outbox(path)
    assert kind == "open"
    assert due == T0 + 4 * 3600 + 2 * 60  # 07:00, not now
