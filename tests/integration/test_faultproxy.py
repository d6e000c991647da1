"""The fault proxy in front of the real kube-apiserver, and what the real control plane does when it is restarted
or compacted: the facts the fault campaign (``tests/harness/chaos.py``) builds on.

Upstream facts checked here (kube-apiserver v1.37.2, k8s.io/apiserver v0.37.2):

* a watch served by the watch cache survives an etcd compaction: the cache keeps its own event window
  (``pkg/storage/cacher/watch_cache_history.go`` ``GetIntervalLocked``); compaction prunes only its list
  snapshots (``cacher/compactor.go``). A watch served from etcd (its cache disabled) from a compacted
  resourceVersion gets ``ERROR 410 "The resourceVersion for the provided watch is too old."``;
* after a kube-apiserver restart, a cached watch from any resourceVersion before the restart gets
  ``ERROR 410 "too old resource version: R (N)"`` (the new cache begins at its first list);
* both 410s are ``ERROR`` events in a 200 stream, never an HTTP 410 (``cacher.go`` ``newErrWatcher``).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from harness.cluster import Kube
from harness.operator import chart_identity
from harness.waiting import wait_until
from redrafter_sim.controlplane import ControlPlane
from redrafter_sim.faultproxy import APF_429_BODY, FaultProxy


@pytest.fixture
def proxy(chaos_control_plane: ControlPlane) -> Iterator[FaultProxy]:
    with FaultProxy(chaos_control_plane) as p:
        yield p


class Client:
    """Requests with a bearer token, to the proxy or straight to kube-apiserver."""

    def __init__(self, cp: ControlPlane, kubeconfig: Path) -> None:
        doc = yaml.safe_load(kubeconfig.read_text())
        self.token = doc["users"][0]["user"]["token"]
        self.server = doc["clusters"][0]["cluster"]["server"]
        self.ctx = ssl.create_default_context(cafile=str(cp.pki.ca.cert))

    def call(
        self, method: str, path: str, body: Any = None, ctype: str = "application/json"
    ) -> tuple[int, Any, dict[str, str]]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        req.add_header("User-Agent", "faultproxy-test")
        if data is not None:
            req.add_header("Content-Type", ctype)
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=30) as resp:
                return resp.status, json.loads(resp.read() or b"null"), dict(resp.headers)
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                payload: Any = json.loads(raw)
            except ValueError:
                payload = raw.decode()
            return exc.code, payload, dict(exc.headers)

    def watch(self, path: str, rv: str, seconds: int = 30) -> Iterator[dict[str, Any]]:
        url = f"{self.server}{path}?watch=1&resourceVersion={rv}&timeoutSeconds={seconds}"
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(req, context=self.ctx, timeout=seconds + 10) as resp:
            assert resp.status == 200
            for line in resp:
                yield json.loads(line)


def configmap(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}}


def suspended_job(name: str) -> dict[str, Any]:
    container = {"name": "c", "image": "busybox", "command": ["true"]}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"suspend": True, "template": {"spec": {"restartPolicy": "Never", "containers": [container]}}},
    }


def operator_client(kube: Kube, proxy: FaultProxy, name: str = "op-a") -> Client:
    source = chart_identity(kube)
    return Client(kube.cp, proxy.kubeconfig(source, kube.home / f"{name}.kubeconfig", name=name))


def test_requests_pass_with_the_token_and_are_counted_by_who(chaos_kube: Kube, proxy: FaultProxy) -> None:
    op = operator_client(chaos_kube, proxy)
    ns = chaos_kube.namespace
    mark = proxy.mark()
    code, body, _ = op.call("POST", f"/api/v1/namespaces/{ns}/configmaps", configmap("seen"))
    assert code == 201, body
    code, body, _ = op.call("GET", f"/api/v1/namespaces/{ns}/configmaps?fieldSelector=metadata.name%3Dseen")
    assert (code, [o["data"] for o in body["items"]]) == (200, [{"k": "v"}]), body
    # RBAC is the API server's: the chart grants list, watch, create and patch on ConfigMaps, never get
    code, body, _ = op.call("GET", f"/api/v1/namespaces/{ns}/configmaps/seen")
    assert code == 403 and body["reason"] == "Forbidden", body
    seen = proxy.requests(mark)
    assert [(r.who, r.method, r.status, r.injected) for r in seen] == [
        ("op-a", "POST", 201, False),
        ("op-a", "GET", 200, False),
        ("op-a", "GET", 403, False),
    ]
    assert seen[0].user_agent == "faultproxy-test"
    assert proxy.writes_by(mark) == {"op-a": 1}


def test_injected_errors_are_written_as_kube_apiserver_writes_them(chaos_kube: Kube, proxy: FaultProxy) -> None:
    op = operator_client(chaos_kube, proxy)
    ns = chaos_kube.namespace
    assert op.call("POST", f"/api/v1/namespaces/{ns}/configmaps", configmap("c"))[0] == 201
    path = f"/api/v1/namespaces/{ns}/configmaps"

    proxy.inject(500, times=1)
    code, body, _ = op.call("GET", path)
    assert (code, body["kind"], body["reason"], body["code"]) == (500, "Status", "InternalError", 500)
    assert body["message"].startswith("Internal error occurred: ")

    proxy.inject(429, times=1, retry_after=2)
    code, text, headers = op.call("GET", path)
    assert (code, text, headers["Retry-After"]) == (429, APF_429_BODY, "2")

    proxy.inject(409, times=1, methods=["PATCH"])
    assert op.call("GET", path)[0] == 200  # reads are not matched
    code, body, _ = op.call("PATCH", f"{path}/c", {"data": {"k": "w"}}, "application/merge-patch+json")
    assert (code, body["reason"], body["details"]["name"]) == (409, "Conflict", "c")
    assert body["message"].startswith('Operation cannot be fulfilled on configmaps "c": the object has been modified')
    code, body, _ = op.call("GET", f"{path}?fieldSelector=metadata.name%3Dc")
    assert [o["data"] for o in body["items"]] == [{"k": "v"}]  # the injected 409 never reached kube-apiserver

    proxy.inject(0, times=1, delay=0.4)
    started = time.monotonic()
    assert op.call("GET", path)[0] == 200
    assert time.monotonic() - started >= 0.4
    assert [r.injected for r in proxy.requests()[-6:]] == [True, True, False, True, False, False]


@pytest.mark.parametrize("reset", [False, True])
def test_watches_stream_event_by_event_and_are_cut(chaos_kube: Kube, proxy: FaultProxy, reset: bool) -> None:
    op = operator_client(chaos_kube, proxy)
    ns = chaos_kube.namespace
    code, body, _ = op.call("GET", f"/api/v1/namespaces/{ns}/configmaps")
    rv = body["metadata"]["resourceVersion"]
    events: list[str] = []
    ended: list[str] = []

    def consume() -> None:
        """As kopf reads a watch (aiohttp): a clean end ends the iteration, a reset raises."""

        async def read() -> None:
            url = f"{op.server}/api/v1/namespaces/{ns}/configmaps?watch=1&resourceVersion={rv}&timeoutSeconds=30"
            headers = {"Authorization": f"Bearer {op.token}"}
            async with aiohttp.ClientSession() as session, session.get(url, headers=headers, ssl=op.ctx) as resp:
                async for line in resp.content:
                    ev = json.loads(line)
                    events.append(f"{ev['type']} {ev['object']['metadata']['name']}")

        try:
            asyncio.run(read())
            ended.append("clean")
        except (aiohttp.ClientError, OSError) as exc:
            ended.append(type(exc).__name__)

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    wait_until(lambda: proxy._streams, 10, "the watch to open")
    op.call("POST", f"/api/v1/namespaces/{ns}/configmaps", configmap("one"))
    wait_until(lambda: "ADDED one" in events, 10, "the event through the proxy")
    assert proxy.cut_watches(reset=reset) == 1
    t.join(10)
    assert ended == (["ClientPayloadError"] if reset else ["clean"])


def test_a_compaction_expires_watches_served_from_etcd_not_from_the_watch_cache(
    chaos_kube: Kube, proxy: FaultProxy
) -> None:
    """Jobs are served from etcd in this control plane (chaos.APISERVER_ARGS), ConfigMaps from the cache."""
    op = operator_client(chaos_kube, proxy)
    ns = chaos_kube.namespace
    job_rv = op.call("POST", f"/apis/batch/v1/namespaces/{ns}/jobs", suspended_job("j1"))[1]["metadata"][
        "resourceVersion"
    ]
    cm_rv = op.call("POST", f"/api/v1/namespaces/{ns}/configmaps", configmap("c1"))[1]["metadata"]["resourceVersion"]
    op.call("POST", f"/apis/batch/v1/namespaces/{ns}/jobs", suspended_job("j2"))
    op.call("POST", f"/api/v1/namespaces/{ns}/configmaps", configmap("c2"))
    chaos_kube.cp.compact()

    jobs = list(op.watch(f"/apis/batch/v1/namespaces/{ns}/jobs", job_rv, seconds=2))
    assert [(e["type"], e["object"]["code"], e["object"]["reason"]) for e in jobs] == [("ERROR", 410, "Expired")]
    assert jobs[0]["object"]["message"] == "The resourceVersion for the provided watch is too old."
    cms = list(op.watch(f"/api/v1/namespaces/{ns}/configmaps", cm_rv, seconds=2))
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in cms] == [("ADDED", "c2")]
    assert proxy.watch_errors[410] == 1  # counted from the stream: kube-apiserver's, not the proxy's


def test_restarts_of_kube_apiserver_and_etcd(chaos_kube: Kube, proxy: FaultProxy) -> None:
    """While kube-apiserver is down the proxy answers 503; once it is back a cached watch from before the
    restart is expired. etcd restarted keeps every object (the API server reconnects on its own)."""
    op = operator_client(chaos_kube, proxy)
    ns = chaos_kube.namespace
    cm_rv = op.call("POST", f"/api/v1/namespaces/{ns}/configmaps", configmap("before"))[1]["metadata"][
        "resourceVersion"
    ]
    down: list[int] = []
    chaos_kube.cp.restart(
        "kube-apiserver", down=lambda: down.append(op.call("GET", f"/api/v1/namespaces/{ns}/configmaps")[0])
    )
    assert down == [503]
    events = list(op.watch(f"/api/v1/namespaces/{ns}/configmaps", cm_rv, seconds=2))
    assert [(e["type"], e["object"]["code"]) for e in events] == [("ERROR", 410)], events
    assert events[0]["object"]["message"].startswith(f"too old resource version: {cm_rv} (")

    chaos_kube.cp.restart("etcd")
    got = wait_until(
        lambda: (lambda r: r if r[0] == 200 else None)(op.call("GET", f"/api/v1/namespaces/{ns}/configmaps")),
        60,
        "kube-apiserver to answer again after etcd's restart",
    )
    assert {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in got[1]["items"]}["before"] == cm_rv
