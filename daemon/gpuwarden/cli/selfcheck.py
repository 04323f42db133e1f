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
import stat
import tempfile
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gpuwarden import config as config_file
from gpuwarden.config import CloudProfile, Config
from gpuwarden.errors import InputError

Severity = Literal["ok", "warning", "error"]

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


@dataclass(frozen=True)
class Finding:
    check: str
    ok: bool
    severity: Severity
    detail: str
    fix: str | None = None  # always given when not ok


def _ok(check: str, detail: str) -> Finding:
    return Finding(check, True, "ok", detail)


def _warn(check: str, detail: str, fix: str) -> Finding:
    return Finding(check, False, "warning", detail, fix)


def _fail(check: str, detail: str, fix: str) -> Finding:
    return Finding(check, False, "error", detail, fix)


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
        return _ok("nvml", f"not used (source: {source})")
    try:
        import pynvml
    except ImportError:
        return _warn("nvml", "nvidia-ml-py is not installed", "pip install nvidia-ml-py")
    try:
        pynvml.nvmlInit()
    except (pynvml.NVMLError, pynvml.NVMLLibraryMismatchError) as exc:
        from gpuwarden.sources.nvml import unavailable  # the same words the source uses

        problem = unavailable(exc)
        fix = problem.hint or "install the NVIDIA driver"
        if "scenario" not in fix:
            fix += "; or use --source scenario:FILE to rehearse without a GPU"
        return _warn("nvml", problem.message, fix)
    try:
        count = int(pynvml.nvmlDeviceGetCount())
    except pynvml.NVMLError as exc:
        return _warn("nvml", f"NVML started but cannot count GPUs: {exc}", "run nvidia-smi")
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
    if count == 0:
        return _warn("nvml", "NVML works but sees no GPU", "check nvidia-smi -L")
    return _ok("nvml", f"reachable, {count} GPU(s)")


# --- permissions --------------------------------------------------------------------------


def _cap_fix(cap: str, why: str) -> str:
    return f"run as root or grant {cap} ({why}): add {cap} to {UNIT_LINE}"


def check_signal(pid: int, caps: set[str] | None) -> Finding:
    try:
        os.kill(pid, 0)
    except PermissionError:
        return _warn(
            "signal",
            f"cannot signal PID {pid} (EPERM): checkpoint, suspend and kill steps will fail "
            "on other users' processes",
            _cap_fix("CAP_KILL", "signal other users' processes"),
        )
    except ProcessLookupError:
        return _warn("signal", f"probe PID {pid} does not exist", "probe another PID")
    if os.geteuid() != 0 and caps is not None and "CAP_KILL" not in caps:
        return _warn(
            "signal",
            f"PID {pid} can be signalled (same user), but CAP_KILL is missing",
            _cap_fix("CAP_KILL", "signal other users' processes"),
        )
    return _ok("signal", f"may signal other users' processes (probed PID {pid})")


