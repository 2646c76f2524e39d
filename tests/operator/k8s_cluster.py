"""A real node-less control plane for the `k8s` tests: started once per session by scripts/k8s/cluster.sh.

The binaries come from scripts/setup/20-k8s.sh (`make test` runs it first). If one is missing the
tests FAIL with the reason; they are never skipped.
"""

from __future__ import annotations

import base64
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOLS_BIN = Path(os.environ.get("NINFER_TOOLS", Path.home() / ".cache" / "ninfer-tools")) / "bin"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kubectl", "helm")


def tool_path() -> str:
    return f"{TOOLS_BIN}{os.pathsep}{os.environ.get('PATH', '')}"


def require_binaries() -> None:
    missing = [b for b in BINARIES if shutil.which(b, path=tool_path()) is None]
    if missing:
        pytest.fail(
            f"k8s test binaries missing: {', '.join(missing)} (looked in {TOOLS_BIN} and PATH); "
            "run scripts/setup/20-k8s.sh",
            pytrace=False,
        )


def _free_port_pair() -> int:
    """A port p with p and p+1 free on loopback (etcd client + peer)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with socket.socket() as s2:
            try:
                s2.bind(("127.0.0.1", port + 1))
                return port
            except OSError:
                continue
    raise RuntimeError("no free loopback port pair")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Cluster:
    state_dir: Path
    kubeconfig: Path
    server: str

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "PATH": tool_path(), "KUBECONFIG": str(self.kubeconfig)}

    def run(
        self, *args: str, check: bool = True, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(args, env=self.env, input=stdin, capture_output=True, text=True, timeout=120)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        return proc

    def kubectl(
        self, *args: str, check: bool = True, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return self.run("kubectl", *args, check=check, stdin=stdin)

    def service_account_kubeconfig(self, namespace: str, name: str, path: Path) -> Path:
        """A kubeconfig that authenticates as a ServiceAccount (its token Secret, made by the token
        controller), so the operator runs with exactly the chart's RBAC."""
        from kubernetes import client, config

        core = client.CoreV1Api(config.new_client_from_config(config_file=str(self.kubeconfig)))
        token = wait_for(
            lambda: _sa_token(core, namespace, name),
            timeout=30,
            what=f"token of ServiceAccount {namespace}/{name}",
        )
        path.write_text(
            "apiVersion: v1\nkind: Config\n"
            f'clusters:\n- name: local\n  cluster: {{server: "{self.server}", insecure-skip-tls-verify: true}}\n'
            f"users:\n- name: sa\n  user: {{token: {token}}}\n"
            f"contexts:\n- name: sa\n  context: {{cluster: local, user: sa, namespace: {namespace}}}\n"
            "current-context: sa\n"
        )
        return path


def _sa_token(core: Any, namespace: str, name: str) -> str | None:
    sa = core.read_namespaced_service_account(name, namespace)
    for ref in sa.secrets or []:
        secret = core.read_namespaced_secret(ref.name, namespace)
        if secret.type == "kubernetes.io/service-account-token" and (secret.data or {}).get("token"):
            return base64.b64decode(secret.data["token"]).decode()
    return None


def wait_for(
    fn: Callable[[], Any], timeout: float = 30.0, what: str = "condition", interval: float = 0.25
) -> Any:
    """Poll `fn` until it returns something truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last value: {last!r})")


def start_cluster(state_dir: Path) -> Cluster:
    require_binaries()
    port = _free_port()
    env = {
        **os.environ,
        "PATH": tool_path(),
        "ETCD_PORT": str(_free_port_pair()),
        "APISERVER_PORT": str(port),
    }
    script = str(REPO / "scripts" / "k8s" / "cluster.sh")
    proc = subprocess.run(
        ["bash", script, "up", str(state_dir)], env=env, capture_output=True, text=True, timeout=180
    )
    if proc.returncode != 0:
        pytest.fail(f"could not start the test control plane:\n{proc.stdout}\n{proc.stderr}", pytrace=False)
    return Cluster(
        state_dir=state_dir, kubeconfig=state_dir / "kubeconfig", server=f"https://127.0.0.1:{port}"
    )


def stop_cluster(cluster: Cluster) -> None:
    script = str(REPO / "scripts" / "k8s" / "cluster.sh")
    subprocess.run(
        ["bash", script, "down", str(cluster.state_dir)], capture_output=True, timeout=60, check=False
    )
