"""Owner messages: the owner of a process a step acted on is told what happened, why and how
to avoid it — through an owner target's table (user → apprise URL) or by mail to
USER@domain — and the ``${user}``/``${pid}``/``${job}``/``${gpu}`` placeholders of notify
messages. End to end: a real daemon acts on real processes of real users and real local
receivers get the messages."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwarden import config as config_mod
from gpuwarden.errors import InputError
from gpuwarden.model import Intent, Outcome, Reason, RuleChange, Target, TargetResult, Transition
from gpuwarden.notify.notifier import Notifier
from gpuwarden.notify.routing import SecretError, owner_urls, split_recipient
from gpuwarden.playbook import loader
from gpuwarden.playbook.schema import NotifyParams
from tests.notify_receivers import JsonReceiver, SmtpReceiver
from tests.system_users import User, run_as

ROOT = Path(__file__).resolve().parent.parent


def owner_config(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "gpuwarden.yaml"
    path.write_text(
        "host: demo-node\nprotected: {root: false, users: []}\nnotify:\n  targets:\n"
        "    oncall: {urls: [{env: TEST_ONCALL_URL}]}\n" + body
    )
    return path


# -- the config and the routing ---------------------------------------------------------------


def test_an_owner_target_reaches_listed_users_and_mails_the_rest(tmp_path: Path) -> None:
    cfg = config_mod.load(
        owner_config(
            tmp_path,
            "    owner:\n"
            "      owners: {bob: 'json://127.0.0.1:9/bob', carol: {env: CAROL_HOOK}}\n"
            "      owner_mail: {url: 'mailtos://gw:pw@smtp.example.org?from=gw@example.org',"
            " domain: example.org}\n",
        )
    )
    spec = cfg.notify.targets["owner"]
    assert spec.for_owners
    assert split_recipient(cfg.notify, "owner:bob") == ("owner", "bob")
    assert split_recipient(cfg.notify, "oncall") is None
    env = {"CAROL_HOOK": "json://127.0.0.1:9/carol"}
    assert owner_urls(spec, "bob", env, Path.read_text) == ["json://127.0.0.1:9/bob"]
    assert owner_urls(spec, "carol", env, Path.read_text) == ["json://127.0.0.1:9/carol"]
    assert owner_urls(spec, "dave", env, Path.read_text) == [
        "mailtos://gw:pw@smtp.example.org?from=gw@example.org&to=dave@example.org"
    ]
    with pytest.raises(SecretError, match="environment variable CAROL_HOOK is not set"):
        owner_urls(spec, "carol", {}, Path.read_text)
    assert not spec.reaches(None)
    assert not spec.reaches("not a user")  # never an address built from odd characters


def test_an_owner_target_without_mail_reaches_only_its_table(tmp_path: Path) -> None:
    cfg = config_mod.load(owner_config(tmp_path, "    owner: {owners: {bob: 'json://h/b'}}\n"))
    spec = cfg.notify.targets["owner"]
    assert spec.reaches("bob")
    assert not spec.reaches("dave")
    with pytest.raises(SecretError, match="no address for user 'dave'"):
        owner_urls(spec, "dave", {}, Path.read_text)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "    owner: {owners: {bob: 'json://h/b'}, urls: ['json://h/x']}\n",
            "an owner target (owners, owner_mail) tells each process's owner: it takes no urls",
        ),
        (
            "    owner: {owner_mail: {url: 'json://h/x', domain: example.org}}\n",
            "an owner mail url starts mailto:// or mailtos://, not json://",
        ),
        (
            "    owner: {owner_mail: {url: 'mailto://h?to=x@y', domain: example.org}}\n",
            "leave to= out of the url",
        ),
        ("    chat: {urls: ['json://h/x'], advice: be nice}\n", "advice is for owner targets"),
    ],
)
def test_owner_target_mistakes_are_refused(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(InputError) as info:
        config_mod.load(owner_config(tmp_path, body))
    assert message in info.value.render()


# -- placeholders -----------------------------------------------------------------------------


def rules_with(tmp_path: Path, for_each: str, message: str) -> Path:
    path = tmp_path / "p.yaml"
    when = {"process": "process.gpu_memory_mib > 0", "gpu": "gpu.memory.used_pct > 90"}[for_each]
    path.write_text(
        f"rules:\n  - name: r\n    for_each: {for_each}\n    when: {when}\n"
        f"    steps:\n      - notify: {{targets: oncall, message: '{message}'}}\n"
    )
    return path


def test_a_process_rule_may_name_the_process(tmp_path: Path) -> None:
    cfg = config_mod.load(owner_config(tmp_path, ""))
    text = "${user} runs ${pid} (job ${job}) on GPU ${gpu}: ${command}"
    assert loader.load([rules_with(tmp_path, "process", text)], cfg).rules


def test_a_gpu_rule_cannot_name_a_process_and_is_told_why(tmp_path: Path) -> None:
    cfg = config_mod.load(owner_config(tmp_path, ""))
    assert loader.load([rules_with(tmp_path, "gpu", "GPU ${gpu} is full")], cfg).rules
    with pytest.raises(InputError) as info:
        loader.load([rules_with(tmp_path, "gpu", "${user} fills GPU ${gpu}")], cfg)
    text = info.value.render()
    assert "unknown placeholder ${user} in the message of a gpu rule" in text
    assert "${user} names what a for_each: process rule's incident is about" in text
    assert "Owner messages" in text


# -- end to end: a real daemon, real processes of real users, real receivers -------------------


@pytest.fixture
def second_owner(session_users: dict[str, User]) -> str:
    return session_users["mail"].name


@pytest.fixture
def receivers() -> Iterator[tuple[JsonReceiver, SmtpReceiver]]:
    hook, mail = JsonReceiver().start(), SmtpReceiver().start()
    yield hook, mail
    hook.stop()
    mail.stop()


def test_owners_are_told_what_happened_why_and_how_to_avoid_it(
    job_owner: str, second_owner: str, receivers: tuple[JsonReceiver, SmtpReceiver]
) -> None:
    hook, mail = receivers
    folder = Path(tempfile.mkdtemp(prefix="gpuwarden-test-"))  # reachable by the job owners
    try:
        text = (ROOT / "scenarios" / "memory-pressure-low-priority.yaml").read_text()
        text = text[: text.index("  - at: 4m\n")] + "  - at: 4m20s\n    end: true\n"
        scenario = folder / "owned.yaml"
        # The sweep (low priority, killed) is in the table; the trainer's owner (asked to
        # checkpoint) is not, and gets mail.
        scenario.write_text(run_as(text, {"sweep": job_owner, "trainer": second_owner}))
        cfg = owner_config(
            folder,
            "    owner:\n"
            f"      owners: {{{job_owner}: '{hook.url('owner')}'}}\n"
            f"      owner_mail: {{url: 'mailto://127.0.0.1:{mail.port}?mode=insecure"
            "&from=gpuwarden@example.org', domain: example.org}\n"
            "      advice: 'Run sweeps in the preempt partition; ask in #gpu-help.'\n",
        )
        playbook = folder / "memory-pressure.yaml"
        playbook.write_text(
            (ROOT / "playbooks" / "memory-pressure.yaml")
            .read_text()
            .replace("      - notify: oncall\n", "      - notify: [oncall, owner]\n")
        )
        done = subprocess.run(
            [
                sys.executable, "-m", "gpuwarden", "run", "--config", str(cfg),
                "--source", f"scenario:{scenario}", "--playbooks", str(playbook),
                "--state-dir", str(folder / "state"), "--speed", "40",
            ],
            cwd=ROOT,
            env={**os.environ, "TEST_ONCALL_URL": hook.url("oncall")},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "action=kill" in done.stderr
        assert "result=terminated" in done.stderr
    finally:
        shutil.rmtree(folder)
    # The killed sweep's owner, through the table:
    (told,) = [d for d in hook.received if d["path"] == "/owner"]
    assert told["title"].startswith("gpuwarden on demo-node: your process ")
    assert told["title"].endswith(" was stopped")
    body = str(told["message"])
    assert body.startswith(f"Hello {job_owner},")
    assert "gpuwarden stopped your process" in body
    assert "python sweep.py --trial 17" in body
    assert "exited on SIGTERM" in body  # what happened
    assert "Why: GPU memory pressure on GPU 0. A GPU is nearly out of memory" in body
    assert "priority class low" in body
    assert "How to avoid it: Run sweeps in the preempt partition; ask in #gpu-help." in body
    # The checkpointed trainer's owner, by mail to USER@domain:
    (letter,) = mail.messages
    assert letter["To"] == f"{second_owner}@example.org"
    assert str(letter["Subject"]).endswith("was asked to save a checkpoint")
    text = str(letter.get_payload(decode=True).decode())  # type: ignore[union-attr]
    assert f"Hello {second_owner}," in text
    assert "acknowledged" in text
    assert "How to avoid it: Run sweeps" in text
    # The on-call got the incident as before, not the owners' messages.
    assert any(d["path"] == "/oncall" for d in hook.received)


# -- the notifier: only what happened is told ---------------------------------------------------


def notifier_for(tmp_path: Path, marker: str = "") -> Notifier:
    cfg = config_mod.load(owner_config(tmp_path, "    owner: {owners: {bob: 'json://h/b'}}\n"))
    return Notifier(cfg, host="node", marker=marker)


def intent(kind: str, step: int, params: object = None) -> Intent:
    sweep = Target(
        pid=4242, create_time=1.0, gpu=0, user="bob", priority="low", gpu_memory_mib=28900,
        command="python sweep.py", job="48213",
    )  # fmt: skip
    return Intent(
        id=f"inc/{step}", incident="inc", rule="gpu-memory-pressure", scope="gpu:0", step=step,
        kind=kind, label=kind, time=100.0, reason=Reason.STEP_DUE, severity="critical",
        targets=() if kind == "notify" else (sweep,), gpu=0, params=params, where="GPU 0",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("outcome", "marker", "told"),
    [
        (Outcome(ok=True, targets=(TargetResult(4242, 1.0, True, "terminated", "exited"),)), "", 1),
        (Outcome(ok=False, targets=(TargetResult(4242, 1.0, False, "gone", "exited"),)), "", 0),
        (
            Outcome(ok=True, dry_run=True, targets=(TargetResult(4242, 1.0, True, "would"),)),
            "[DRY-RUN]",
            0,
        ),
        (Outcome(ok=True, dry_run=True, detail="drill: simulated"), "[DRILL]", 1),
    ],
    ids=["killed", "gone-before", "shadow", "drill"],
)
def test_an_owner_is_told_only_what_happened(
    tmp_path: Path, outcome: Outcome, marker: str, told: int
) -> None:
    notifier = notifier_for(tmp_path, marker)
    fired = RuleChange(
        Transition.FIRING, "gpu-memory-pressure", "gpu:0", 100.0, Reason.FOR_ELAPSED, "inc"
    )
    kill = intent("kill", 1)
    notifier.observe(
        [fired, intent("notify", 0, NotifyParams(targets=("oncall", "owner"))), kill], 100.0
    )
    notifier.observe_outcome(kill, outcome, 101.0)
    owners = [m for m in notifier.due(102.0) if m.kind == "owner"]
    assert len(owners) == told
    for message in owners:
        assert message.target == "owner:bob"
        assert "(job 48213)" in message.body
        assert message.title.startswith(f"{marker} " if marker else "gpuwarden")
    # the owner target never gets the group's messages about the incident
    assert all(m.target != "owner" for m in notifier.due(10_000.0))


def test_placeholders_are_filled_with_the_process_the_incident_is_about(tmp_path: Path) -> None:
    from gpuwarden import drill

    cfg = config_mod.load(owner_config(tmp_path, ""))
    path = tmp_path / "p.yaml"
    path.write_text(
        "rules:\n  - name: busy-trainer\n    for_each: process\n"
        "    when: process.checkpointable and gpu.memory.used_pct >= 95\n    steps:\n"
        "      - notify: {targets: oncall, message: "
        "'${user} runs pid ${pid} (job ${job}) on GPU ${gpu}: ${command}'}\n"
    )
    playbooks = loader.load([path], cfg)
    scenario = ROOT / "scenarios" / "memory-pressure-low-priority.yaml"
    bodies = [r["body"] for r in drill.run(scenario, cfg, playbooks) if r["kind"] == "message"]
    assert bodies, "nothing was said"
    assert bodies[0].startswith(
        "alice runs pid 4195304 (job 48213) on GPU 0: python train.py --model llama-8b --resume"
    )


def test_advice_may_be_given_per_step_kind(tmp_path: Path) -> None:
    cfg = config_mod.load(
        owner_config(
            tmp_path,
            "    owner:\n      owners: {bob: 'json://h/b'}\n"
            "      advice: {kill: 'Use the preempt partition.'}\n",
        )
    )
    spec = cfg.notify.targets["owner"]
    assert spec.advice_for("kill") == "Use the preempt partition."
    assert spec.advice_for("checkpoint") is None  # gpuwarden's own words for the others
    notifier = Notifier(cfg, host="node")
    fired = RuleChange(
        Transition.FIRING, "gpu-memory-pressure", "gpu:0", 100.0, Reason.FOR_ELAPSED, "inc"
    )
    kill = intent("kill", 1)
    notify = intent("notify", 0, NotifyParams(targets=("owner",)))
    notifier.observe([fired, notify, kill], 100.0)
    done = Outcome(ok=True, targets=(TargetResult(4242, 1.0, True, "terminated", "exited"),))
    notifier.observe_outcome(kill, done, 101.0)
    (told,) = notifier.due(102.0)
    assert "How to avoid it: Use the preempt partition." in told.body
