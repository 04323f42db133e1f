"""``gpuwarden cloud``, ``cloud reap``, ``check``'s credential warnings and the drill's cloud
lines, as a user runs them: the real CLI in a subprocess, a real EC2 API (moto on 127.0.0.1),
a real journal file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuwarden import config
from gpuwarden.cloud import tags
from gpuwarden.cloud.instance import Managed
from gpuwarden.cloud.service import CloudService
from gpuwarden.cloud.store import InstanceStore
from gpuwarden.errors import ExitCode
from gpuwarden.model import Intent, Reason
from tests.cli_runner import gpuwarden as run_gpuwarden
from tests.cloud_server import (  # noqa: F401
    KEY,
    REGION,
    MotoEc2,
    fixture_aws_env,
    fixture_fresh_ec2,
    fixture_moto_ec2,
)

ROOT = Path(__file__).resolve().parent.parent
HOST = "gpu-test-7"
UNREACHABLE = "http://127.0.0.1:9"  # the discard port: nothing listens there
PRICES = {"g5.xlarge": 1.006, "g5.2xlarge": 1.212}


def gpuwarden(
    *args: str | Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return run_gpuwarden(*args, env=env, timeout=120)


def profile(endpoint: str, ami: str = "ami-0123456789abcdef0", **overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "region": REGION,
        "instance_types": ["g5.xlarge", "g5.2xlarge"],
        "ami": ami,
        "count": 1,
        "max_instances": 3,
        "max_hourly_usd": 10,
        "prices": PRICES,
        "ttl": "8h",
        "linger": "30m",
        "endpoint_url": endpoint,
    }
    fields.update(overrides)
    return fields


def write_config(tmp_path: Path, profiles: dict[str, Any]) -> Path:
    path = tmp_path / "gpuwarden.yaml"
    document = {
        "host": HOST,
        "state_dir": str(tmp_path / "state"),
        "playbooks": str(tmp_path / "playbooks"),
        "cloud": {"profiles": profiles},
        # A rule that can launch must be able to tell someone, or an armed check fails;
        # nothing is ever sent to this address by the tests that name it.
        "notify": {"targets": {"team": {"urls": ["json://127.0.0.1:9/team"]}}},
    }
    path.write_text(yaml.safe_dump(document))
    return path


def journal(tmp_path: Path) -> Path:
    return tmp_path / "state" / "journal.db"


def instance(launched_at: float, **changes: Any) -> Managed:
    """A journal row of one g5.xlarge launched at ``launched_at`` (8 h ttl), changed as asked."""
    fields: dict[str, Any] = {
        "instance_id": "i-0123456789abcdef0",
        "profile": "burst",
        "region": REGION,
        "instance_type": "g5.xlarge",
        "market": "on-demand",
        "state": "running",
        "launched_at": launched_at,
        "expires_at": launched_at + 8 * 3600,
        "host": HOST,
    }
    fields.update(changes)
    return Managed(**fields)


def intent(incident: str, step: int = 1, *, at: float | None = None) -> Intent:
    return Intent(
        id=f"{incident}/{step}",
        incident=incident,
        rule="burst-when-hot",
        scope="gpu0",
        step=step,
        kind="provision",
        label="provision",
        time=time.time() if at is None else at,  # planned when it is launched
        reason=Reason.STEP_DUE,
        severity="critical",
    )


class Go:
    def wait(self, seconds: float) -> bool:
        del seconds
        return True


def launch(path: Path, incident: str, *, count: int = 1, now: float | None = None) -> list[str]:
    """Launch through gpuwarden's own cloud service, as the daemon would; the new ids."""
    cfg = config.load(path)
    with InstanceStore.open(journal(path.parent)) as store:
        service = CloudService(cfg.cloud, store, host=HOST)
        before = {m.instance_id for m in store.all()}
        at = time.time() if now is None else now
        outcome = service.provision(
            intent(incident, at=at),
            "burst",
            count,
            dry_run=False,
            now=at,
            waiter=Go(),
        )
        assert outcome.ok, outcome.detail
        return [m.instance_id for m in store.all() if m.instance_id not in before]


