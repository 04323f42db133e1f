"""What ``check`` and ``doctor`` say about the trust a config places: how far each priority rule
may move a process, regexes that backtrack, protected classes a job can declare itself into,
and secrets other users can read; and config regexes that cannot stall attribution."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpuwarden import config
from gpuwarden.cli import hardening, selfcheck
from gpuwarden.patterns import TEXT_LIMIT, compile_pattern, nested_quantifier
from tests.cli_runner import gpuwarden
from tests.system_users import User

ROOT = Path(__file__).resolve().parent.parent
CATASTROPHIC = r"^(\w+\s?)+--prod$"
PLAYBOOK = "rules:\n  - name: hot\n    for_each: gpu\n    when: gpu.temperature_c > 90\n"


def setup(tmp_path: Path, body: str, mode: int = 0o600) -> Path:
    books = tmp_path / "playbooks"
    books.mkdir(parents=True)
    (books / "hot.yaml").write_text(PLAYBOOK)
    path = tmp_path / "gpuwarden.yaml"
    path.write_text(f"playbooks: {books}\n" + textwrap.dedent(body))
    path.chmod(mode)
    return path


def check(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return gpuwarden("check", "--config", path, *args)


# -- per class: what can raise, what only lowers ------------------------------------------------


def test_check_says_per_class_which_rules_raise_and_which_only_lower() -> None:
    result = check(ROOT / "config" / "gpuwarden.yaml", str(ROOT / "playbooks"))
    lines = result.stdout.splitlines()
    start = lines.index(
        "priorities critical > high > normal > low > scavenger (default normal, declared max high)"
    )
    pad = " " * 11
    assert lines[start + 1 : start + 10] == [
        f"{pad}critical   unit 'triton\\.service': can raise (a cgroup its owner made only lowers)",
        f"{pad}high       group ml-prod: can raise",
        f"{pad}           env SLURM_JOB_PARTITION=prod: can raise (a partition or QOS Slurm does "
        "not report only lowers)",
        f"{pad}normal     no rules (the default)",
        f"{pad}low        cmdline 'ipykernel_launcher|jupyter-(lab|notebook)': only lowers",
        f"{pad}scavenger  user svc-sweeps: can raise",
        f"{pad}           cgroup 'preemptible': can raise (a cgroup its owner made only lowers)",
        f"{pad}declared   GPUWARDEN_PRIORITY: any class up to high",
        "protected  pid 1-2; gpuwarden itself; root-owned; users root, nvidia-persistenced; "
        "units (root-owned cgroups) triton\\.service; classes critical",
    ]


def test_a_rule_is_as_weak_as_its_weakest_condition(tmp_path: Path) -> None:
    path = setup(
        tmp_path,
        """\
        priorities:
          classes:
            - name: critical
              match:
                - {user: triton, cmdline: tritonserver}
                - {exe: /opt/tritonserver/bin/tritonserver, env: {TIER: prod}}
                - {group: ml, env: {SLURM_JOB_ID: "7"}}
            - name: normal
          default: normal
          declared_max: normal
        """,
    )
    result = check(path)
    assert result.returncode == 0, result.stderr
    assert [line.strip() for line in result.stdout.splitlines()[3:6]] == [
        "critical  user triton and cmdline 'tritonserver': only lowers",
        "exe '/opt/tritonserver/bin/tritonserver' and env TIER=prod: can raise, to normal at most",
        "group ml and env SLURM_JOB_ID=7: only lowers",
    ]


# -- regexes -------------------------------------------------------------------------------------


def test_check_warns_on_nested_quantifiers_at_their_position(tmp_path: Path) -> None:
    path = setup(
        tmp_path,
        f"""\
        priorities:
          classes:
            - name: high
              match:
                - cmdline: '{CATASTROPHIC}'
            - name: normal
          default: normal
          declared_max: normal
        protected:
          units: ['(svc-\\w*)+\\.service']
        """,
    )
    result = check(path)
    assert result.returncode == 0
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 2, result.stderr
    assert warnings[0].startswith(
        f"warning: {path}:6:20: priorities.classes[0].match[0].cmdline '{CATASTROPHIC}' repeats "
        "a group that holds a quantifier"
    )
    assert "it runs on RE2 here, in time linear in the text" in warnings[0]
    assert "pip install 'gpuwarden[re2]'" in warnings[0]
    assert warnings[1].startswith(f"warning: {path}:11:11: protected.units[0] ")
    strict = check(path, "--strict")
    assert strict.returncode == 1
    assert strict.stderr.splitlines()[-1] == "check failed: 2 warnings (--strict)"


@pytest.mark.parametrize(
    ("pattern", "nested"),
    [
        (CATASTROPHIC, True),
        (r"(a*)*", True),
        (r"(a|b+)*c", True),
        (r"(a+){10}", True),  # a bounded repeat of an unbounded one
        (r"(?:a{2,3}){2}", False),  # bounded inside bounded: a fixed amount of work
        (r"(\d{1,3}\.){3}\d{1,3}", False),
        (r"(?>a+)+", False),  # atomic: gives nothing back
        (r"(a++)+", False),  # possessive
        (r"ipykernel_launcher|jupyter-(lab|notebook)", False),
        (r"(ab)+", False),
        (r"[", False),  # not a pattern at all: the config's validation says so
    ],
)
def test_nested_quantifiers(pattern: str, nested: bool) -> None:
    assert nested_quantifier(pattern) is nested


def test_a_crafted_command_line_cannot_stall_attribution(tmp_path: Path) -> None:
    """A real process whose command line is the worst case for CATASTROPHIC: Python's re tries
    each of the 2**40 ways to split its 40 letters (22 letters take 0.6 s, each more doubles
    it), far beyond the generous limit below; RE2 answers in time linear in the text."""
    pytest.importorskip("re2")
    assert compile_pattern(CATASTROPHIC).engine == "re2"
    script = textwrap.dedent(
        f"""
        import subprocess, sys, time
        from gpuwarden.config import MatchRule, Priorities, PriorityClass
        from gpuwarden.sources.procs import Attributor
        argv = ["a" * 40 + "!", "-c", "import time; time.sleep(60)"]  # argv[0] is the job's
        child = subprocess.Popen(argv, executable=sys.executable)
        while open(f"/proc/{{child.pid}}/cmdline").read().split("\\0")[0] != argv[0]:
            time.sleep(0.01)  # until the child has become the job
        rule = MatchRule(cmdline={CATASTROPHIC!r})
        classes = (PriorityClass(name="low", match=(rule,)), PriorityClass(name="normal"))
        priorities = Priorities(classes=classes, default="normal", declared_max="normal")
        info = Attributor(priorities).describe([child.pid], time.time())[child.pid]
        child.kill()
        print(info.priority, (info.cmdline or ("?",))[0])
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["normal", "a" * 40 + "!"]


