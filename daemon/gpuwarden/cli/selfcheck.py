"""Self-checks: what ``gpuwarden doctor`` shows and what ``gpuwarden run`` checks at start.

Each check gives one ``Finding``: ok, a warning (the daemon works, with less power) or an
error (it must not run like this), and, whenever it is not ok, what to do about it.
Permissions are probed the way earlyoom does it: try the harmless form of the real call
(signal 0, reading a priority, opening another process's environment) on a process that is
not ours, and read the effective capabilities from ``/proc/self/status``.

Nothing here sends a notification, changes a process or calls a cloud API: notification
URLs are only parsed, and cloud credentials only looked up.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import tempfile
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path

from gpuwarden import config as config_file
from gpuwarden import pathsafety
from gpuwarden.cli import hardening
from gpuwarden.cli.findings import Finding, Severity, fail, ok, warn
from gpuwarden.config import CloudProfile, Config
from gpuwarden.errors import InputError

__all__ = ["Finding", "Severity", "blocking", "run_checks"]

# Capability bit numbers (linux/capability.h).
CAPABILITY_BITS = {
    "CAP_CHOWN": 0,
    "CAP_DAC_OVERRIDE": 1,
    "CAP_DAC_READ_SEARCH": 2,
    "CAP_FOWNER": 3,
    "CAP_KILL": 5,
    "CAP_SETUID": 7,
    "CAP_SYS_PTRACE": 19,
    "CAP_SYS_ADMIN": 21,
    "CAP_SYS_NICE": 23,
    "CAP_SYS_RESOURCE": 24,
}
UNIT_LINE = "AmbientCapabilities= / CapabilityBoundingSet= in systemd/gpuwarden.service"
DEFAULT_PROBE_PID = 1


def capabilities(capeff_hex: str) -> set[str]:
    """The names (of those in ``CAPABILITY_BITS``) set in a ``CapEff:`` hex mask."""
    mask = int(capeff_hex.strip(), 16)
    return {name for name, bit in CAPABILITY_BITS.items() if mask >> bit & 1}


def own_capabilities(status_path: Path = Path("/proc/self/status")) -> set[str] | None:
    """This process's effective capabilities; None when they cannot be read."""
    try:
        text = status_path.read_text(encoding="ascii")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key == "CapEff":
            try:
                return capabilities(value)
            except ValueError:
                return None
    return None


# --- NVML ---------------------------------------------------------------------------------


def check_nvml(source: str) -> Finding:
    if source != "nvml":
        return ok("nvml", f"not used (source: {source})")
    try:
        import pynvml
    except ImportError:
        return warn("nvml", "nvidia-ml-py is not installed", "pip install nvidia-ml-py")
    try:
        pynvml.nvmlInit()
    except (pynvml.NVMLError, pynvml.NVMLLibraryMismatchError) as exc:
        from gpuwarden.sources.nvml import unavailable  # the same words the source uses

        problem = unavailable(exc)
        fix = problem.hint or "install the NVIDIA driver"
        if "scenario" not in fix:
            fix += "; or use --source scenario:FILE to rehearse without a GPU"
        return warn("nvml", problem.message, fix)
    try:
        count = int(pynvml.nvmlDeviceGetCount())
    except pynvml.NVMLError as exc:
        return warn("nvml", f"NVML started but cannot count GPUs: {exc}", "run nvidia-smi")
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
    if count == 0:
        return warn("nvml", "NVML works but sees no GPU", "check nvidia-smi -L")
    return ok("nvml", f"reachable, {count} GPU(s)")


# --- permissions --------------------------------------------------------------------------


def _cap_fix(cap: str, why: str) -> str:
    return f"run as root or grant {cap} ({why}): add {cap} to {UNIT_LINE}"


