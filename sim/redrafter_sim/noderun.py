"""The kubelet's work for a Pod that is not a serving pod, on a real control plane: its containers' commands as
processes, with the preparation, volume layout and program mapping of :class:`~.buildjobs.ProgramRunner`, which it
extends.

Init containers run first, in order, each to completion; then the containers, concurrently. What it reports is
what a kubelet reports (strategic merge patch of ``pods/status``): Pending with the waiting reason while an image
cannot be pulled (ErrImagePull, then ImagePullBackOff), Running with the container running, then Succeeded or
Failed with each container's ``state.terminated`` (exit code, reason, termination message). ``restartPolicy``
OnFailure restarts a failed container in place (restartCount, ``lastState``), Always restarts it whatever its
exit code. Whether the Job succeeded, retries or fails is the real Job controller's business.

A container is what a runtime would make it (:mod:`.podns`): one that mounts the service-account directory
finds its token, CA and namespace at the fixed in-cluster paths (a private mount namespace), and ``0.0.0.0`` in
its arguments listens on the pod's IP. Its environment is the image's and its spec's plus the ``kubernetes``
Service's address, never this host's ``KUBECONFIG``. A container with an httpGet ``readinessProbe`` is Ready only
once the probe passes (the kubelet's prober: period, timeout, success and failure thresholds); one without is
Ready once it runs. Liveness probes are not run for these pods.

``<svc>.<ns>.svc:<port>`` in a command is resolved as cluster DNS and kube-proxy would: the Service's port, then a
ready endpoint of its EndpointSlices (``discovery.k8s.io/v1``), read with kube-proxy's identity; where the
EndpointSlice controller could publish none (loopback pod IPs), the node's own Ready Pods the Service selects.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
from pathlib import Path
from typing import Any

import aiohttp

from . import objects
from .buildjobs import TOOLCHAIN_DIR, ProgramRunner
from .endpoints import endpoints_for
from .hostfs import HostFS
from .kubeapi import ENDPOINT_SLICES, PODS, SERVICES, ApiStatusError, KubeApi
from .podns import SERVICE_ACCOUNT_DIR, pod_listen_args, service_account_mount

log = logging.getLogger("redrafter.sim.noderun")

#: how often a container waiting for a missing ConfigMap is tried again
CONFIG_RETRY_SECONDS = 1.0
IMAGE_PULL_RETRY_SECONDS = 2.0
RESTART_BACKOFF_SECONDS = 1.0
FORBIDDEN_RETRY_SECONDS = 10.0  # the Node authorizer's graph learns a new Pod's references a moment after it
SIGTERM_EXIT = 143
LOG_KEEP_CHARS = 64_000
#: answers that say "not now" (throttled, starting, shutting down, etcd unavailable), not "never"
TRANSIENT_CODES = frozenset({429, 500, 502, 503, 504})


def http_readiness(container: dict[str, Any], ip: str) -> tuple[dict[str, Any], str | None] | None:
    """The container's httpGet readinessProbe and the URL it reads (the pod's IP unless the probe names a
    host; a named port through the container's ports), or None where it has none. The URL is None where the
    named port does not exist: as on a kubelet, such a probe never passes."""
    probe = container.get("readinessProbe") or {}
    get = probe.get("httpGet")
    if not get:
        return None
    port = get.get("port")
    if isinstance(port, str) and not port.isdigit():
        port = next((p["containerPort"] for p in container.get("ports") or [] if p.get("name") == port), None)
    if port is None:
        return probe, None
    scheme = str(get.get("scheme", "HTTP")).lower()
    return probe, f"{scheme}://{get.get('host') or ip}:{port}{get.get('path') or '/'}"


async def http_probe(url: str, timeout: float) -> bool:
    """One httpGet probe: a 2xx or 3xx answer within ``timeout`` passes, as the kubelet counts it."""
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
            async with session.get(url, allow_redirects=False, ssl=False) as resp:
                return 200 <= resp.status < 400
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
        return False


def with_addresses(status: dict[str, Any], ip: str) -> dict[str, Any]:
    """The kubelet's address fields: pod and host IPs, both lists."""
    status.update(podIP=ip, podIPs=[{"ip": ip}], hostIP=objects.HOST_IP, hostIPs=[{"ip": objects.HOST_IP}])
    return status


