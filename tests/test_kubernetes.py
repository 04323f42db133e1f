"""deploy/kubernetes: the DaemonSet and what it needs, checked without a cluster.

Each manifest is validated against Kubernetes' own OpenAPI schemas (the ``kubernetes-validate``
package bundles them; strict: an unknown or misspelt field is an error), and its structure is
checked against what gpuwarden needs on a node: the host's PID namespace, the GPUs without
allocating them, the config and playbooks mounted so that ``..data`` swaps reload, the journal
on the node, the acknowledgement spool at the same path as in the jobs. The config and the
playbooks the ConfigMaps carry must load. (``kubectl apply --dry-run=client`` needs an API
server even for a dry run; ``kubectl kustomize`` does not, and is run when kubectl is there.)
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gpuwarden import config
from gpuwarden.config import Config
from gpuwarden.playbook import loader

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy" / "kubernetes"
VERSIONS = ("1.27.0", kubernetes_validate.latest_version())
SPOOL = "/run/gpuwarden/ack"


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d is not None]


def kustomized() -> list[str]:
    return list(yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["resources"])


def one(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        d
        for f in [*kustomized(), "job-example.yaml"]
        for d in documents(f)
        if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]


def pod_of(kind: str) -> dict[str, Any]:
    return one(kind)["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def container(kind: str) -> dict[str, Any]:
    [only] = pod_of(kind)["containers"]
    return only  # type: ignore[no-any-return]


def mounts(kind: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """Mount path → (volume name, the volume), for the pod's one container."""
    volumes = {v["name"]: v for v in pod_of(kind)["volumes"]}
    return {
        m["mountPath"]: (m["name"], volumes[m["name"]]) for m in container(kind)["volumeMounts"]
    }


def deployed_config(tmp_path: Path) -> Config:
    text = one("ConfigMap", "gpuwarden-config")["data"]["gpuwarden.yaml"]
    path = tmp_path / "gpuwarden.yaml"
    path.write_text(text)
    return config.load(path)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", sorted(p.name for p in DEPLOY.glob("*.yaml")))
def test_every_manifest_is_valid_kubernetes(name: str, version: str) -> None:
    if name == "kustomization.yaml":
        assert sorted([*kustomized(), "job-example.yaml", name]) == sorted(
            p.name for p in DEPLOY.glob("*.yaml")
        )
        return
    for doc in documents(name):
        kubernetes_validate.validate(doc, version, strict=True)  # raises on any problem
        assert doc["metadata"]["name"]


def test_a_misspelt_field_is_caught() -> None:
    daemonset = one("DaemonSet")
    daemonset["spec"]["template"]["spec"]["hostPid"] = True
    with pytest.raises(kubernetes_validate.ValidationError, match="hostPid"):
        kubernetes_validate.validate(daemonset, VERSIONS[-1], strict=True)


def test_the_daemonset_sees_host_processes_and_every_gpu_without_taking_one() -> None:
    pod = pod_of("DaemonSet")
    assert pod["hostPID"] is True
    assert pod["runtimeClassName"] == "nvidia"
    env = {e["name"]: e for e in container("DaemonSet")["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert "utility" in env["NVIDIA_DRIVER_CAPABILITIES"]["value"].split(",")  # NVML
    assert env["GPUWARDEN_HOST"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    resources = container("DaemonSet")["resources"]
    assert not any("nvidia.com" in key for part in resources.values() for key in part)


def test_the_daemonset_has_the_capabilities_of_the_systemd_unit_and_no_api_token() -> None:
    pod = pod_of("DaemonSet")
    security = container("DaemonSet")["securityContext"]
    assert security["capabilities"]["drop"] == ["ALL"]
    added = set(security["capabilities"]["add"])
    assert {"KILL", "SYS_NICE", "SYS_PTRACE", "DAC_READ_SEARCH", "SYS_ADMIN"} <= added
    assert "privileged" not in security
    assert security["readOnlyRootFilesystem"] is True
    assert pod["automountServiceAccountToken"] is False
    account = one("ServiceAccount")
    assert account["metadata"]["name"] == pod["serviceAccountName"]
    assert account["automountServiceAccountToken"] is False
    kinds = {d["kind"] for f in kustomized() for d in documents(f)}
    assert not kinds & {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}
    labels = one("Namespace")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"


def test_the_config_and_playbooks_are_mounted_whole_where_the_config_says(tmp_path: Path) -> None:
    cfg = deployed_config(tmp_path)
    found = mounts("DaemonSet")
    args = container("DaemonSet")["args"]
    config_file = Path(args[args.index("--config") + 1])
    _, volume = found[str(config_file.parent)]
    assert volume["configMap"]["name"] == "gpuwarden-config"
    _, volume = found[str(cfg.playbooks)]
    assert volume["configMap"]["name"] == "gpuwarden-playbooks"
    # subPath mounts never see an update; a whole-directory mount gets the ..data swap.
    assert not any("subPath" in m for m in container("DaemonSet")["volumeMounts"])
    assert cfg.reload.watch


def test_the_journal_and_the_ack_spool_live_on_the_node_at_the_same_paths(tmp_path: Path) -> None:
    cfg = deployed_config(tmp_path)
    found = mounts("DaemonSet")
    _, state = found[str(cfg.state_dir)]
    assert state["hostPath"] == {"path": str(cfg.state_dir), "type": "DirectoryOrCreate"}
    _, spool = found[SPOOL]
    assert spool["hostPath"] == {"path": SPOOL, "type": "DirectoryOrCreate"}
    # The job's pod: the same node directory at the same path.
    _, theirs = mounts("Job")[SPOOL]
    assert theirs["hostPath"]["path"] == SPOOL
    read_only = {
        m["mountPath"] for m in container("DaemonSet")["volumeMounts"] if m.get("readOnly")
    }
    assert SPOOL not in read_only
    assert str(cfg.state_dir) not in read_only


def test_the_configmaps_load_and_carry_the_shipped_playbook(tmp_path: Path) -> None:
    cfg = deployed_config(tmp_path)
    assert cfg.dry_run  # armed on purpose, after a look at what it would do
    assert cfg.notify.targets["oncall"].type == "alertmanager"
    playbooks = one("ConfigMap", "gpuwarden-playbooks")["data"]
    directory = tmp_path / "playbooks"
    directory.mkdir()
    for name, text in playbooks.items():
        assert text == (ROOT / "playbooks" / name).read_text()
        (directory / name).write_text(text)
    loaded = loader.load([directory], cfg)
    assert [r.name for r in loaded.rules] == ["gpu-memory-pressure"]
    port = container("DaemonSet")["ports"][0]["containerPort"]
    assert cfg.metrics.listen == f"0.0.0.0:{port}"


def test_the_node_name_is_the_host_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUWARDEN_HOST", "gpu-node-42")
    assert config.host_name(Config()) == "gpu-node-42"
    assert config.host_name(Config(host="from-the-config")) == "from-the-config"
    monkeypatch.delenv("GPUWARDEN_HOST")
    assert config.host_name(Config())  # the machine's own name


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kustomize_renders_the_set_offline() -> None:
    result = subprocess.run(
        ["kubectl", "kustomize", str(DEPLOY)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    kinds = [d["kind"] for d in yaml.safe_load_all(result.stdout)]
    assert kinds == ["Namespace", "ServiceAccount", "ConfigMap", "ConfigMap", "DaemonSet"]