def check_signal(pid: int, caps: set[str] | None) -> Finding:
    try:
        os.kill(pid, 0)
    except PermissionError:
        return warn(
            "signal",
            f"cannot signal PID {pid} (EPERM): checkpoint, suspend and kill steps will fail "
            "on other users' processes",
            _cap_fix("CAP_KILL", "signal other users' processes"),
        )
    except ProcessLookupError:
        return warn("signal", f"probe PID {pid} does not exist", "probe another PID")
    if os.geteuid() != 0 and caps is not None and "CAP_KILL" not in caps:
        return warn(
            "signal",
            f"PID {pid} can be signalled (same user), but CAP_KILL is missing",
            _cap_fix("CAP_KILL", "signal other users' processes"),
        )
    return ok("signal", f"may signal other users' processes (probed PID {pid})")


def check_renice(pid: int, caps: set[str] | None) -> Finding:
    try:
        os.getpriority(os.PRIO_PROCESS, pid)
    except OSError as exc:
        return warn(
            "renice",
            f"cannot read the priority of PID {pid} ({exc.strerror})",
            _cap_fix("CAP_SYS_NICE", "renice and restore other users' processes"),
        )
    if os.geteuid() == 0 and (caps is None or "CAP_SYS_NICE" in caps):
        return ok("renice", "root with CAP_SYS_NICE: may renice and restore any process")
    if caps is not None and "CAP_SYS_NICE" in caps:
        return ok("renice", "CAP_SYS_NICE: may renice and restore any process")
    return warn(
        "renice",
        "CAP_SYS_NICE is missing: renice steps cannot touch other users' processes or "
        "restore a priority afterwards",
        _cap_fix("CAP_SYS_NICE", "renice and restore other users' processes"),
    )


def check_environ(pid: int) -> Finding:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            handle.read(1)
    except PermissionError:
        return warn(
            "environ",
            f"cannot read /proc/{pid}/environ: env: match rules and GPUWARDEN_PRIORITY / "
            "checkpoint opt-ins of other users' jobs are not seen",
            f"run as root or grant CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH: add both to {UNIT_LINE}",
        )
    except OSError as exc:
        return warn("environ", f"cannot read /proc/{pid}/environ ({exc.strerror})", "check /proc")
    return ok("environ", f"may read other users' environments (probed PID {pid})")


# --- files --------------------------------------------------------------------------------


def check_state_dir(path: Path) -> Finding:
    try:
        if not path.is_dir():
            path.mkdir(mode=0o700, parents=True)
        fd, probe = tempfile.mkstemp(prefix=".doctor-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return fail(
            "state_dir",
            f"{path} is not a writable directory ({exc.strerror or type(exc).__name__})",
            f"create {path} owned by the daemon's user with mode 0700, or set state_dir: "
            "(StateDirectory=gpuwarden in the unit)",
        )
    return ok("state_dir", f"{path} is writable")


def check_modes(
    config_path: Path | None, playbook_paths: Sequence[Path], *, insecure: bool
) -> list[Finding]:
    """The config, the playbook directories and files, and every directory above them up to
    ``/``: owned by root or this user, writable by nobody else (``gpuwarden.pathsafety``; a
    root-owned sticky directory such as /tmp is accepted). Reload checks the same."""
    from gpuwarden.reload import loaded_paths

    guarded = loaded_paths(config_path, playbook_paths)
    found = pathsafety.unsafe(guarded)
    if not found:
        return [
            ok(
                "modes",
                f"{len(guarded)} config and playbook path(s), and the directories above them, "
                "safe from other users",
            )
        ]
    findings = []
    for bad in found:
        check = f"mode {bad.path}"
        detail = f"{bad}: whoever can change it controls what gpuwarden does"
        if insecure:
            findings.append(warn(check, detail + " (allowed by --insecure-permissions)", bad.fix))
        else:
            findings.append(
                fail(check, detail, bad.fix + " (or start with --insecure-permissions)")
            )
    return findings


