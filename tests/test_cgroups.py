"""parse_cgroup over whole /proc/PID/cgroup files (fixtures named after what they are) and over
the single-line variants that matter."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gpuwarden.sources.cgroups import CgroupFacts, delegated_path, parse_cgroup

FIXTURES = Path(__file__).parent / "fixtures" / "cgroup"

DOCKER_V1_ID = "4f1d5b1a0e8c2d7f9a3b6c5e8d0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b"
DOCKER_V2_ID = "9c2e7a41b3d5f6081a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f7081"
K8S_CONTAINERD_ID = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
K8S_CGROUPFS_ID = "5d41402abc4b2a76b9719d911017c592ae1b2c3d4e5f60718293a4b5c6d7e8f9"
CRIO_ID = "a94a8fe5ccb19ba61c4c0873d391e987982fbbd3a94a8fe5ccb19ba61c4c0873"
NERDCTL_ID = "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"

FILE_CASES: dict[str, CgroupFacts] = {
    # Hybrid host, cgroupfs driver: the unified line names the shim's service, every v1 line
    # names the container. The container wins, and its path carries no unit.
    "docker-v1.txt": CgroupFacts(
        container=DOCKER_V1_ID, path=f"/docker/{DOCKER_V1_ID}", systemd_unit=None
    ),
    "docker-v2.txt": CgroupFacts(
        container=DOCKER_V2_ID, path=f"/system.slice/docker-{DOCKER_V2_ID}.scope"
    ),
    "k8s-systemd-driver.txt": CgroupFacts(
        container=K8S_CONTAINERD_ID,
        pod="1b2c3d4e-5f6a-4b7c-8d9e-0f1a2b3c4d5e",
        path="/kubepods.slice/kubepods-burstable.slice/"
        "kubepods-burstable-pod1b2c3d4e_5f6a_4b7c_8d9e_0f1a2b3c4d5e.slice/"
        f"cri-containerd-{K8S_CONTAINERD_ID}.scope",
    ),
    "k8s-cgroupfs-driver.txt": CgroupFacts(
        container=K8S_CGROUPFS_ID,
        pod="7c9d2f1e-3a4b-4c5d-9e8f-a0b1c2d3e4f5",
        path=f"/kubepods/besteffort/pod7c9d2f1e-3a4b-4c5d-9e8f-a0b1c2d3e4f5/{K8S_CGROUPFS_ID}",
    ),
    "k8s-crio.txt": CgroupFacts(
        container=CRIO_ID,
        pod="0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d",
        path="/kubepods.slice/kubepods-pod0a1b2c3d_4e5f_4a6b_8c7d_9e0f1a2b3c4d.slice/"
        f"crio-{CRIO_ID}.scope",
    ),
    # The container monitor belongs to the pod but is not the container, nor a unit of its own.
    "crio-conmon.txt": CgroupFacts(
        pod="0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d",
        path="/kubepods.slice/kubepods-pod0a1b2c3d_4e5f_4a6b_8c7d_9e0f1a2b3c4d.slice/"
        f"crio-conmon-{CRIO_ID}.scope",
    ),
    "containerd-cgroupfs.txt": CgroupFacts(container=NERDCTL_ID, path=f"/default/{NERDCTL_ID}"),
    # Slurm v1 keeps the job in its own hierarchies and the step daemon's unit elsewhere; the
    # job's path is the informative one, and it names no unit (a rule protecting slurmd.service
    # must not protect every job).
    "slurm-v1.txt": CgroupFacts(
        slurm_job="4242", path="/slurm/uid_1000/job_4242/step_0/task_0", systemd_unit=None
    ),
    "slurm-v2.txt": CgroupFacts(
        slurm_job="4242",
        systemd_unit="slurmstepd.scope",
        path="/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0",
    ),
    "systemd-service.txt": CgroupFacts(
        systemd_unit="jupyter.service", path="/system.slice/jupyter.service"
    ),
    "user-session.txt": CgroupFacts(
        systemd_unit="session-3.scope", path="/user.slice/user-1000.slice/session-3.scope"
    ),
    "user-service.txt": CgroupFacts(
        systemd_unit="tensorboard.service",
        path="/user.slice/user-1000.slice/user@1000.service/app.slice/tensorboard.service",
    ),
    "garbage.txt": CgroupFacts(),
}


def test_every_fixture_has_a_case() -> None:
    assert sorted(p.name for p in FIXTURES.glob("*.txt")) == sorted(FILE_CASES)


@pytest.mark.parametrize(("name", "expected"), sorted(FILE_CASES.items()), ids=sorted(FILE_CASES))
def test_fixture_files(name: str, expected: CgroupFacts) -> None:
    text = (FIXTURES / name).read_bytes().decode("utf-8", errors="replace")
    assert _located_facts(parse_cgroup(text)) == expected


def _located_facts(facts: CgroupFacts) -> CgroupFacts:
    """What the cases compare: the facts but where the path lies (tested on its own below)."""
    return replace(facts, hierarchy=None, delegated=False)


@pytest.mark.parametrize(
    ("name", "hierarchy", "delegated"),
    [
        ("systemd-service.txt", "", False),
        ("user-session.txt", "", False),  # a session scope is root's: its user cannot write it
        ("user-service.txt", "", True),  # under user@1000.service: the user's own making
        ("docker-v1.txt", "name=systemd", False),  # systemd's v1 line names the container
        ("slurm-v1.txt", "devices", False),  # the first v1 line naming the job
        ("garbage.txt", None, False),
    ],
)
def test_where_the_path_lies(name: str, hierarchy: str | None, delegated: bool) -> None:
    facts = parse_cgroup((FIXTURES / name).read_text(encoding="utf-8", errors="replace"))
    assert (facts.hierarchy, facts.delegated) == (hierarchy, delegated)


@pytest.mark.parametrize(
    ("path", "delegated"),
    [
        ("/user.slice/user-1000.slice/user@1000.service/app.slice/triton.service", True),
        ("/user.slice/user-1000.slice/user@1000.service", True),
        ("/system.slice/triton.service", False),
        ("/system.slice/user@.service.d", False),  # not a unit name: no .service at the end
        ("/../../system.slice/triton.service", True),  # outside our cgroup namespace
        ("/", False),
    ],
)
def test_delegated_path(path: str, delegated: bool) -> None:
    assert delegated_path(path) is delegated


def test_v1_fixtures_have_many_lines() -> None:
    # The multi-line fixtures are what makes the "parse every line" cases real.
    for name in ("docker-v1.txt", "k8s-cgroupfs-driver.txt", "slurm-v1.txt", "systemd-service.txt"):
        assert len((FIXTURES / name).read_text().splitlines()) >= 10, name


LINE_CASES: list[tuple[str, str, CgroupFacts]] = [
    ("empty", "", CgroupFacts()),
    ("root only", "0::/\n", CgroupFacts(path="/")),
    (
        "hybrid root unified, informative v1 line",
        "4:memory:/process_api/45569c5af3b2c3d314ee90c2e519db7a\n1:name=systemd:/\n0::/\n",
        CgroupFacts(path="/process_api/45569c5af3b2c3d314ee90c2e519db7a"),
    ),
    (
        "name=systemd preferred over other v1 lines",
        "5:memory:/system.slice\n1:name=systemd:/system.slice/nvidia-persistenced.service\n",
        CgroupFacts(
            systemd_unit="nvidia-persistenced.service",
            path="/system.slice/nvidia-persistenced.service",
        ),
    ),
    (
        "removed cgroup of a zombie",
        "0::/system.slice/train.service (deleted)\n",
        CgroupFacts(systemd_unit="train.service", path="/system.slice/train.service"),
    ),
    (
        "guaranteed pod, docker runtime",
        "0::/kubepods.slice/kubepods-pod11111111_2222_4333_8444_555555555555.slice/"
        f"docker-{DOCKER_V2_ID}.scope\n",
        CgroupFacts(
            container=DOCKER_V2_ID,
            pod="11111111-2222-4333-8444-555555555555",
            path="/kubepods.slice/kubepods-pod11111111_2222_4333_8444_555555555555.slice/"
            f"docker-{DOCKER_V2_ID}.scope",
        ),
    ),
    (
        "static pod (hash uid), pause-less pod slice only",
        "0::/kubepods.slice/kubepods-besteffort.slice/"
        "kubepods-besteffort-pod0123456789abcdef0123456789abcdef.slice\n",
        CgroupFacts(
            pod="0123456789abcdef0123456789abcdef",
            path="/kubepods.slice/kubepods-besteffort.slice/"
            "kubepods-besteffort-pod0123456789abcdef0123456789abcdef.slice",
        ),
    ),
    (
        "podman",
        f"0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{CRIO_ID}.scope\n",
        CgroupFacts(
            container=CRIO_ID,
            systemd_unit="user@1000.service",
            path=f"/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{CRIO_ID}.scope",
        ),
    ),
    (
        "service inside a container: innermost unit",
        f"0::/system.slice/docker-{DOCKER_V2_ID}.scope/system.slice/nginx.service\n",
        CgroupFacts(
            container=DOCKER_V2_ID,
            systemd_unit="nginx.service",
            path=f"/system.slice/docker-{DOCKER_V2_ID}.scope/system.slice/nginx.service",
        ),
    ),
    (
        "nested containers: innermost id",
        f"1:name=systemd:/docker/{DOCKER_V1_ID}/docker/{DOCKER_V2_ID}\n",
        CgroupFacts(container=DOCKER_V2_ID, path=f"/docker/{DOCKER_V1_ID}/docker/{DOCKER_V2_ID}"),
    ),
    (
        "pod-like name outside kubepods is not a pod",
        "0::/system.slice/pod11111111-2222-4333-8444-555555555555.service\n",
        CgroupFacts(
            systemd_unit="pod11111111-2222-4333-8444-555555555555.service",
            path="/system.slice/pod11111111-2222-4333-8444-555555555555.service",
        ),
    ),
    (
        "job_ outside slurm is not a job",
        "0::/user.slice/job_17/run.scope\n",
        CgroupFacts(systemd_unit="run.scope", path="/user.slice/job_17/run.scope"),
    ),
    (
        "slurm v1 on a named node",
        "4:memory:/slurm_gpu07/uid_1000/job_99/step_batch/task_0\n0::/\n",
        CgroupFacts(slurm_job="99", path="/slurm_gpu07/uid_1000/job_99/step_batch/task_0"),
    ),
    (
        "short hex is not a container",
        "0::/docker/4f1d5b1a0e8c\n",
        CgroupFacts(path="/docker/4f1d5b1a0e8c"),
    ),
    (
        "upper-case hex is not a runtime id",
        f"0::/docker/{DOCKER_V1_ID.upper()}\n",
        CgroupFacts(path=f"/docker/{DOCKER_V1_ID.upper()}"),
    ),
    (
        "colon inside the path",
        "0::/system.slice/odd:name.service\n",
        CgroupFacts(systemd_unit="odd:name.service", path="/system.slice/odd:name.service"),
    ),
    (
        "valid line after garbage",
        "garbage\n\n0::/system.slice/jupyter.service\n",
        CgroupFacts(systemd_unit="jupyter.service", path="/system.slice/jupyter.service"),
    ),
]


@pytest.mark.parametrize(
    ("text", "expected"), [(t, e) for _, t, e in LINE_CASES], ids=[n for n, _, _ in LINE_CASES]
)
def test_line_variants(text: str, expected: CgroupFacts) -> None:
    assert _located_facts(parse_cgroup(text)) == expected


def test_this_process_parses_without_error() -> None:
    # Whatever this machine's layout, our own cgroup file yields a path.
    facts = parse_cgroup(Path("/proc/self/cgroup").read_text())
    assert facts.path is not None
    assert facts.path.startswith("/")
