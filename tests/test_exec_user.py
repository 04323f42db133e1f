"""exec hooks run as the configured unprivileged user, with no capabilities and no_new_privs,
unless the step says ``as_root: true``: a real command reads its own /proc/self/status."""

from __future__ import annotations

from pathlib import Path

from gpuwarden.actions import exec_ as exec_action
from gpuwarden.cli.selfcheck import CAPABILITY_BITS
from gpuwarden.config import Config, ExecConfig
from gpuwarden.journal.journal import Journal
from gpuwarden.playbook import loader
from gpuwarden.playbook.schema import ExecParams
from gpuwarden.runtime import Runtime
from tests.local_users import LocalUsers, ProcessSource
from tests.signal_targets import intent, real

# What the hook reports about itself: uid, gid, working directory, capabilities, no_new_privs.
REPORT = (
    "echo uid=$(id -u) gid=$(id -g) cwd=$(pwd); "
    "grep -E '^(CapEff|CapPrm|CapAmb|NoNewPrivs):' /proc/self/status"
)
SYS_ADMIN = 1 << CAPABILITY_BITS["CAP_SYS_ADMIN"]


def report(detail: str) -> dict[str, str]:
    """``key=value`` and ``Key: value`` lines of the hook's output, as a dict."""
    found: dict[str, str] = {}
    for line in detail.split("output:\n", 1)[-1].splitlines():
        for word in line.split():
            if "=" in word:
                key, value = word.split("=", 1)
                found[key] = value
        if ":" in line and "=" not in line:
            key, value = line.split(":", 1)
            found[key.strip()] = value.strip()
    return found


def own_status(key: str) -> str:
    for line in Path("/proc/thread-self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(key)


def test_an_exec_hook_runs_as_the_configured_user_without_capabilities(
    local_users: LocalUsers, tmp_path: Path
) -> None:
    victim = local_users.victim
    cfg = Config(exec=ExecConfig(user=victim.name))
    rules = tmp_path / "hook.yaml"
    rules.write_text(
        "rules:\n  - name: hook\n    for_each: gpu\n    when: gpu.memory.used_pct >= 0\n"
        f'    steps:\n      - exec: ["/bin/sh", "-c", "{REPORT}"]\n'
    )
    journal_path = tmp_path / "journal.db"
    runtime = Runtime(cfg, ProcessSource(), loader.load([rules], cfg), Journal(journal_path))
    try:
        runtime.tick()
        runtime.steps.settle(30)
    finally:
        runtime.shutdown()
    reader = Journal.open_readonly(journal_path)
    try:
        (incident,) = reader.incidents()
        (finished,) = [r for r in reader.timeline(incident.id) if r.kind == "finished"]
    finally:
        reader.close()
    assert finished.data["ok"], finished.data
    seen = report(finished.data["detail"])
    assert (seen["uid"], seen["gid"], seen["cwd"]) == (str(victim.uid), str(victim.gid), "/")
    assert int(seen["CapEff"], 16) & SYS_ADMIN == 0
    assert (seen["CapEff"], seen["CapPrm"], seen["CapAmb"]) == ("0" * 16,) * 3
    assert seen["NoNewPrivs"] == "1"
    assert own_status("NoNewPrivs") == "0"  # the daemon's own threads are left as they were


def test_as_root_keeps_the_daemons_identity(local_users: LocalUsers) -> None:
    params = ExecParams(argv=("/bin/sh", "-c", REPORT), as_root=True)
    ctx = real(exec_user=local_users.victim.name)
    outcome = exec_action.execute(intent("exec", params=params), ctx)
    assert outcome.ok, outcome.detail
    seen = report(outcome.detail)
    assert seen["uid"] == "0"
    assert seen["CapEff"] == own_status("CapEff")
    assert seen["NoNewPrivs"] == own_status("NoNewPrivs")


def test_a_dry_run_says_as_whom_and_an_unknown_user_fails_the_step(
    local_users: LocalUsers,
) -> None:
    params = ExecParams(argv=("/bin/true",))
    dry = exec_action.execute(
        intent("exec", params=params), real(dry_run=True, exec_user=local_users.victim.name)
    )
    assert dry.detail == f"would run as {local_users.victim.name}: /bin/true"
    missing = exec_action.execute(intent("exec", params=params), real(exec_user="gw-nobody-here"))
    assert not missing.ok
    assert missing.detail.startswith("exec.user 'gw-nobody-here' is not a user on this host")