def stray_instance(server: MotoEc2, incident: str) -> str:
    """An instance with this host's tags that the journal does not know, as a launch whose
    answer was lost leaves it."""
    pairs = {
        tags.MANAGED: "true",
        tags.HOST: HOST,
        tags.PROFILE: "burst",
        tags.INCIDENT: incident,
        tags.EXPIRES: tags.format_expires(time.time() + 3600),
    }
    return str(
        server.client().run_instances(
            ImageId=server.ami,
            InstanceType="g5.2xlarge",
            MinCount=1,
            MaxCount=1,
            TagSpecifications=[
                {
                    "ResourceType": "instance",
                    "Tags": [{"Key": k, "Value": v} for k, v in pairs.items()],
                }
            ],
        )["Instances"][0]["InstanceId"]
    )


def ec2_state(server: MotoEc2, instance_id: str) -> str:
    reservations = server.client().describe_instances(InstanceIds=[instance_id])["Reservations"]
    return str(reservations[0]["Instances"][0]["State"]["Name"])


def stored(path: Path, instance_id: str) -> Managed:
    with InstanceStore.open_readonly(journal(path.parent)) as store:
        found = store.get(instance_id)
    assert found is not None
    return found


def row_of(stdout: str, instance_id: str) -> list[str]:
    (line,) = [line for line in stdout.splitlines() if line.startswith(instance_id)]
    return line.split()


# -- gpuwarden cloud ------------------------------------------------------------------------------


def test_cloud_shows_ec2s_truth_and_offline_the_journals(
    fresh_ec2: MotoEc2, tmp_path: Path
) -> None:
    path = write_config(tmp_path, {"burst": profile(fresh_ec2.endpoint_url, fresh_ec2.ami)})
    first, second = launch(path, "inc-hot-gpu0", count=2, now=time.time() - 1800)
    stray = stray_instance(fresh_ec2, "inc-lost")
    # Behind gpuwarden's back.
    fresh_ec2.client().terminate_instances(InstanceIds=[second])

    result = gpuwarden("cloud", "--config", path)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    out = result.stdout
    assert out.splitlines()[0].split() == [
        "ID", "PROFILE", "TYPE", "STATE", "INCIDENT", "AGE", "EXPIRES", "IN", "COST",
    ]  # fmt: skip
    row = row_of(out, first)
    assert row[1:5] == ["burst", "g5.xlarge", "running", "inc-hot-gpu0"]
    assert row[5].startswith("30m")  # age
    assert row[6] in {"7h30m", "7h29m"}  # expires in
    assert row[7] == "$0.50"
    assert row_of(out, second)[3] == "terminated"
    assert row_of(out, second)[6] == "ended"
    assert row_of(out, stray)[1:5] == ["burst", "g5.2xlarge", "running", "inc-lost"]
    assert out.splitlines()[-1].startswith("total: 2 live, $2.22/h; spent so far $1.0")
    assert "journal" not in out

    listed = json.loads(gpuwarden("cloud", "--config", path, "--json").stdout)
    by_id = {item["instance_id"]: item for item in listed}
    assert set(by_id) == {first, second, stray}
    one = by_id[first]
    assert set(one) >= {
        "instance_id", "profile", "region", "instance_type", "market", "state", "launched_at",
        "expires_at", "host", "incident", "rule", "step", "intent", "subnet", "hourly_usd",
        "terminated_at", "end_reason", "adopted", "age_s", "cost_usd", "expires_in_s",
    }  # fmt: skip
    assert (one["state"], one["host"], one["rule"], one["step"]) == (
        "running", HOST, "burst-when-hot", 1,
    )  # fmt: skip
    assert one["age_s"] == pytest.approx(1800, abs=60)
    assert one["cost_usd"] == pytest.approx(1.006 / 2, abs=0.02)
    assert one["expires_in_s"] == pytest.approx(7.5 * 3600, abs=60)
    assert by_id[second]["state"] == "terminated"
    assert by_id[second]["expires_in_s"] is None
    assert by_id[stray]["adopted"] is True

    # The listing wrote nothing: the journal still has the state EC2 gave at launch.
    assert stored(path, second).state == "pending"
    offline = gpuwarden("cloud", "--config", path, "--offline")
    assert offline.returncode == 0, offline.stderr
    assert row_of(offline.stdout, second)[3] == "pending"
    assert stray not in offline.stdout  # only EC2 knows it
    assert "states: as last recorded in the journal" in offline.stdout
    offline_json = json.loads(gpuwarden("cloud", "--config", path, "--json", "--offline").stdout)
    assert {i["instance_id"]: i["state"] for i in offline_json} == {
        first: "pending",
        second: "pending",
    }


