"""Asking Slurm for a job's partition and QOS: ``squeue`` run for real, answered by a stand-in
script for slurmctld (there is no Slurm cluster here), on an injected clock."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.sources.slurm import SlurmJob, SlurmJobs


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def squeue(tmp_path: Path, answers: dict[str, str], *, delay: float = 0.0) -> Path:
    """A ``squeue`` that answers ``--jobs=ID --format=%P|%q`` from ``answers`` and logs each
    job id it is asked about; unknown jobs fail as squeue does."""
    script = tmp_path / "squeue"
    cases = "\n".join(f"  {job}) echo '{line}' ;;" for job, line in answers.items())
    script.write_text(
        "#!/bin/sh\n"
        'for arg in "$@"; do case "$arg" in --jobs=*) job="${arg#--jobs=}" ;; '
        '--format=*) format="${arg#--format=}" ;; esac; done\n'
        f'echo "$job $format" >> {tmp_path}/asked.log\n'
        + (f"sleep {delay}\n" if delay else "")
        + 'case "$job" in\n'
        f"{cases}\n"
        "  *) echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1 ;;\n"
        "esac\n"
    )
    script.chmod(0o755)
    return script


def asked(tmp_path: Path) -> list[str]:
    log = tmp_path / "asked.log"
    return log.read_text().splitlines() if log.exists() else []


def test_a_job_is_asked_once_and_kept(tmp_path: Path) -> None:
    clock = Clock()
    slurm = SlurmJobs(str(squeue(tmp_path, {"4242": "prod|high"})), ttl=600, clock=clock)
    assert slurm.lookup("4242") == SlurmJob(partition="prod", qos="high")
    clock.now += 599
    assert slurm.lookup("4242") == SlurmJob(partition="prod", qos="high")
    assert asked(tmp_path) == ["4242 %P|%q"]
    clock.now += 2
    slurm.lookup("4242")
    assert len(asked(tmp_path)) == 2


def test_a_job_slurm_does_not_know_is_asked_again_later(tmp_path: Path) -> None:
    clock = Clock()
    slurm = SlurmJobs(str(squeue(tmp_path, {})), retry=60, clock=clock)
    assert slurm.lookup("7") is None
    clock.now += 30
    assert slurm.lookup("7") is None
    assert len(asked(tmp_path)) == 1
    clock.now += 31
    assert slurm.lookup("7") is None
    assert len(asked(tmp_path)) == 2


@pytest.mark.parametrize("job", ["", "12a", "1;rm -rf /", "-1", "$(id)"])
def test_only_job_numbers_are_asked_about(tmp_path: Path, job: str) -> None:
    slurm = SlurmJobs(str(squeue(tmp_path, {})))
    assert slurm.lookup(job) is None
    assert asked(tmp_path) == []


@pytest.mark.parametrize("answer", ["", "prod", "a|b\nc|d"])
def test_an_answer_that_is_not_one_line_is_no_answer(tmp_path: Path, answer: str) -> None:
    slurm = SlurmJobs(str(squeue(tmp_path, {"5": answer})))
    assert slurm.lookup("5") is None


def test_a_stuck_slurmctld_is_left_alone_for_the_backoff(tmp_path: Path) -> None:
    clock = Clock()
    stuck = squeue(tmp_path, {"5": "prod|normal"}, delay=5)
    slurm = SlurmJobs(str(stuck), timeout=0.2, backoff=60, clock=clock)
    assert slurm.lookup("5") is None  # timed out
    clock.now += 59
    assert slurm.lookup("5") is None
    assert slurm.lookup("6") is None
    assert len(asked(tmp_path)) == 1  # nobody was asked during the backoff
    clock.now += 2
    assert slurm.lookup("6") is None
    assert len(asked(tmp_path)) == 2


def test_slurm_is_there_when_squeue_is_on_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert SlurmJobs.detect() is None
    script = squeue(tmp_path, {})
    monkeypatch.setenv("PATH", str(tmp_path))
    found = SlurmJobs.detect()
    assert found is not None
    assert found.squeue == str(script)