def test_patterns_see_at_most_the_text_limit() -> None:
    pattern = compile_pattern("needle")
    assert pattern.search("x" * (TEXT_LIMIT - 6) + "needle")
    assert not pattern.search("x" * TEXT_LIMIT + "needle")
    assert compile_pattern(r"(a)\1").engine == "re"  # RE2 has no back-references
    assert compile_pattern(r"(a)\1").search("aa")


def test_without_re2_the_patterns_run_on_re_and_check_says_so(tmp_path: Path) -> None:
    """The extra is optional: without it everything works, on re, and the warning says so."""
    script = textwrap.dedent(
        """
        import sys
        sys.modules["re2"] = None  # as if google-re2 were not installed
        from pathlib import Path
        from gpuwarden import config
        from gpuwarden.cli import hardening
        from gpuwarden.patterns import compile_pattern, re2_available
        assert not re2_available()
        assert compile_pattern("triton").engine == "re"
        assert compile_pattern("triton").fullmatch("triton")
        path = Path(sys.argv[1])
        findings = hardening.review(config.load(path), path)
        print(findings[0].detail)
        """
    )
    path = setup(
        tmp_path,
        "priorities:\n  classes:\n    - name: normal\n"
        f"      match: [cmdline: '{CATASTROPHIC}']\n  declared_max: normal\n",
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "it runs on Python's re here (the re2 extra is not installed)" in done.stdout


# -- protected classes ---------------------------------------------------------------------------


def test_a_protected_class_a_job_can_declare_is_a_warning(tmp_path: Path) -> None:
    path = setup(tmp_path, "protected:\n  priorities: [high]\n")
    result = check(path)
    assert (
        f"warning: {path}:3:16: protected class high is not above declared_max (high): any job "
        "can declare itself into it (GPUWARDEN_PRIORITY, env rules) and be protected — protect "
        "only classes above declared_max, or lower declared_max below high"
    ) in result.stderr.splitlines()
    quiet = setup(tmp_path / "ok", "protected:\n  priorities: [critical]\n")
    assert "warning" not in check(quiet).stderr


# -- secrets -------------------------------------------------------------------------------------

INLINE = """\
notify:
  targets:
    chat:
      urls:
        - 'slack://T01ABCDEF/B02GHIJKL/verysecrettoken123'
        - {value: 'ntfys://topicwithsecret123'}
        - 'json://127.0.0.1:9/hook'
"""


def test_inline_secrets_in_a_readable_config_are_a_warning(tmp_path: Path) -> None:
    path = setup(tmp_path, INLINE, mode=0o644)
    warnings = [line for line in check(path).stderr.splitlines() if "secret" in line]
    assert warnings == [
        f"warning: {path} is readable by everyone and holds 2 secret(s) inline: "
        f"{path}:6:11: notify.targets.chat.urls[0], "
        f"{path}:7:19: notify.targets.chat.urls[1].value — move them to {{file: PATH}} "
        f"(mode 0600) or {{env: NAME}}, or make the config private: chmod 0600 {path}"
    ]
    assert "verysecrettoken123" not in check(path).stderr
    path.chmod(0o600)
    assert "secret" not in check(path).stderr


def test_secret_files_readable_by_others_are_a_warning(
    tmp_path: Path, system_users: dict[str, User]
) -> None:
    secret = tmp_path / "chat.url"
    secret.write_text("slack://T01ABCDEF/B02GHIJKL/verysecrettoken123\n")
    path = setup(tmp_path, f"notify:\n  targets:\n    chat:\n      urls: [{{file: {secret}}}]\n")
    for mode, group, expected in (
        (0o600, 0, None),
        (0o640, 0, None),  # group root: nobody else
        (0o640, system_users["mallory"].gid, f"group {system_users['mallory'].name}"),
        (0o644, 0, "everyone"),
    ):
        secret.chmod(mode)
        os.chown(secret, 0, group)
        findings = [f for f in hardening.review(config.load(path), path) if f.check == "secrets"]
        if expected is None:
            assert findings == [], oct(mode)
            continue
        (finding,) = findings
        assert finding.detail == (
            f"{path}:5:21: notify.targets.chat.urls[0].file: {secret} holds a secret and is "
            f"readable by {expected}"
        )
        assert finding.fix == f"chmod 0600 {secret} (owned by the daemon's user)"


def test_doctor_reports_the_same_warnings(tmp_path: Path) -> None:
    path = setup(tmp_path, INLINE, mode=0o644)
    findings = selfcheck.run_checks(None, path, None, state_dir=tmp_path / "state")
    secrets = [f for f in findings if f.check == "secrets"]
    assert [f.severity for f in secrets] == ["warning"]
    assert not selfcheck.blocking(secrets)
    path.chmod(0o600)
    findings = selfcheck.run_checks(None, path, None, state_dir=tmp_path / "state")
    assert [f.detail for f in findings if f.check == "trust"] == [
        "no regex that backtracks, no protected class a job can declare, no secret readable by "
        "other users"
    ]
