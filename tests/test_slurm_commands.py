"""Slurm's commands and what gpuwarden reads from them, without a cluster: which job a cgroup
names (and which it must not believe), what ``scontrol`` answers, how a failed or hung command
becomes a result, the ``slurm`` config and the ``via`` and ``requeue`` keys of a playbook."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuwarden import config
from gpuwarden.actions.slurm import (
    JobRef,
    Ran,
    Slurm,
    job_fields,
    job_from_cgroup,
    job_from_pidinfo,
    job_in_cgroup,
    step_in_listpids,
    via_for,
)
from gpuwarden.config import SlurmConfig
from gpuwarden.errors import InputError
from gpuwarden.playbook import loader
from gpuwarden.playbook.schema import RequeueParams

ROOT = Path(__file__).resolve().parent.parent
V1_LINES = "6:freezer:{path}\n5:devices:/\n4:memory:/process_api/56988e32\n0::/\n"


@pytest.mark.parametrize(
    ("text", "uid", "job"),
    [
        ("0::/system.slice/slurmstepd.scope/job_7001/step_0/user/task_0\n", 1000, "7001"),
        ("0::/system.slice/slurmstepd.scope/job_7001/step_batch/user/task_0\n", None, "7001"),
        ("0::/system.slice/node3_slurmstepd.scope/job_42/step_extern/slurm\n", 1000, "42"),
        (V1_LINES.format(path="/slurm/uid_1000/job_99/step_batch"), 1000, "99"),
        (V1_LINES.format(path="/slurm_node3/uid_1000/job_99/step_0/task_0"), 1000, "99"),
        # a v1 path names the owner: another uid's job directory is not this process's job
        (V1_LINES.format(path="/slurm/uid_0/job_99/step_batch"), 1000, None),
        (V1_LINES.format(path="/slurm/uid_1000/job_99/step_batch"), None, None),
        # cgroups a user may make (delegated to them by systemd, or inside a container with
        # its own cgroup namespace) are not Slurm's, whatever they are called
        (
            "0::/user.slice/user-1000.slice/user@1000.service/app.slice/slurmstepd.scope/"
            "job_5/step_0\n",
            1000,
            None,
        ),
        ("0::/user.slice/user-1000.slice/user@1000.service/slurm/uid_1000/job_5\n", 1000, None),
        ("0::/system.slice/docker-abc.scope/slurmstepd.scope/job_5/step_0\n", 0, None),
        ("0::/../slurmstepd.scope/job_5/step_0\n", 0, None),
        ("0::/system.slice/slurmstepd.scope/job_x/step_0\n", 0, None),
        ("0::/system.slice/slurmd.service\n", 0, None),
        ("", 0, None),
        ("garbage without colons", 0, None),
    ],
)
def test_the_job_a_cgroup_names(text: str, uid: int | None, job: str | None) -> None:
    assert job_from_cgroup(text, uid) == job


@pytest.mark.parametrize(
    ("path", "step"),
    [
        ("0::/system.slice/slurmstepd.scope/job_7/step_batch/user/task_0", "batch"),
        ("0::/system.slice/slurmstepd.scope/job_7/step_0/user/task_3", "0"),
        ("0::/system.slice/slurmstepd.scope/job_7/step_extern/slurm", "extern"),
        ("0::/system.slice/slurmstepd.scope/job_7", None),
        ("6:freezer:/slurm_n1/uid_0/job_7/step_12", "12"),
    ],
)
def test_the_step_a_cgroup_names(path: str, step: str | None) -> None:
    assert job_in_cgroup(path + "\n", 0) == JobRef("7", step)


@pytest.mark.parametrize(
    ("signal_to", "step", "argv"),
    [
        ("auto", "0", ("--signal=USR1", "7")),  # srun's tasks: never the batch script
        ("auto", "batch", ("--signal=USR1", "--full", "7")),
        ("auto", "extern", ("--signal=USR1", "--full", "7")),
        ("auto", None, ("--signal=USR1", "--full", "7")),  # no cgroup (pidinfo)
        ("full", "0", ("--signal=USR1", "--full", "7")),
        ("batch", "0", ("--signal=USR1", "--batch", "7")),
        ("steps", "batch", ("--signal=USR1", "7")),
    ],
)
def test_where_a_checkpoint_signal_goes(
    signal_to: str, step: str | None, argv: tuple[str, ...]
) -> None:
    slurm = Slurm(SlurmConfig.model_validate({"signal_to": signal_to}))
    assert slurm.signal_argv("7", "SIGUSR1", step) == ("scancel", argv)


def test_a_removed_cgroup_still_names_its_job() -> None:
    text = "0::/system.slice/slurmstepd.scope/job_7001/step_0/user/task_0 (deleted)\n"
    assert job_from_cgroup(text, 0) == "7001"


LISTPIDS = """PID      JOBID    STEPID   LOCALID GLOBALID
1369     498999   0        0       0
1352     498999   batch    0       0
1353     498999   batch    -       -
"""


def test_the_step_slurmd_lists_for_a_pid() -> None:
    assert step_in_listpids(LISTPIDS, "498999", 1369) == "0"
    assert step_in_listpids(LISTPIDS, "498999", 1353) == "batch"
    assert step_in_listpids(LISTPIDS, "498999", 136) is None
    assert step_in_listpids(LISTPIDS, "49899", 1369) is None


def test_what_scontrol_answers() -> None:
    assert job_from_pidinfo("Slurm JobId=7001 ends at Wed Dec 01 04:35:01 2027\n") == "7001"
    assert job_from_pidinfo("Failed to locate job for requested pid\n") is None
    line = "JobId=7002 JobName=run.sh UserId=root(0) JobState=PENDING Reason=BeginTime Restarts=1"
    fields = job_fields(line)
    assert (fields["JobState"], fields["Reason"], fields["Restarts"]) == (
        "PENDING",
        "BeginTime",
        "1",
    )


@pytest.mark.parametrize(
    ("kind", "via", "job", "enabled", "expected"),
    [
        ("kill", "auto", "7", True, "slurm"),
        ("kill", "auto", "7", False, "signal"),  # slurm.enabled: false in the config
        ("kill", "auto", None, True, "signal"),
        ("kill", "signal", "7", True, "signal"),
        ("suspend", "slurm", "7", False, "slurm"),
        ("requeue", "auto", "7", False, "slurm"),
        ("renice", "auto", "7", True, "signal"),  # renice has no Slurm form
        ("notify", None, "7", True, "signal"),
    ],
)
def test_what_a_drill_says_a_step_would_use(
    kind: str, via: str | None, job: str | None, enabled: bool, expected: str
) -> None:
    assert via_for(kind, via, job, enabled) == expected


def test_a_failed_command_says_what_ran_and_what_slurm_said() -> None:
    ran = Ran(("/usr/bin/scontrol", "requeue", "7003"), 1, "", "Job is pending\texecution\n")
    assert ran.describe() == "scontrol requeue 7003: exit 1: Job is pending execution"
    hung = Ran(("/usr/bin/scancel", "7003"), None, stderr="no answer within 2s")
    assert hung.describe() == "scancel 7003: did not finish: no answer within 2s"
    assert Ran(("/usr/bin/scancel", "7003"), 0).describe() == "scancel 7003: done"
    long = Ran(("scontrol", "ping"), 1, stderr="x" * 5000).describe()
    assert len(long) < 2100


def fake_commands(directory: Path, body: str) -> Path:
    """``scontrol`` and ``scancel`` that run ``body`` (a shell script; the one seam here is
    where the config says Slurm's commands are)."""
    directory.mkdir()
    for name in ("scontrol", "scancel"):
        path = directory / name
        path.write_text("#!/bin/sh\n" + body)
        path.chmod(0o755)
    return directory


def test_a_command_that_hangs_is_stopped_at_the_timeout(tmp_path: Path) -> None:
    bin_dir = fake_commands(tmp_path / "bin", 'echo $$ > "$0.pid"\nexec sleep 30\n')
    slurm = Slurm(SlurmConfig(bin_dir=bin_dir, timeout=0.3))
    ran = slurm.run("scontrol", "ping")
    assert (ran.ok, ran.returncode) == (False, None)
    assert ran.describe() == "scontrol ping: did not finish: no answer within 0.3s"
    pid = int((bin_dir / "scontrol.pid").read_text())
    with pytest.raises(ProcessLookupError):  # killed and reaped, not left behind
        os.kill(pid, 0)


def test_commands_get_a_small_environment_and_argv_as_given(tmp_path: Path) -> None:
    bin_dir = fake_commands(tmp_path / "bin", 'env | sort > "$0.env"\nprintf "%s\\n" "$@"\n')
    environ = {"PATH": "/usr/bin:/bin", "AWS_SECRET_ACCESS_KEY": "s3cr3t", "HOME": "/root"}
    slurm = Slurm(SlurmConfig(bin_dir=bin_dir, conf=tmp_path / "slurm.conf"), environ=environ)
    ran = slurm.run("scancel", "--signal=USR1", "--full", "7001; rm -rf /")
    assert ran.ok
    assert ran.stdout.splitlines() == ["--signal=USR1", "--full", "7001; rm -rf /"]
    env = (bin_dir / "scancel.env").read_text()
    assert "s3cr3t" not in env
    assert "HOME=" not in env
    assert f"SLURM_CONF={tmp_path / 'slurm.conf'}" in env
    assert "LC_ALL=C" in env


def test_missing_commands_and_a_turned_off_slurm(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    slurm = Slurm(SlurmConfig(bin_dir=empty))
    assert slurm.missing == f"Slurm's scontrol and scancel not found in {empty}"
    ran = slurm.run("scontrol", "ping")
    assert (ran.ok, ran.returncode) == (False, None)
    assert Slurm.from_config(SlurmConfig(enabled=False)) is None


def load(tmp_path: Path, text: str) -> config.Config:
    path = tmp_path / "gpuwarden.yaml"
    path.write_text(text, encoding="utf-8")
    return config.load(path)


def test_the_slurm_config() -> None:
    cfg = config.load(ROOT / "config" / "gpuwarden.yaml")
    assert cfg.slurm == SlurmConfig()
    assert (cfg.slurm.timeout, cfg.slurm.signal_to, cfg.slurm.fallback) == (15.0, "auto", "signal")


def test_a_bad_slurm_config_is_refused_at_its_position(tmp_path: Path) -> None:
    with pytest.raises(InputError) as caught:
        load(tmp_path, "slurm:\n  signal_to: all\n  timeout: 0s\n")
    rendered = [
        p.render().removeprefix(f"{tmp_path / 'gpuwarden.yaml'}:") for p in caught.value.problems
    ]
    assert sorted(rendered) == [
        "2:14: slurm.signal_to: input should be 'auto', 'full', 'batch' or 'steps' (got 'all')",
        "3:12: slurm.timeout: input should be greater than 0 (got 0.0)",
    ]


def test_requeue_and_via_in_a_playbook(tmp_path: Path) -> None:
    cfg = config.load(ROOT / "config" / "gpuwarden.yaml")
    good = tmp_path / "good.yaml"
    good.write_text(
        "rules:\n  - name: r\n    when: gpu.memory.used_pct > 95\n    steps:\n"
        "      - suspend: {via: signal}\n      - requeue: {hold: true}\n      - requeue:\n"
    )
    rule = loader.load([good], cfg).rules[0]
    assert [s.kind for s in rule.steps] == ["suspend", "requeue", "requeue"]
    assert rule.steps[1].spec.params == RequeueParams(hold=True)
    assert rule.steps[2].spec.params == RequeueParams()
    bad = tmp_path / "bad" / "p.yaml"
    bad.parent.mkdir()
    bad.write_text(
        "rules:\n  - name: r\n    when: gpu.memory.used_pct > 95\n    steps:\n"
        "      - requeue: {via: signal}\n      - kill: {via: pigeon}\n"
    )
    with pytest.raises(InputError) as caught:
        loader.load([bad.parent], cfg)
    rendered = [p.render().removeprefix(f"{bad}:") for p in caught.value.problems]
    assert rendered == [
        "5:24: rules.0.steps.0.requeue.via: input should be 'auto' or 'slurm' (got 'signal')",
        "6:21: rules.0.steps.1.kill.via: input should be 'auto', 'signal' or 'slurm' "
        "(got 'pigeon')",
    ]


NEEDS_SLURM = """
from tests.slurm_cluster import fixture_slurm, fixture_slurm_cluster  # noqa: F401


def test_it(slurm):
    assert slurm.state("1")
"""


@pytest.mark.parametrize("ci", ["", "true"])
def test_without_slurm_its_tests_skip_but_fail_under_ci(tmp_path: Path, ci: str) -> None:
    test = tmp_path / "test_needs_slurm.py"
    test.write_text(NEEDS_SLURM)
    env = {
        **os.environ,
        "PATH": str(tmp_path / "no-slurm-here"),
        "PYTHONPATH": os.pathsep.join((str(ROOT), str(ROOT / "daemon"))),
        "CI": ci,
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(test)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    # The daemons (munged, slurmctld, slurmd) are looked for in /usr/sbin as well, so whether
    # they are named depends on the machine; the commands never are on this PATH.
    assert "Slurm is not installed here (" in done.stdout
    assert "sbatch, scontrol, scancel, squeue, sinfo not found)" in done.stdout
    if ci:
        assert done.returncode == 1
        assert "1 error" in done.stdout
        assert "(CI=true: the Slurm tests must run)" in done.stdout
    else:
        assert done.returncode == 0
        assert "1 skipped" in done.stdout
