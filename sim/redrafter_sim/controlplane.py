"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager and kube-scheduler,
built from their Go modules by ``make controlplane`` (``controlplane/``) and started as envtest and kubeadm start
them: client certificates from one CA, RBAC and Node authorization, service-account signing keys, the default
admission plugins (PodSecurity among them) plus NodeRestriction, and the controllers the operator's children
depend on. Only the node is ours (:mod:`.node`).

``ControlPlane(workdir).start()`` returns once every component answers ok (``/readyz``; the controller manager's
``/healthz``, as it serves no ``/readyz``); ``stop()`` ends them.
``restart("kube-apiserver")`` and ``restart("etcd")`` restart one for real; ``compact()`` compacts etcd, so an old
resourceVersion then answers 410 Gone as on a cluster.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import io
import json
import logging
import os
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .pki import ClusterPKI, KeyPair

log = logging.getLogger("redrafter.sim.controlplane")

COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
SERVICE_CIDR = "10.96.0.0/16"
ISSUER = "https://kubernetes.default.svc.cluster.local"
# What the operator's children depend on (names from k8s.io/kubernetes cmd/kube-controller-manager/names).
CONTROLLERS = (
    "job-controller",
    "cronjob-controller",
    "deployment-controller",
    "replicaset-controller",
    "endpoints-controller",
    "endpointslice-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "pod-garbage-collector-controller",
    "ttl-after-finished-controller",
    "disruption-controller",
    "clusterrole-aggregation-controller",
    "persistentvolume-binder-controller",
    # the StorageObjectInUseProtection admission plugin (a default) puts their finalizers on every claim and
    # volume: without these two a namespace with a claim never finishes terminating
    "persistentvolumeclaim-protection-controller",
    "persistentvolume-protection-controller",
    # removes the not-ready taint the TaintNodesByCondition admission puts on every new Node, once it is Ready
    "node-lifecycle-controller",
    # counts a namespace's ResourceQuotas: until it has, quota admission refuses every pod there
    "resourcequota-controller",
)
ADMIN_USER = "kubernetes-admin"


class ControlPlaneError(RuntimeError):
    """A component is missing, would not start, or did not become ready."""


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def bin_dir() -> Path:
    """Where ``make controlplane`` puts the binaries (``REDRAFTER_CONTROLPLANE_BIN`` overrides)."""
    return Path(os.environ.get("REDRAFTER_CONTROLPLANE_BIN") or repo_root() / "controlplane" / "bin")


def missing_binaries(directory: Path | None = None) -> list[str]:
    d = directory or bin_dir()
    return [name for name in COMPONENTS if not os.access(d / name, os.X_OK)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kubeconfig_dict(
    server: str, ca: Path, pair: KeyPair | None = None, namespace: str = "default", token: str | None = None
) -> dict[str, Any]:
    """A kubeconfig for ``server``: a client certificate, or a bearer token (a ServiceAccount's)."""
    user: dict[str, str] = {}
    if pair is not None:
        user = {"client-certificate": str(pair.cert), "client-key": str(pair.key)}
    if token is not None:
        user = {"token": token}
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "redrafter-sim", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": "user", "user": user}],
        "contexts": [
            {"name": "redrafter-sim", "context": {"cluster": "redrafter-sim", "user": "user", "namespace": namespace}}
        ],
        "current-context": "redrafter-sim",
        "preferences": {},
    }