class PodRunner(ProgramRunner):
    """Runs Pods bound to this node to completion (``run``) and reports their status."""

    def __init__(
        self,
        api: KubeApi,
        proxy: KubeApi,
        fs: HostFS,
        *,
        toolchain: Path = TOOLCHAIN_DIR,
        parallel: int = 2,
        unpullable: set[str] | None = None,
    ) -> None:
        """``proxy``: the API as kube-proxy (Services and EndpointSlices); ``unpullable``: images that do not pull."""
        super().__init__(api, fs, toolchain=toolchain, parallel=parallel)
        self.proxy = proxy
        self.unpullable = unpullable if unpullable is not None else set()
        #: the in-cluster address of the API (the ``kubernetes`` Service, as kube-proxy makes it reachable)
        self.cluster_env: dict[str, str] = {}
        #: the node these Pods are bound to (its own Pods stand in for the endpoints of a Service)
        self.node_name = objects.NODE_NAME
        #: (namespace, pod, container) -> the tail of its output once it exited (what `kubectl logs` would show)
        self.logs: dict[tuple[str, str, str], str] = {}

    async def service_endpoint(self, svc: str, ns: str, port: int) -> str | None:
        services = await self.proxy.list(SERVICES, ns, field_selector=f"metadata.name={svc}")
        service_port = next(
            (p for s in services for p in (s.get("spec") or {}).get("ports") or [] if p.get("port") == port), None
        )
        if service_port is None:
            return None
        name = service_port.get("name") or ""
        for piece in await self.proxy.list(ENDPOINT_SLICES, ns, label_selector=f"kubernetes.io/service-name={svc}"):
            target = next((p.get("port") for p in piece.get("ports") or [] if (p.get("name") or "") == name), None)
            for endpoint in piece.get("endpoints") or []:
                if target and (endpoint.get("conditions") or {}).get("ready") and endpoint.get("addresses"):
                    return f"{endpoint['addresses'][0]}:{target}"
        # kube-apiserver refuses loopback addresses in EndpointSlices (ValidateEndpointIP), so the controller
        # cannot publish this node's 127.0.0.N pods: on a one-node cluster, the node's own Pods that the Service
        # selects and that are Ready are exactly the endpoints it would have published
        pods = await self.api.list(PODS, ns, field_selector=f"spec.nodeName={self.node_name}")
        for subset in endpoints_for(services[0], pods)["subsets"]:
            target = next((p.get("port") for p in subset.get("ports") or [] if (p.get("name") or "") == name), None)
            if target and subset.get("addresses"):
                return f"{subset['addresses'][0]['ip']}:{target}"
        return None

    async def report(self, pod: dict[str, Any], status: dict[str, Any]) -> None:
        """Patch the Pod's status; while kube-apiserver is unreachable or answers that it cannot serve now (a
        restart: 429 or 5xx while it starts, shuts down or waits for etcd) keep trying, as the kubelet's status
        manager does: a lost final status would leave the Pod Running and its Job unfinished for ever."""
        meta = pod["metadata"]
        pause = 0.2
        while True:
            try:
                await self.api.patch(
                    PODS, meta["name"], meta["namespace"], {"status": status}, "status", strategic=True
                )
                return
            except ApiStatusError as exc:
                if exc.code not in TRANSIENT_CODES:  # gone or being replaced: nothing left to report to
                    return
                log.warning("pod %s/%s: status not reported yet (%s)", meta["namespace"], meta["name"], exc)
                await asyncio.sleep(pause)
                pause = min(pause * 2, 2.0)
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                log.warning("pod %s/%s: status not reported yet (%s)", meta["namespace"], meta["name"], exc)
                await asyncio.sleep(pause)
                pause = min(pause * 2, 2.0)

    async def _pull(self, pod: dict[str, Any], ip: str, started: str) -> None:
        """While an image does not pull: ErrImagePull, then ImagePullBackOff, until the Pod is deleted."""
        containers = [*(pod["spec"].get("initContainers") or []), *pod["spec"]["containers"]]
        image = next((c["image"] for c in containers if c.get("image") in self.unpullable), None)
        attempt = 0
        while image is not None:
            attempt += 1
            reason, message = (
                (
                    "ErrImagePull",
                    f'rpc error: code = NotFound desc = failed to pull and unpack image "{image}": '
                    f'failed to resolve reference "{image}": {image}: not found',
                )
                if attempt == 1
                else ("ImagePullBackOff", f'Back-off pulling image "{image}"')
            )
            first = pod["spec"]["containers"][0]
            status = objects.waiting_status(first["name"], reason, message, 0, first.get("image", ""), started)
            await self.report(pod, with_addresses(status, ip))
            await asyncio.sleep(IMAGE_PULL_RETRY_SECONDS)
            image = next((c["image"] for c in containers if c.get("image") in self.unpullable), None)

    async def _prepare_retrying(self, pod: dict[str, Any], container: dict[str, Any], ip: str) -> Any:
        """:meth:`_prepare`, retried while the Node authorizer does not yet relate this Pod's objects to the node."""
        meta = pod["metadata"]
        root = self.fs.pod_root(meta["namespace"], meta["name"])
        deadline = asyncio.get_running_loop().time() + FORBIDDEN_RETRY_SECONDS
        while True:
            try:
                return await self._prepare(meta["namespace"], pod, container, root, ip)
            except ApiStatusError as exc:
                if exc.code != 403 or asyncio.get_running_loop().time() > deadline:
                    raise OSError(str(exc)) from exc
                await asyncio.sleep(0.3)

    async def _container(
        self, pod: dict[str, Any], container: dict[str, Any], ip: str, grace: float
    ) -> tuple[int, str]:
        """One run of one container: (exit code, termination message)."""
        meta = pod["metadata"]
        root = self.fs.pod_root(meta["namespace"], meta["name"])
        while True:
            try:
                argv, env, identity = await self._prepare_retrying(pod, container, ip)
                break
            except FileNotFoundError as exc:
                # a ConfigMap the pod mounts is not there (yet): the kubelet keeps the container waiting with
                # CreateContainerConfigError and tries again, until it appears or the Pod is deleted
                image = container.get("image", "")
                status = objects.waiting_status(
                    container["name"], "CreateContainerConfigError", str(exc), 0, image, objects.now()
                )
                await self.report(pod, with_addresses(status, ip))
                await asyncio.sleep(CONFIG_RETRY_SECONDS)
            except (OSError, ValueError) as exc:  # a volume the pod cannot start with
                return 128, f"CreateContainerConfigError: {exc}"
        env.pop("KUBECONFIG", None)  # a container's environment is its image's and its spec's, not this host's
        env.update(self.cluster_env)
        preexec = None
        if any(m.get("mountPath") == SERVICE_ACCOUNT_DIR for m in container.get("volumeMounts") or []):
            preexec = service_account_mount(Path(root.to_host(SERVICE_ACCOUNT_DIR)).resolve(), identity.preexec)
        try:
            return await self._execute(pod_listen_args(argv, ip), env, root, identity, grace, preexec)
        except subprocess.SubprocessError as exc:  # the mount namespace (needs root) could not be set up
            return 128, f"CreateContainerError: cannot mount {SERVICE_ACCOUNT_DIR}: {exc}"
        finally:
            log_file = root.root / "container.log"
            if log_file.is_file():  # kept past the pod's deletion, for `kubectl logs`-like reads in tests
                text = log_file.read_text(errors="replace")[-LOG_KEEP_CHARS:]
                self.logs[(meta["namespace"], meta["name"], container["name"])] = text

    async def run(self, pod: dict[str, Any]) -> None:
        """The Pod's whole life on this node, until its containers are done (cancel: the Pod was deleted)."""
        meta, spec = pod["metadata"], pod["spec"]
        ip = objects.pod_ip(meta["uid"])  # on loopback: a training pod serves its progress there
        started = objects.now()
        grace = float(spec.get("terminationGracePeriodSeconds", 30))
        policy = spec.get("restartPolicy", "Always")
        await self._pull(pod, ip, started)
        inits: list[dict[str, Any]] = []
        for init in spec.get("initContainers") or []:
            async with self._slots:
                code, message = await self._container(pod, init, ip, grace)
            inits.append(self._terminated(init, ip, started, code, message))
            if code != 0:  # the pod fails with its init container; the main containers never start
                status = objects.terminated_status(
                    spec["containers"][0]["name"], ip, started, code, message, spec["containers"][0].get("image", "")
                )
                status["phase"] = "Failed"
                status["containerStatuses"] = [
                    {**self._terminated(c, ip, started, 0, ""), "state": {"waiting": {"reason": "PodInitializing"}}}
                    for c in spec["containers"]
                ]
                status["initContainerStatuses"] = inits
                await self.report(pod, with_addresses(status, ip))
                return
        restarts = {c["name"]: 0 for c in spec["containers"]}
        last: dict[str, dict[str, Any]] = {}
        results: dict[str, dict[str, Any]] = {}
        # a container with a readinessProbe is not ready until the probe passes; one without is once it runs
        ready = {c["name"]: http_readiness(c, ip) is None for c in spec["containers"]}

        async def publish(container: dict[str, Any]) -> None:
            name = container["name"]
            running = objects.running_status(
                name, ip, started, all(ready.values()), restarts[name], container.get("image", "")
            )
            status = self._merged(pod, ip, started, running, results, last, inits)
            for entry in status["containerStatuses"]:
                if entry["name"] not in results:
                    entry["ready"] = ready[entry["name"]]
            await self.report(pod, status)

        async def probe(container: dict[str, Any]) -> None:
            """The kubelet's readiness prober: httpGet every periodSeconds; the container is ready after
            successThreshold passes in a row, unready after failureThreshold failures in a row."""
            check = http_readiness(container, ip)
            assert check is not None
            probe_spec, url = check
            await asyncio.sleep(float(probe_spec.get("initialDelaySeconds", 0)))
            passes = fails = 0
            while True:
                if url is not None and await http_probe(url, float(probe_spec.get("timeoutSeconds", 1))):
                    passes, fails = passes + 1, 0
                    now_ready = ready[container["name"]] or passes >= int(probe_spec.get("successThreshold", 1))
                else:
                    passes, fails = 0, fails + 1
                    now_ready = ready[container["name"]] and fails < int(probe_spec.get("failureThreshold", 3))
                if now_ready != ready[container["name"]]:
                    ready[container["name"]] = now_ready
                    log.info("pod %s/%s %s ready: %s", meta["namespace"], meta["name"], container["name"], now_ready)
                    await publish(container)
                await asyncio.sleep(float(probe_spec.get("periodSeconds", 10)))

        async def one(container: dict[str, Any]) -> None:
            while True:
                await publish(container)
                prober = (
                    asyncio.create_task(probe(container), name=f"probe/{meta['name']}/{container['name']}")
                    if http_readiness(container, ip) is not None
                    else None
                )
                try:
                    async with self._slots:
                        code, message = await self._container(pod, container, ip, grace)
                finally:
                    if prober is not None:
                        prober.cancel()
                        await asyncio.gather(prober, return_exceptions=True)
                        ready[container["name"]] = False
                done = self._terminated(container, ip, started, code, message, restarts[container["name"]])
                if policy == "Always" or (policy == "OnFailure" and code != 0):
                    last[container["name"]] = {"terminated": done["state"]["terminated"]}
                    restarts[container["name"]] += 1
                    await asyncio.sleep(RESTART_BACKOFF_SECONDS)
                    continue
                results[container["name"]] = done
                return

        try:
            await asyncio.gather(*(one(c) for c in spec["containers"]))
        except asyncio.CancelledError:  # deleted: the kubelet kills the containers and records the pod as failed
            for c in spec["containers"]:
                results.setdefault(c["name"], self._terminated(c, ip, started, SIGTERM_EXIT, "", restarts[c["name"]]))
            await asyncio.shield(self.report(pod, self._final(pod, ip, started, results, last, inits)))
            raise
        await self.report(pod, self._final(pod, ip, started, results, last, inits))
        log.info(
            "pod %s/%s finished: %s",
            meta["namespace"],
            meta["name"],
            {n: r["state"]["terminated"]["exitCode"] for n, r in results.items()},
        )

    @staticmethod
    def _terminated(
        container: dict[str, Any], ip: str, started: str, code: int, message: str, restarts: int = 0
    ) -> dict[str, Any]:
        status = objects.terminated_status(container["name"], ip, started, code, message, container.get("image", ""))
        entry: dict[str, Any] = status["containerStatuses"][0]
        entry["restartCount"] = restarts
        return entry

    def _merged(
        self,
        pod: dict[str, Any],
        ip: str,
        started: str,
        running: dict[str, Any],
        results: dict[str, dict[str, Any]],
        last: dict[str, dict[str, Any]],
        inits: list[dict[str, Any]],
    ) -> dict[str, Any]:
        """A Running pod's status: the container that (re)starts running, the others as they are."""
        (entry,) = running["containerStatuses"]
        statuses = []
        for c in pod["spec"]["containers"]:
            if c["name"] == entry["name"]:
                statuses.append({**entry, **({"lastState": last[c["name"]]} if c["name"] in last else {})})
            elif c["name"] in results:
                statuses.append(results[c["name"]])
            else:
                statuses.append(
                    {**entry, "name": c["name"], "image": c.get("image", ""), "imageID": c.get("image", "")}
                )
        running["containerStatuses"] = statuses
        if inits:
            running["initContainerStatuses"] = inits
        return with_addresses(running, ip)

    def _final(
        self,
        pod: dict[str, Any],
        ip: str,
        started: str,
        results: dict[str, dict[str, Any]],
        last: dict[str, dict[str, Any]],
        inits: list[dict[str, Any]],
    ) -> dict[str, Any]:
        """Succeeded when every container exited 0, else Failed."""
        first = pod["spec"]["containers"][0]
        status = objects.terminated_status(first["name"], ip, started, 0, "", first.get("image", ""))
        statuses = [
            {**results[c["name"]], **({"lastState": last[c["name"]]} if c["name"] in last else {})}
            for c in pod["spec"]["containers"]
            if c["name"] in results
        ]
        status["containerStatuses"] = statuses
        ok = all(s["state"]["terminated"]["exitCode"] == 0 for s in statuses)
        status["phase"] = "Succeeded" if ok else "Failed"
        if inits:
            status["initContainerStatuses"] = inits
        return with_addresses(status, ip)