@pytest.mark.usefixtures("aws_env")
def test_when_ec2_cannot_be_asked_the_journal_is_shown_and_said_so(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"burst": profile(UNREACHABLE)})
    now = time.time()
    with InstanceStore.open(journal(tmp_path)) as store:
        store.add(
            instance(
                now - 600,
                instance_type="p5.48xlarge",  # not in the price table
                market="spot",
                expires_at=now - 60,
            ),
            now,
        )
    result = gpuwarden("cloud", "--config", path)
    assert result.returncode == 0, result.stderr
    (problem,) = result.stderr.splitlines()
    assert problem.startswith("gpuwarden: cloud profile burst: ")
    assert "cannot reach EC2" in problem
    row = row_of(result.stdout, "i-0123456789abcdef0")
    assert row[1:5] == ["burst", "p5.48xlarge", "running", "-"]
    assert row[5].startswith("10m")
    assert row[6:] == ["expired", "—"]
    assert "total: 1 live, $0.00/h + 1 unpriced" in result.stdout
    assert result.stdout.splitlines()[-1] == (
        "states of profile burst: as last recorded in the journal "
        "(EC2 could not be asked, see above)"
    )


def test_without_a_journal_or_profiles(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"burst": profile(UNREACHABLE)})
    result = gpuwarden("cloud", "--config", path)
    assert result.returncode == ExitCode.FAILURE
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"gpuwarden: no journal at {journal(tmp_path)}",
        f"  hint: the daemon writes it in its state_dir ({tmp_path / 'state'}) once it has run; "
        "give the daemon's --config or --state-dir to read its journal",
    ]
    reap = gpuwarden("cloud", "reap", "--config", path)
    assert reap.returncode == ExitCode.FAILURE
    assert reap.stderr.startswith(f"gpuwarden: no journal at {journal(tmp_path)}\n  hint: ")
    assert not journal(tmp_path).exists()  # the reaper does not start a journal of its own
    bare = write_config(tmp_path, {})
    for args in (["cloud"], ["cloud", "reap"], ["cloud", "--offline"]):
        result = gpuwarden(*args, "--config", bare)
        assert (result.returncode, result.stdout, result.stderr) == (
            0,
            "no cloud profiles configured\n",
            "",
        )
    assert json.loads(gpuwarden("cloud", "--json", "--config", bare).stdout) == []
    assert not journal(tmp_path).exists()  # reading made no journal


# -- gpuwarden cloud reap -------------------------------------------------------------------------


def test_reap_dry_run_terminates_nothing_and_reap_ends_what_is_past_its_ttl(
    fresh_ec2: MotoEc2, tmp_path: Path
) -> None:
    path = write_config(tmp_path, {"burst": profile(fresh_ec2.endpoint_url, fresh_ec2.ami)})
    (old,) = launch(path, "inc-yesterday", now=time.time() - 9 * 3600)  # ttl 8h: overdue
    (new,) = launch(path, "inc-now")

    dry = gpuwarden("cloud", "reap", "--dry-run", "--config", path)
    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.splitlines()
    # The journal learns EC2's states first (launched pending, now running).
    assert sorted(lines[:2]) == sorted(
        f"reconcile: updated {i} pending -> running" for i in (old, new)
    )
    assert lines[2:] == [
        f"would terminate {old} (burst, ttl): past its ttl: expired "
        f"{tags.format_expires(stored(path, old).expires_at)}"
    ]
    assert ec2_state(fresh_ec2, old) == "running"
    assert stored(path, old).state == "running"
    assert stored(path, old).end_reason is None

    reap = gpuwarden("cloud", "--state-dir", tmp_path / "state", "reap", "--config", path)
    assert reap.returncode == 0, reap.stderr
    (line,) = reap.stdout.splitlines()  # nothing left to reconcile
    assert line.startswith(f"terminated {old} (burst, ttl): past its ttl: expired ")
    assert ec2_state(fresh_ec2, old) in {"shutting-down", "terminated"}
    assert ec2_state(fresh_ec2, new) == "running"
    ended = stored(path, old)
    assert (ended.end_reason, ended.live) == ("ttl", False)
    assert ended.terminated_at == pytest.approx(time.time(), abs=60)
    assert stored(path, new).live

    again = gpuwarden("cloud", "reap", "--config", path)
    assert (again.returncode, again.stdout) == (0, "nothing to reap\n")