def write_yaml(path: Path, doc: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    path.chmod(0o600)
    return path


@dataclass
class Component:
    """One control-plane process: how to start it and where it says it is ready."""

    name: str
    argv: list[str]
    ready_url: str
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = field(default=0)

    def start(self) -> None:
        self.starts += 1
        out = open(self.log_path, "ab")  # noqa: SIM115 - the child keeps it; closed with the process
        try:
            self.proc = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        finally:
            out.close()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace: float = 10.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class ControlPlane:
    """The four components in ``workdir`` (certificates, etcd's data, logs, kubeconfigs)."""

    def __init__(self, workdir: Path, binaries: Path | None = None, extra_apiserver_args: tuple[str, ...] = ()) -> None:
        self.dir = workdir
        self.bin = binaries or bin_dir()
        absent = missing_binaries(self.bin)
        if absent:
            raise ControlPlaneError(
                f"control-plane binaries missing in {self.bin}: {', '.join(absent)} (build them with `make controlplane`)"
            )
        self.dir.mkdir(parents=True, exist_ok=True)
        self.pki = ClusterPKI(self.dir / "pki")
        self.etcd_port, self.etcd_peer_port = free_port(), free_port()
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.etcd_url = f"http://127.0.0.1:{self.etcd_port}"
        self._ssl = ssl.create_default_context(cafile=str(self.pki.ca.cert))
        self._admin = threading.local()  # each thread's kept-alive connection (request)
        self._admin_ssl: ssl.SSLContext | None = None
        self.admin = self.pki.client("admin", ADMIN_USER, ("system:masters",))
        self.admin_kubeconfig = write_yaml(self.dir / "admin.kubeconfig", self.kubeconfig(self.admin))
        serving = self.pki.serving("apiserver", ["127.0.0.1", "localhost", "10.96.0.1", "kubernetes.default.svc"])
        kcm = self.pki.client("controller-manager", "system:kube-controller-manager")
        sched = self.pki.client("scheduler", "system:kube-scheduler")
        kcm_config = write_yaml(self.dir / "controller-manager.kubeconfig", self.kubeconfig(kcm))
        sched_config = write_yaml(self.dir / "scheduler.kubeconfig", self.kubeconfig(sched))
        logs = self.dir / "logs"
        logs.mkdir(exist_ok=True)
        kcm_port, sched_port = free_port(), free_port()
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        self.components: dict[str, Component] = {
            "etcd": Component(
                "etcd",
                [
                    str(self.bin / "etcd"),
                    "--name=default",
                    f"--data-dir={self.dir / 'etcd'}",
                    f"--listen-client-urls={self.etcd_url}",
                    f"--advertise-client-urls={self.etcd_url}",
                    f"--listen-peer-urls={peer}",
                    f"--initial-advertise-peer-urls={peer}",
                    f"--initial-cluster=default={peer}",
                    "--unsafe-no-fsync",  # a test cluster: speed over durability, as envtest runs it
                    "--log-level=warn",
                ],
                f"{self.etcd_url}/readyz",
                logs / "etcd.log",
            ),
            "kube-apiserver": Component(
                "kube-apiserver",
                [
                    str(self.bin / "kube-apiserver"),
                    f"--etcd-servers={self.etcd_url}",
                    "--bind-address=127.0.0.1",
                    "--advertise-address=127.0.0.1",
                    # the kubernetes Service's endpoints would be this loopback address, which the reconciler
                    # refuses (as envtest, no reconciler: pods reach the API server through the node's env)
                    "--endpoint-reconciler-type=none",
                    f"--secure-port={self.port}",
                    f"--tls-cert-file={serving.cert}",
                    f"--tls-private-key-file={serving.key}",
                    f"--client-ca-file={self.pki.ca.cert}",
                    f"--service-cluster-ip-range={SERVICE_CIDR}",
                    "--authorization-mode=Node,RBAC",
                    "--enable-admission-plugins=NodeRestriction",
                    "--allow-privileged=true",
                    f"--service-account-issuer={ISSUER}",
                    f"--service-account-key-file={self.pki.sa_pub}",
                    f"--service-account-signing-key-file={self.pki.sa_key}",
                    f"--cert-dir={self.dir / 'apiserver-certs'}",
                    "--profiling=false",
                    *extra_apiserver_args,
                ],
                f"{self.url}/readyz",
                logs / "kube-apiserver.log",
            ),
            "kube-controller-manager": Component(
                "kube-controller-manager",
                [
                    str(self.bin / "kube-controller-manager"),
                    f"--kubeconfig={kcm_config}",
                    f"--authentication-kubeconfig={kcm_config}",
                    f"--authorization-kubeconfig={kcm_config}",
                    "--bind-address=127.0.0.1",
                    f"--secure-port={kcm_port}",
                    f"--cert-dir={self.dir / 'kcm-certs'}",
                    "--leader-elect=false",
                    "--use-service-account-credentials=true",
                    f"--service-account-private-key-file={self.pki.sa_key}",
                    f"--root-ca-file={self.pki.ca.cert}",
                    f"--controllers={','.join(CONTROLLERS)}",
                    "--node-monitor-period=1s",  # a registered node schedulable within a second, not five
                    "--profiling=false",
                ],
                f"https://127.0.0.1:{kcm_port}/healthz",  # it serves no /readyz
                logs / "kube-controller-manager.log",
            ),
            "kube-scheduler": Component(
                "kube-scheduler",
                [
                    str(self.bin / "kube-scheduler"),
                    f"--kubeconfig={sched_config}",
                    f"--authentication-kubeconfig={sched_config}",
                    f"--authorization-kubeconfig={sched_config}",
                    "--bind-address=127.0.0.1",
                    f"--secure-port={sched_port}",
                    f"--cert-dir={self.dir / 'scheduler-certs'}",
                    "--leader-elect=false",
                    "--profiling=false",
                ],
                f"https://127.0.0.1:{sched_port}/readyz",
                logs / "kube-scheduler.log",
            ),
        }

    # --- credentials -------------------------------------------------------------------------------------------

    def kubeconfig(
        self, pair: KeyPair | None = None, namespace: str = "default", token: str | None = None
    ) -> dict[str, Any]:
        return kubeconfig_dict(self.url, self.pki.ca.cert, pair, namespace, token)

    def write_kubeconfig(
        self, path: Path, user: str | None = None, groups: tuple[str, ...] = (), namespace: str = "default"
    ) -> Path:
        """A kubeconfig for ``user`` in ``groups`` (a fresh client certificate); the admin's without a user."""
        pair = self.admin if user is None else self.pki.client(f"user-{abs(hash((user, groups)))}", user, groups)
        return write_yaml(path, self.kubeconfig(pair, namespace))

    def node_kubeconfig(self, node: str) -> Path:
        """The node's identity, as the Node authorizer and NodeRestriction expect it."""
        pair = self.pki.client(f"node-{node}", f"system:node:{node}", ("system:nodes",))
        return write_yaml(self.dir / f"node-{node}.kubeconfig", self.kubeconfig(pair))

    def service_account_kubeconfig(self, path: Path, namespace: str, name: str, hours: int = 24) -> Path:
        """A kubeconfig holding a bound token of that ServiceAccount (the TokenRequest API, as ``kubectl create
        token`` does): a process with it has exactly the RBAC the ServiceAccount has."""
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": hours * 3600},
        }
        answer = self.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", body)
        return write_yaml(path, self.kubeconfig(token=answer["status"]["token"], namespace=namespace))

    # --- requests as the admin ---------------------------------------------------------------------------------

    def _admin_connection(self, fresh: bool = False) -> http.client.HTTPSConnection:
        """This thread's kept-alive admin connection: a TLS handshake with client-certificate checks for every
        request cost the suite more CPU, in kube-apiserver and here, than the requests themselves."""
        conn: http.client.HTTPSConnection | None = getattr(self._admin, "conn", None)
        if conn is None or fresh:
            if conn is not None:
                conn.close()
            if self._admin_ssl is None:
                ctx = ssl.create_default_context(cafile=str(self.pki.ca.cert))
                ctx.load_cert_chain(str(self.admin.cert), str(self.admin.key))
                self._admin_ssl = ctx
            conn = self._admin.conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self._admin_ssl)
        return conn

    def request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        timeout: float = 30,
        content_type: str = "application/json",
    ) -> Any:
        """One admin request (``content_type``: a PATCH's, ``application/merge-patch+json`` say); an error Status
        raises ``urllib.error.HTTPError``, and no answer (refused, reset, timed out) ``urllib.error.URLError``.

        A kept-alive connection the server closed meanwhile (idle, or restarted) fails before the request is
        read: then the request is sent once more, on a new connection."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = content_type
        for fresh in (False, True):
            conn = self._admin_connection(fresh)
            conn.timeout = timeout
            reused = conn.sock is not None
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
            try:
                conn.request(method, path, body=data, headers=headers)
                resp = conn.getresponse()
                payload = resp.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError, ssl.SSLEOFError) as exc:
                conn.close()
                if not reused:
                    raise urllib.error.URLError(exc) from exc
                continue
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                raise urllib.error.URLError(exc) from exc
            if resp.status >= 400:
                raise urllib.error.HTTPError(
                    self.url + path, resp.status, resp.reason, resp.headers, io.BytesIO(payload)
                )
            return json.loads(payload or b"null")
        raise AssertionError("unreachable")

    def wait_established(self, crd: str, timeout: float = 60.0) -> None:
        """Until the CustomResourceDefinition is Established (its API served). Not ``kubectl wait``: right after
        the apply, the CRD has no conditions yet and kubectl 1.37 fails instead of waiting."""
        deadline = time.monotonic() + timeout
        while True:
            obj = self.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}")
            conditions = (obj.get("status") or {}).get("conditions") or []
            if any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
                return
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"CustomResourceDefinition {crd} not Established after {timeout:.0f}s")
            time.sleep(0.1)

    # --- lifecycle ---------------------------------------------------------------------------------------------

    def _ready(self, comp: Component) -> bool:
        try:
            ctx = self._ssl if comp.ready_url.startswith("https") else None
            if comp.name in ("kube-controller-manager", "kube-scheduler"):
                ctx = ssl.create_default_context()  # their serving certificates are self-signed
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            with urllib.request.urlopen(comp.ready_url, context=ctx, timeout=5) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError, ssl.SSLError):
            return False

    def _wait_ready(self, comp: Component, deadline: float) -> None:
        while not self._ready(comp):
            if not comp.alive():
                raise ControlPlaneError(
                    f"{comp.name} exited ({comp.proc and comp.proc.returncode}):\n{comp.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"{comp.name} not ready at {comp.ready_url}:\n{comp.log_tail()}")
            time.sleep(0.2)
        log.info("%s ready", comp.name)

    def start(self, timeout: float = 180.0) -> ControlPlane:
        """Start the components in order, each once the one it talks to is ready."""
        deadline = time.monotonic() + timeout
        try:
            for name in COMPONENTS:
                comp = self.components[name]
                comp.start()
                self._wait_ready(comp, deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def restart(self, name: str, down: Callable[[], None] | None = None, timeout: float = 120.0) -> None:
        """Stop one component, call ``down`` while it is down, start it again and wait until it is ready."""
        comp = self.components[name]
        comp.stop()
        if down is not None:
            down()
        comp.start()
        self._wait_ready(comp, time.monotonic() + timeout)

    def stop(self) -> None:
        for name in reversed(COMPONENTS):
            self.components[name].stop()

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- etcd --------------------------------------------------------------------------------------------------

    def _etcd(self, path: str, body: dict[str, Any]) -> Any:
        req = urllib.request.Request(
            self.etcd_url + path,
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())

    def etcd_revision(self) -> int:
        key = base64.b64encode(b"/registry/").decode()
        answer = self._etcd("/v3/kv/range", {"key": key, "limit": 1})
        return int(answer["header"]["revision"])

    def compact(self) -> int:
        """Compact etcd at its current revision (etcd's gRPC gateway): watches and lists from an older
        resourceVersion then answer 410 Gone, as kube-apiserver's own compaction makes them on a cluster."""
        revision = self.etcd_revision()
        self._etcd("/v3/kv/compaction", {"revision": str(revision), "physical": True})
        return revision

    def remove_data(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
