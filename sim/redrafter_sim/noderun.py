"""The kubelet's work for a Pod that is not a serving pod, on a real control plane: its containers' commands as
processes, with the preparation, volume layout and program mapping of :class:`~.buildjobs.JobRunner` (which it
extends, without its Job controller).

Init containers run first, in order, each to completion; then the containers, concurrently. What it reports is
what a kubelet reports (strategic merge patch of ``pods/status``): Pending with the waiting reason while an image
cannot be pulled (ErrImagePull, then ImagePullBackOff), Running with the container running, then Succeeded or
Failed with each container's ``state.terminated`` (exit code, reason, termination message). ``restartPolicy``
OnFailure restarts a failed container in place (restartCount, ``lastState``), Always restarts it whatever its
exit code. Whether the Job succeeded, retries or fails is the real Job controller's business.

``<svc>.<ns>.svc:<port>`` in a command is resolved as cluster DNS and kube-proxy would: the Service's port, then a
ready endpoint of its EndpointSlices (``discovery.k8s.io/v1``), read with kube-proxy's identity.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import aiohttp

from . import objects
from .buildjobs import TOOLCHAIN_DIR, JobRunner
from .hostfs import HostFS
from .kubeapi import ENDPOINT_SLICES, PODS, SERVICES, ApiStatusError, KubeApi

log = logging.getLogger("redrafter.sim.noderun")

IMAGE_PULL_RETRY_SECONDS = 2.0
RESTART_BACKOFF_SECONDS = 1.0
FORBIDDEN_RETRY_SECONDS = 10.0  # the Node authorizer's graph learns a new Pod's references a moment after it
SIGTERM_EXIT = 143


def with_addresses(status: dict[str, Any], ip: str) -> dict[str, Any]:
    """The kubelet's address fields: pod and host IPs, both lists."""
    status.update(podIP=ip, podIPs=[{"ip": ip}], hostIP=objects.HOST_IP, hostIPs=[{"ip": objects.HOST_IP}])
    return status


class PodRunner(JobRunner):
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
        super().__init__(api, fs, toolchain=toolchain, parallel=parallel, components=())
        self.proxy = proxy
        self.unpullable = unpullable if unpullable is not None else set()
        #: the in-cluster address of the API (the ``kubernetes`` Service, as kube-proxy makes it reachable)
        self.cluster_env: dict[str, str] = {}

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
        return None

    async def report(self, pod: dict[str, Any], status: dict[str, Any]) -> None:
        """Patch the Pod's status; while kube-apiserver is unreachable (a restart) keep trying, as the kubelet's
        status manager does: a lost final status would leave the Pod Running and its Job unfinished for ever."""
        meta = pod["metadata"]
        pause = 0.2
        while True:
            try:
                await self.api.patch(
                    PODS, meta["name"], meta["namespace"], {"status": status}, "status", strategic=True
                )
                return
            except ApiStatusError:  # gone or being replaced: nothing left to report to
                return
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
        try:
            argv, env, identity = await self._prepare_retrying(pod, container, ip)
        except (OSError, ValueError) as exc:  # a volume or ConfigMap the pod cannot start with
            return 128, f"CreateContainerConfigError: {exc}"
        env.update(self.cluster_env)
        return await self._execute(argv, env, root, identity, grace)

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

        async def one(container: dict[str, Any]) -> None:
            while True:
                running = objects.running_status(
                    container["name"], ip, started, True, restarts[container["name"]], container.get("image", "")
                )
                await self.report(pod, self._merged(pod, ip, started, running, results, last, inits))
                async with self._slots:
                    code, message = await self._container(pod, container, ip, grace)
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