def test_reap_adopts_what_the_journal_lost_and_notes_what_ended_elsewhere(
    fresh_ec2: MotoEc2, tmp_path: Path
) -> None:
    path = write_config(tmp_path, {"burst": profile(fresh_ec2.endpoint_url, fresh_ec2.ami)})
    (gone,) = launch(path, "inc-a")
    fresh_ec2.client().terminate_instances(InstanceIds=[gone])
    lost = stray_instance(fresh_ec2, "inc-lost")
    result = gpuwarden("cloud", "reap", "--config", path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"reconcile: adopted {lost} (g5.2xlarge, running)",
        f"reconcile: updated {gone} pending -> terminated",
        "nothing to reap",
    ]
    assert (stored(path, gone).state, stored(path, gone).end_reason) == ("terminated", "external")
    adopted = stored(path, lost)
    assert (adopted.adopted, adopted.incident, adopted.state) == (True, "inc-lost", "running")


@pytest.mark.usefixtures("aws_env")
def test_reap_fails_when_ec2_cannot_be_asked(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"burst": profile(UNREACHABLE)})
    InstanceStore.open(journal(tmp_path)).close()
    result = gpuwarden("cloud", "reap", "--config", path)
    assert result.returncode == ExitCode.FAILURE
    assert result.stdout == "nothing to reap\n"
    lines = result.stderr.splitlines()
    assert lines[0].startswith("gpuwarden: cloud profile burst: ")
    assert "cannot reach EC2" in lines[0]
    assert lines[-1].startswith("gpuwarden: cloud reap incomplete: 1 problem")


# -- gpuwarden check ------------------------------------------------------------------------------


def no_credentials(tmp_path: Path) -> dict[str, str]:
    empty = tmp_path / "aws-empty"
    empty.write_text("")
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k != "GPUWARDEN_CONFIG"
    }
    return env | {
        "AWS_SHARED_CREDENTIALS_FILE": str(empty),
        "AWS_CONFIG_FILE": str(empty),
        "AWS_EC2_METADATA_DISABLED": "true",
    }


def check(path: Path, *extra: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuwarden", "check", "--config", str(path), *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def playbook(tmp_path: Path, steps: str = "[notify: team, provision: burst]") -> Path:
    directory = tmp_path / "playbooks"
    directory.mkdir(exist_ok=True)
    (directory / "burst.yaml").write_text(
        "rules:\n"
        "  - name: burst-when-hot\n"
        "    when: gpu.temperature_c >= 90\n"
        "    for: 30s\n"
        f"    steps: {steps}\n"
    )
    return directory


def test_check_warns_about_missing_credentials_and_strict_fails(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"burst": profile(UNREACHABLE)})
    playbook(tmp_path)
    env = no_credentials(tmp_path)
    result = check(path, env=env)
    assert result.returncode == 0, result.stderr
    (warning,) = result.stderr.splitlines()
    assert warning.startswith("warning: cloud profile burst: no AWS credentials found")
    assert "AWS_PROFILE" in warning  # what to do
    assert result.stdout.splitlines()[-1] == "ok: 1 rule(s) in 1 file(s)"

    strict = check(path, "--strict", env=env)
    assert strict.returncode == ExitCode.FAILURE
    assert strict.stderr.splitlines() == [warning, "check failed: 1 warning (--strict)"]
    assert "ok:" not in strict.stdout

    given = env | {"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": KEY}
    fine = check(path, "--strict", env=given)
    assert (fine.returncode, fine.stderr) == (0, "")