def check_ack_spool(path: Path) -> Finding:
    """The acknowledgement spool: usable as it is, or creatable where it would go. Nothing is
    created here (the first checkpoint request creates it)."""
    check = "ack_spool"
    problems = pathsafety.path_problems(path)
    if not problems and path.exists():
        try:
            os.close(pathsafety.open_directory(path))
        except OSError as exc:
            problems = [pathsafety.Unsafe(str(path), str(exc), "give ack_spool a real directory")]
    if problems:
        first = problems[0]
        return warn(
            check,
            f"{first}: checkpoint steps will ask no job (their acknowledgements could be forged)",
            f"{first.fix}, or set ack_spool: to a directory only root can write",
        )
    if not path.exists():
        return ok(check, f"{path} is created at the first checkpoint request")
    return ok(check, f"{path} is safe from other users")


def check_exec_user(config: Config) -> Finding:
    """The user exec steps run as exists here."""
    import pwd

    user = config.exec.user
    try:
        uid = pwd.getpwnam(user).pw_uid
    except KeyError:
        return warn(
            "exec_user",
            f"exec.user {user!r} is not a user on this host: exec steps fail (unless as_root)",
            f"create the user {user!r}, or set exec.user: to an unprivileged user that exists",
        )
    if uid == 0:
        return warn(
            "exec_user",
            f"exec.user {user!r} is root: exec steps keep root's privileges",
            "set exec.user: to an unprivileged user (the default is nobody)",
        )
    return ok("exec_user", f"exec steps run as {user} (uid {uid}), without capabilities")


def check_operators(config: Config) -> Finding | None:
    """The config's ``operators.group`` exists here (None: no operators group is set)."""
    import grp

    group = config.operators.group
    if group is None:
        return None
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        return fail(
            "operators",
            f"operators.group {group!r} is not a group on this host: run refuses to start (exit 2)",
            f"create it (groupadd {group}) or change operators.group in the config",
        )
    return ok("operators", f"members of {group} (gid {gid}) use the control socket")


def load_config(config_path: Path) -> tuple[Config | None, Finding]:
    try:
        loaded = config_file.load(config_path)
    except InputError as exc:
        return None, fail("config", exc.render(), f"correct {config_path} (gpuwarden check)")
    except OSError as exc:
        return None, fail("config", f"cannot read {config_path} ({exc.strerror})", "check it")
    return loaded, ok("config", f"{config_path} loads")


def check_playbooks(paths: Sequence[Path], config: Config) -> Finding:
    from gpuwarden.playbook.loader import load

    try:
        loaded = load(paths, config)
    except InputError as exc:
        return fail("playbooks", exc.render(), "correct the playbooks (gpuwarden check)")
    except OSError as exc:
        return fail("playbooks", f"cannot read the playbooks ({exc.strerror})", "check them")
    return ok("playbooks", f"{len(loaded.rules)} rule(s) in {len(loaded.files)} file(s) load")


# --- notifications and cloud --------------------------------------------------------------


def check_notify(config: Config, *, parse: bool = True) -> list[Finding]:
    from gpuwarden.notify.routing import redact_url
    from gpuwarden.notify.service import resolver

    urls_of = resolver(config)
    findings = []
    for name in sorted(config.notify.targets):
        check = f"notify {name}"
        try:
            urls = urls_of(name)
        except (ValueError, OSError) as exc:  # SecretError names the secret, never its value
            findings.append(fail(check, str(exc), "provide the secret the target names"))
            continue
        if not parse:
            findings.append(ok(check, f"{len(urls)} URL(s) found"))
            continue
        if config.notify.targets[name].type == "alertmanager":
            findings.append(_alertmanager_urls(check, urls))
            continue
        import apprise

        bad = [u for u in urls if not apprise.Apprise().add(u)]
        if bad:
            shown = ", ".join(redact_url(u) for u in bad)
            findings.append(
                fail(check, f"apprise does not accept {shown}", "correct the apprise URL")
            )
        else:
            findings.append(ok(check, f"{len(urls)} URL(s) parse"))
    return findings


