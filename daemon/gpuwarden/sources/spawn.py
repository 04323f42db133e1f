"""Start real stand-in processes for a scenario's ``spawn: true`` jobs.

The stand-in's command line is made to read like the job's, so that rules matching on
``cmdline`` see what they would see on a real machine:

- ``python train.py --lr 3e-4``: a stand-in script named ``train.py`` is written to the job's
  work directory and run as ``python train.py --lr 3e-4`` (exactly the declared command line);
- ``python -m pkg.mod args``: a stand-in module ``pkg/mod.py`` is written there instead;
- anything else runs as ``python <workdir>/gpuwarden-standin.py <declared command line>``.

Each stand-in gets its own process group and session (so a kill of the group takes only it),
the job's declared environment plus ``GPUWARDEN_ACK_DIR`` (the daemon's acknowledgement spool,
unless the job declares its own) and ``GPUWARDEN_STANDIN_LOG``, and a minimal environment
otherwise (no secrets of the caller leak into it).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import gpuwarden
from gpuwarden import job

LAUNCHER = (
    "import runpy\n"
    "runpy.run_module('gpuwarden.sources.standin', run_name='__main__', alter_sys=True)\n"
)
_PYTHON = re.compile(r"python[0-9.]*")


@dataclass
class Standin:
    job_id: str
    process: subprocess.Popen[bytes]
    log: Path
    ack_dir: Path  # the spool it acknowledges in

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def ack_file(self) -> Path:
        """Where its acknowledgements land: its user's directory in the spool."""
        return job.user_ack_dir(self.ack_dir) / job.ack_name(self.pid)

    def alive(self) -> bool:
        """Reaps the process if it has exited; False from then on."""
        return self.process.poll() is None

    def signals(self) -> list[str]:
        """Each line the stand-in logged: ``ready …``, ``signal SIGUSR1``, ``ack …``, ``exit …``."""
        try:
            text = self.log.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        return [line.split(" ", 1)[1] for line in text.splitlines() if " " in line]

    def stop(self, timeout: float = 5.0) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, 9)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout)


def _account(name: str) -> tuple[int, int]:
    """(uid, gid) of the user a stand-in runs as; raises ``ValueError`` saying what is wrong."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise ValueError(f"run_as: there is no user {name!r} on this machine") from None
    if os.geteuid() != 0:
        raise ValueError(f"run_as: {name}: only root can start a process as another user")
    return entry.pw_uid, entry.pw_gid


def _argv(cmdline: tuple[str, ...], workdir: Path) -> list[str]:
    first = PurePosixPath(cmdline[0]).name
    if _PYTHON.fullmatch(first) and len(cmdline) > 1:
        script = cmdline[1]
        if script.endswith(".py") and not script.startswith("-"):
            relative = PurePosixPath(script.lstrip("/"))
            target = workdir / relative
            if ".." not in relative.parts:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(LAUNCHER, encoding="utf-8")
                return [cmdline[0], str(relative), *cmdline[2:]]
        if script == "-m" and len(cmdline) > 2 and re.fullmatch(r"[A-Za-z_][\w.]*", cmdline[2]):
            parts = cmdline[2].split(".")
            package = workdir.joinpath(*parts[:-1])
            package.mkdir(parents=True, exist_ok=True)
            for depth in range(1, len(parts)):
                (workdir.joinpath(*parts[:depth]) / "__init__.py").touch()
            (package / f"{parts[-1]}.py").write_text(LAUNCHER, encoding="utf-8")
            return list(cmdline)
    launcher = workdir / "gpuwarden-standin.py"
    launcher.write_text(LAUNCHER, encoding="utf-8")
    return [sys.executable, str(launcher), *cmdline]


def spawn(
    job_id: str,
    cmdline: tuple[str, ...],
    env: dict[str, str],
    workdir: Path,
    *,
    on_term: str = "exit",
    ack: str = "0",
    ready_timeout: float = 10.0,
    ack_spool: Path | None = None,
    run_as: str | None = None,
) -> Standin:
    """Start one stand-in and wait until its signal handlers are installed. It acknowledges
    in ``ack_spool`` (default: ``gpuwarden.job.DEFAULT_ACK_DIR``) unless ``env`` names its
    own ``GPUWARDEN_ACK_DIR``. ``run_as``: the user it runs as (we must be root). It is
    started as us and drops to that user itself, before it installs anything: the
    interpreter may live where only root can read it."""
    workdir.mkdir(parents=True, exist_ok=True)
    owner = _account(run_as) if run_as is not None else None
    log = workdir / f"{job_id}.signals.log"
    log.unlink(missing_ok=True)
    ack_dir = Path(env.get("GPUWARDEN_ACK_DIR") or ack_spool or job.DEFAULT_ACK_DIR)
    package_root = str(Path(gpuwarden.__file__).resolve().parent.parent)
    child_env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": package_root,
        "PYTHONDONTWRITEBYTECODE": "1",
        "LANG": "C.UTF-8",
        **env,
        "GPUWARDEN_ACK_DIR": str(ack_dir),
        "GPUWARDEN_STANDIN_LOG": str(log),
        "GPUWARDEN_STANDIN_ON_TERM": on_term,
        "GPUWARDEN_STANDIN_ACK": ack,
    }
    argv = _argv(cmdline, workdir)
    if owner is not None:
        child_env["GPUWARDEN_STANDIN_USER"] = f"{owner[0]}:{owner[1]}"
        workdir.parent.chmod(workdir.parent.stat().st_mode | 0o111)  # it may pass, not list
        for path in (workdir, *workdir.rglob("*")):
            os.chown(path, owner[0], owner[1])
    process = subprocess.Popen(
        argv,
        executable=sys.executable,
        cwd=workdir,
        env=child_env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    standin = Standin(job_id, process, log, ack_dir)
    deadline = time.monotonic() + ready_timeout
    while not any(line.startswith("ready") for line in standin.signals()):
        if process.poll() is not None:
            raise RuntimeError(
                f"stand-in for job {job_id!r} exited at start (status {process.returncode})"
            )
        if time.monotonic() > deadline:
            standin.stop()
            raise RuntimeError(
                f"stand-in for job {job_id!r} did not start within {ready_timeout:g}s"
            )
        time.sleep(0.01)
    return standin