def check_renice(pid: int, caps: set[str] | None) -> Finding:
    try:
        os.getpriority(os.PRIO_PROCESS, pid)
    except OSError as exc:
        return _warn(
            "renice",
            f"cannot read the priority of PID {pid} ({exc.strerror})",
            _cap_fix("CAP_SYS_NICE", "renice and restore other users' processes"),
        )
    if os.geteuid() == 0 and (caps is None or "CAP_SYS_NICE" in caps):
        return _ok("renice", "root with CAP_SYS_NICE: may renice and restore any process")
    if caps is not None and "CAP_SYS_NICE" in caps:
        return _ok("renice", "CAP_SYS_NICE: may renice and restore any process")
    return _warn(
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
        return _warn(
            "environ",
            f"cannot read /proc/{pid}/environ: env: match rules and GPUWARDEN_PRIORITY / "
            "checkpoint opt-ins of other users' jobs are not seen",
            f"run as root or grant CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH: add both to {UNIT_LINE}",
        )
    except OSError as exc:
        return _warn("environ", f"cannot read /proc/{pid}/environ ({exc.strerror})", "check /proc")
    return _ok("environ", f"may read other users' environments (probed PID {pid})")


# --- files --------------------------------------------------------------------------------


def check_state_dir(path: Path) -> Finding:
    try:
        if not path.is_dir():
            path.mkdir(mode=0o700, parents=True)
        fd, probe = tempfile.mkstemp(prefix=".doctor-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return _fail(
            "state_dir",
            f"{path} is not a writable directory ({exc.strerror or type(exc).__name__})",
            f"create {path} owned by the daemon's user with mode 0700, or set state_dir: "
            "(StateDirectory=gpuwarden in the unit)",
        )
    return _ok("state_dir", f"{path} is writable")


def check_file_mode(path: Path, *, insecure: bool) -> Finding:
    check = f"mode {path}"
    try:
        info = path.stat()
    except OSError as exc:
        return _fail(check, f"cannot stat {path} ({exc.strerror})", f"check that {path} exists")
    problems = []
    if info.st_mode & 0o022:
        problems.append(f"writable by group or other (mode {stat.filemode(info.st_mode)})")
    if info.st_uid not in (0, os.geteuid()):
        problems.append(f"owned by uid {info.st_uid}, neither root nor this user")
    if not problems:
        return _ok(check, "owned by root or this user, not writable by others")
    fix = f"chmod go-w {path}" if info.st_mode & 0o022 else f"chown root {path}"
    detail = f"{path} is " + " and ".join(problems) + ": anyone who can edit it controls kills"
    if insecure:
        return _warn(check, detail + " (allowed by --insecure-permissions)", fix)
    return _fail(check, detail, fix + " (or start with --insecure-permissions)")


def _guarded_paths(config_path: Path | None, playbook_paths: Sequence[Path]) -> list[Path]:
    from gpuwarden.playbook.loader import playbook_files

    found = [config_path] if config_path is not None else []
    found += [p for p in playbook_paths if p.is_dir()]
    found += playbook_files(playbook_paths)
    return list(dict.fromkeys(found))


def load_config(config_path: Path) -> tuple[Config | None, Finding]:
    try:
        loaded = config_file.load(config_path)
    except InputError as exc:
        return None, _fail("config", exc.render(), f"correct {config_path} (gpuwarden check)")
    except OSError as exc:
        return None, _fail("config", f"cannot read {config_path} ({exc.strerror})", "check it")
    return loaded, _ok("config", f"{config_path} loads")


def check_playbooks(paths: Sequence[Path], config: Config) -> Finding:
    from gpuwarden.playbook.loader import load

    try:
        loaded = load(paths, config)
    except InputError as exc:
        return _fail("playbooks", exc.render(), "correct the playbooks (gpuwarden check)")
    except OSError as exc:
        return _fail("playbooks", f"cannot read the playbooks ({exc.strerror})", "check them")
    return _ok("playbooks", f"{len(loaded.rules)} rule(s) in {len(loaded.files)} file(s) load")


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
            findings.append(_fail(check, str(exc), "provide the secret the target names"))
            continue
        if not parse:
            findings.append(_ok(check, f"{len(urls)} URL(s) found"))
            continue
        if config.notify.targets[name].type == "alertmanager":
            findings.append(_alertmanager_urls(check, urls))
            continue
        import apprise

        bad = [u for u in urls if not apprise.Apprise().add(u)]
        if bad:
            shown = ", ".join(redact_url(u) for u in bad)
            findings.append(
                _fail(check, f"apprise does not accept {shown}", "correct the apprise URL")
            )
        else:
            findings.append(_ok(check, f"{len(urls)} URL(s) parse"))
    return findings


def _alertmanager_urls(check: str, urls: list[str]) -> Finding:
    """An Alertmanager target's URLs (read from its secrets): http or https base URLs."""
    from gpuwarden.notify.routing import redact_url

    bad = [u for u in urls if urllib.parse.urlsplit(u.strip()).scheme not in ("http", "https")]
    if bad:
        shown = ", ".join(redact_url(u) for u in bad)
        return _fail(check, f"not an Alertmanager URL: {shown}", "write http(s)://host:9093")
    return _ok(check, f"{len(urls)} Alertmanager URL(s) parse")


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
                _warn(
                    check,
                    "boto3 is not installed: provision steps fail",
                    "pip install 'gpuwarden[cloud]'",
                )
            )
            continue
        if found:
            findings.append(_ok(check, f"AWS credentials found for profile {name}"))
        else:
            findings.append(
                _warn(
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
    guarded = _guarded_paths(config_path, paths)
    modes = [check_file_mode(p, insecure=insecure_permissions) for p in guarded]
    findings += [f for f in modes if not f.ok]
    if all(f.ok for f in modes):
        findings.append(
            _ok("modes", f"{len(guarded)} config and playbook path(s) safe from other users")
        )
    if config is not None or config_path is None:
        findings.append(check_playbooks(paths, usable))
        findings += check_notify(usable, parse=parse_urls)
        findings += check_cloud(usable, cloud_credentials)
    return findings


def blocking(findings: Sequence[Finding]) -> list[Finding]:
    """The findings that keep ``gpuwarden run`` from starting: every error."""
    return [f for f in findings if f.severity == "error"]