def _alertmanager_urls(check: str, urls: list[str]) -> Finding:
    """An Alertmanager target's URLs (read from its secrets): http or https base URLs."""
    from gpuwarden.notify.routing import redact_url

    bad = [u for u in urls if urllib.parse.urlsplit(u.strip()).scheme not in ("http", "https")]
    if bad:
        shown = ", ".join(redact_url(u) for u in bad)
        return fail(check, f"not an Alertmanager URL: {shown}", "write http(s)://host:9093")
    return ok(check, f"{len(urls)} Alertmanager URL(s) parse")


def aws_credentials(profile: CloudProfile) -> bool:
    """Whether boto3's default chain finds credentials; raises ImportError without boto3."""
    # A lookup only: nothing is called in the cloud. Imported by name: boto3 is optional.
    boto3 = importlib.import_module("boto3")
    return boto3.Session(region_name=profile.region).get_credentials() is not None


def check_cloud(
    config: Config, credentials: Callable[[CloudProfile], bool] = aws_credentials
) -> list[Finding]:
    findings = []
    for name, profile in sorted(config.cloud.profiles.items()):
        check = f"cloud {name}"
        try:
            found = credentials(profile)
        except ImportError:
            findings.append(
                warn(
                    check,
                    "boto3 is not installed: provision steps fail",
                    "pip install 'gpuwarden[cloud]'",
                )
            )
            continue
        if found:
            findings.append(ok(check, f"AWS credentials found for profile {name}"))
        else:
            findings.append(
                warn(
                    check,
                    "no AWS credentials found",
                    "give the daemon credentials: an instance role, AWS_PROFILE / "
                    "~/.aws/credentials, or AWS_ACCESS_KEY_ID in the unit's EnvironmentFile=",
                )
            )
    return findings


# --- all together -------------------------------------------------------------------------


def run_checks(
    config: Config | None,
    config_path: Path | None,
    playbook_paths: Sequence[str | Path] | None,
    *,
    state_dir: Path | None = None,
    insecure_permissions: bool = False,
    probe_pid: int | None = None,
    cloud_credentials: Callable[[CloudProfile], bool] = aws_credentials,
    parse_urls: bool = True,
) -> list[Finding]:
    """Every check, in a fixed order. ``config``: already loaded (else ``config_path`` is
    loaded, else the defaults); ``playbook_paths`` and ``state_dir`` default to the config's.
    ``parse_urls=False`` (the daemon's own start) checks that targets' secrets are there
    without loading apprise to parse the URLs: apprise's plugins cost ~20 MiB of memory."""
    findings: list[Finding] = []
    if config_path is not None:
        loaded, finding = load_config(config_path)
        findings.append(finding)
        config = config or loaded
    usable = config or Config()
    paths = [Path(p) for p in (playbook_paths or [usable.playbooks])]
    findings.append(check_nvml(usable.source))
    pid = DEFAULT_PROBE_PID if probe_pid is None else probe_pid
    caps = own_capabilities()
    findings += [check_signal(pid, caps), check_renice(pid, caps), check_environ(pid)]
    findings.append(check_state_dir(state_dir or usable.state_dir))
    findings.append(check_ack_spool(usable.ack_spool))
    findings.append(check_exec_user(usable))
    operators = check_operators(usable)
    if operators is not None:
        findings.append(operators)
    findings += check_modes(config_path, paths, insecure=insecure_permissions)
    if config is not None or config_path is None:
        findings.append(check_playbooks(paths, usable))
        findings += check_notify(usable, parse=parse_urls)
        findings += check_cloud(usable, cloud_credentials)
        trust = hardening.review(usable, config_path)
        findings += trust or [
            ok(
                "trust",
                "no regex that backtracks, no protected class a job can declare, no "
                "secret readable by other users",
            )
        ]
    return findings


def blocking(findings: Sequence[Finding]) -> list[Finding]:
    """The findings that keep ``gpuwarden run`` from starting: every error."""
    return [f for f in findings if f.severity == "error"]