def shadow_boto3(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An environment in which ``import boto3`` fails, leaving a mark when it is tried."""
    shadow = tmp_path / "no-boto3"
    (shadow / "boto3").mkdir(parents=True)
    mark = tmp_path / "boto3-imported"
    (shadow / "boto3" / "__init__.py").write_text(
        "import os, pathlib\n"
        "pathlib.Path(os.environ['BOTO3_MARK']).touch()\n"
        "raise ImportError('No module named boto3')\n"
    )
    env = no_credentials(tmp_path) | {"PYTHONPATH": str(shadow), "BOTO3_MARK": str(mark)}
    return env, mark


def test_check_without_boto3_says_how_to_install_it(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"burst": profile(UNREACHABLE)})
    playbook(tmp_path)
    env, mark = shadow_boto3(tmp_path)
    result = check(path, env=env)
    assert result.returncode == 0, result.stderr
    (warning,) = result.stderr.splitlines()
    assert warning.startswith("warning: cloud profile burst: boto3 is not installed")
    assert "pip install" in warning
    assert mark.exists()
    assert check(path, "--strict", env=env).returncode == ExitCode.FAILURE


def test_check_without_cloud_profiles_never_imports_boto3(tmp_path: Path) -> None:
    path = write_config(tmp_path, {})
    playbook(tmp_path, steps="[notify: team, exec: [/bin/true]]")
    env, mark = shadow_boto3(tmp_path)
    result = check(path, "--strict", env=env)
    assert (result.returncode, result.stderr) == (0, "")
    assert not mark.exists()


# -- gpuwarden drill ------------------------------------------------------------------------------

SCENARIO = """\
version: 1
name: hot-gpu
host: gpu-node-9
start: 2026-07-21T14:30:00Z
gpus:
  - {index: 0, name: NVIDIA L40S, memory_total_mib: 46068, power_limit_w: 350}
jobs: []
timeline:
  - at: 0s
    gpus:
      0: {utilization_pct: 90, temperature_c: 60, power_w: 300}
  - at: 1m
    gpus:
      0: {temperature_c: 95}
  - at: 3m
    end: true
"""


def drill_files(tmp_path: Path, burst: dict[str, Any]) -> tuple[Path, Path]:
    path = write_config(tmp_path, {"burst": burst})
    playbook(tmp_path, steps="[{provision: {profile: burst, count: 2}}]")
    scenario = tmp_path / "hot-gpu.yaml"
    scenario.write_text(SCENARIO)
    return path, scenario


def test_drill_shows_what_would_be_launched_without_touching_the_network(tmp_path: Path) -> None:
    path, scenario = drill_files(tmp_path, profile(UNREACHABLE, max_hourly_usd=None))
    env = no_credentials(tmp_path)  # no credentials either: nothing asks for them
    result = gpuwarden("drill", scenario, "--config", path, env=env)
    assert result.returncode == 0, result.stderr
    (step,) = [line for line in result.stdout.splitlines() if "STEP" in line]
    assert step.endswith(
        "STEP provision → cloud profile burst: would launch 2 x g5.xlarge (on-demand) in "
        "us-east-1, $2.01/h"
    )
    records = [
        json.loads(line)
        for line in gpuwarden(
            "drill", scenario, "--config", path, "--json", env=env
        ).stdout.splitlines()
    ]
    (provision,) = [r for r in records if r["kind"] == "step"]
    assert provision["cloud"] == {
        "profile": "burst",
        "instance_type": "g5.xlarge",
        "count": 2,
        "market": "on-demand",
        "region": REGION,
        "hourly_usd": pytest.approx(2.012),
    }


def test_drill_shows_the_caps_and_an_unpriced_type(tmp_path: Path) -> None:
    capped = profile(UNREACHABLE, max_instances=1, max_hourly_usd=None, prices={}, market="spot")
    path, scenario = drill_files(tmp_path, capped)
    result = gpuwarden("drill", scenario, "--config", path)
    assert result.returncode == 0, result.stderr
    (step,) = [line for line in result.stdout.splitlines() if "STEP" in line]
    assert step.endswith(
        "→ cloud profile burst: would launch 1 x g5.xlarge (spot) in us-east-1, unpriced "
        "(capped: max_instances 1 leaves room for 1: 0 live)"
    )


def test_drill_cloud_asks_ec2_with_dry_run_and_launches_nothing(
    fresh_ec2: MotoEc2, tmp_path: Path
) -> None:
    path, scenario = drill_files(tmp_path, profile(fresh_ec2.endpoint_url, fresh_ec2.ami))
    result = gpuwarden("drill", scenario, "--config", path, "--cloud")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    (at,) = [n for n, line in enumerate(lines) if "STEP provision" in line]
    assert lines[at].endswith("would launch 2 x g5.xlarge (on-demand) in us-east-1, $2.01/h")
    assert lines[at + 1].lstrip().startswith("EC2 DryRun ok: would launch 2 x g5.xlarge")
    assert "EC2 accepted the request (DryRun): credentials and permissions work" in lines[at + 1]
    assert fresh_ec2.client().describe_instances()["Reservations"] == []
    assert not journal(tmp_path).exists()  # the drill's journal is its own, and gone

    records = [
        json.loads(line)
        for line in gpuwarden(
            "drill", scenario, "--config", path, "--cloud", "--json"
        ).stdout.splitlines()
    ]
    (provision,) = [r for r in records if r["kind"] == "step"]
    assert provision["cloud"]["ec2"]["ok"] is True


def test_drill_cloud_says_why_ec2_would_refuse(tmp_path: Path) -> None:
    path, scenario = drill_files(tmp_path, profile(UNREACHABLE))
    env = no_credentials(tmp_path)
    result = gpuwarden("drill", scenario, "--config", path, "--cloud", env=env)
    assert result.returncode == 0, result.stderr
    (verdict,) = [line for line in result.stdout.splitlines() if "EC2 DryRun" in line]
    assert verdict.lstrip().startswith("EC2 DryRun NOT OK: nothing launched: ")
    assert "no AWS credentials found" in verdict

    reachable = gpuwarden(
        "drill",
        scenario,
        "--config",
        path,
        "--cloud",
        env=env | {"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": KEY},
    )
    assert reachable.returncode == 0, reachable.stderr
    assert "cannot reach EC2" in reachable.stdout


def test_drill_cloud_needs_a_profile(tmp_path: Path) -> None:
    path = write_config(tmp_path, {})
    scenario = tmp_path / "hot-gpu.yaml"
    scenario.write_text(SCENARIO)
    playbook(tmp_path, steps="[exec: [/bin/true]]")
    result = gpuwarden("drill", scenario, "--config", path, "--cloud")
    assert result.returncode == ExitCode.BAD_INPUT
    assert "--cloud: the config has no cloud profiles" in result.stderr


def test_an_ended_instance_is_as_old_as_it_lived() -> None:
    from gpuwarden.cli.cloud import instance_json

    ended = instance(
        1000.0,
        state="terminated",
        hourly_usd=1.0,
        terminated_at=1000.0 + 1800,
        end_reason="linger",
    )
    shown = instance_json(ended, now=1000.0 + 86400)
    assert shown["age_s"] == 1800
    assert shown["cost_usd"] == pytest.approx(0.5)
    assert shown["expires_in_s"] is None


def test_an_incidents_timeline_lists_the_instances_it_launched(tmp_path: Path) -> None:
    from gpuwarden.journal.journal import Journal
    from gpuwarden.model import RuleChange, Transition

    path = write_config(tmp_path, {"burst": profile(UNREACHABLE)})
    t0 = time.time() - 3600
    incident = "20261130T010000Z-burst-when-hot-gpu:0"
    with Journal(journal(tmp_path)) as record:
        for kind, at in ((Transition.FIRING, t0), (Transition.RESOLVED, t0 + 1800)):
            change = RuleChange(kind, "burst-when-hot", "gpu:0", at, Reason.RESOLVED, incident)
            record.record(change, at)
    with InstanceStore.open(journal(tmp_path)) as store:
        store.add(instance(t0 + 600, incident=incident, hourly_usd=1.0), t0 + 600)
        store.ended("i-0123456789abcdef0", "terminated", t0 + 2400, "linger")

    shown = gpuwarden("incident", incident, "--config", path)
    assert shown.returncode == ExitCode.OK, shown.stderr
    text = shown.stdout
    assert "cloud instances" in text
    (row,) = [line for line in text.splitlines() if line.startswith("i-0123456789abcdef0")]
    assert row.split()[:4] == ["i-0123456789abcdef0", "burst", "g5.xlarge", "terminated"]
    assert row.split()[-1] == "$0.50"  # half an hour at $1/h

    as_json = gpuwarden("incident", incident, "--config", path, "--json")
    assert as_json.returncode == ExitCode.OK, as_json.stderr
    (shown_json,) = json.loads(as_json.stdout)["instances"]
    assert shown_json["end_reason"] == "linger"
    assert shown_json["age_s"] == pytest.approx(1800)
