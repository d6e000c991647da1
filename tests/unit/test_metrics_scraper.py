"""PodScraper against real local HTTP servers: healthy pods, a dead pod, a slow pod, bad payloads."""

import asyncio
import socket

import aiohttp
import pytest
from aiohttp import web

from engine_jobs import contract as c
from redrafter_operator.metrics import PodScraper, PodTarget, advance


def exposition(requests: int, draft: int, accepted: int, active: int = 3) -> str:
    return (
        f'# TYPE {c.METRIC_REQUESTS} counter\n{c.METRIC_REQUESTS}{{model="chat",variant="redrafter"}} {requests}\n'
        f'# TYPE {c.METRIC_DRAFT_TOKENS} counter\n{c.METRIC_DRAFT_TOKENS}{{model="chat",variant="redrafter"}} {draft}\n'
        f"# TYPE {c.METRIC_ACCEPTED_DRAFT_TOKENS} counter\n"
        f'{c.METRIC_ACCEPTED_DRAFT_TOKENS}{{model="chat",variant="redrafter"}} {accepted}\n'
        f"# TYPE {c.METRIC_TRTLLM_REQUESTS} gauge\n"
        f'{c.METRIC_TRTLLM_REQUESTS}{{model="tensorrt_llm",request_type="active",version="1"}} {active}\n'
    )


class Pods:
    """A tiny metrics server; path /p/<name>/metrics is not used: one server per port is simpler."""

    def __init__(self):
        self.runners: list[web.AppRunner] = []

    async def serve(self, handler) -> int:
        app = web.Application()
        app.router.add_get("/metrics", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.runners.append(runner)
        return site._server.sockets[0].getsockname()[1]

    async def close(self):
        for r in self.runners:
            await r.cleanup()


@pytest.fixture
async def pods():
    p = Pods()
    yield p
    await p.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def target(name: str, port: int, **kw) -> PodTarget:
    return PodTarget(
        name=name, uid=f"uid-{name}", variant="redrafter", pool="redrafter", ip="127.0.0.1", port=port, **kw
    )


async def test_scrapes_healthy_pods_and_reports_dead_and_slow_ones(pods):
    state = {"n": 0}

    async def healthy(_req):
        state["n"] += 1
        return web.Response(text=exposition(100 * state["n"], 1000 * state["n"], 600 * state["n"]))

    async def slow(_req):
        await asyncio.sleep(1.5)
        return web.Response(text=exposition(1, 1, 1))

    async def broken(_req):
        return web.Response(status=503, text="unavailable")

    p_ok, p_slow, p_broken = await pods.serve(healthy), await pods.serve(slow), await pods.serve(broken)
    targets = [
        target("ok", p_ok),
        target("slow", p_slow),
        target("broken", p_broken),
        target("dead", free_port()),
        PodTarget("noip", "u", "redrafter", "redrafter", ip=None),
    ]
    times = iter([10.0, 10.0, 40.0, 40.0])
    async with aiohttp.ClientSession() as session:
        scraper = PodScraper("chat", timeout=0.3, session=session, clock=lambda: next(times))
        r1 = await scraper.read(targets)
        errors = {e.pod: e.error for e in r1.errors}
        assert [s.pod for s in r1.samples] == ["ok"]
        assert set(errors) == {"slow", "broken", "dead", "noip"}
        assert "timed out" in errors["slow"] and "HTTP 503" in errors["broken"]
        assert "no IP" in errors["noip"] and "Connect" in errors["dead"]
        sample = r1.samples[0]
        assert sample.counters == {"requests": 100, "draft_tokens": 1000, "accepted_draft_tokens": 600}
        assert sample.load == {"active": 3} and sample.identity == "uid-ok/0"

        w1, st = advance(None, r1)
        r2 = await scraper.read(targets)
    w2, _ = advance(st, r2)
    agg = w2.variants["redrafter"]
    assert agg.samples == 100 and agg.acceptance_rate == pytest.approx(0.6)
    assert agg.pods_failed == 4 and agg.pods_reporting == 1


async def test_malformed_payload_is_a_pod_error(pods):
    async def garbage(_req):
        return web.Response(text='redrafter_requests_total{model="chat" 1\n')

    port = await pods.serve(garbage)
    reading = await PodScraper("chat", timeout=1.0).read([target("g", port)])
    assert not reading.samples and "malformed" in reading.errors[0].error


async def test_scrapes_concurrently(pods):
    """All pods are in flight at once (observed by the servers, not by timing)."""
    flight = {"now": 0, "max": 0}
    all_in = asyncio.Event()

    async def slowish(_req):
        flight["now"] += 1
        flight["max"] = max(flight["max"], flight["now"])
        if flight["max"] == 5:
            all_in.set()
        await asyncio.wait_for(all_in.wait(), 2.0)  # released only when every pod is being scraped
        flight["now"] -= 1
        return web.Response(text=exposition(1, 1, 1))

    ports = [await pods.serve(slowish) for _ in range(5)]
    reading = await PodScraper("chat", timeout=3.0).read([target(f"p{i}", p) for i, p in enumerate(ports)])
    assert len(reading.samples) == 5 and flight["max"] == 5


def test_target_from_pod_object():
    pod = {
        "metadata": {
            "name": "chat-base-abc",
            "uid": "u-1",
            "labels": {"redrafter.dev/variant": "redrafter", "redrafter.dev/traffic": "base"},
        },
        "status": {
            "podIP": "10.0.0.7",
            "startTime": "2026-01-01T00:00:00Z",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"restartCount": 2, "state": {"running": {"startedAt": "2026-01-01T00:05:00Z"}}}],
        },
    }
    t = PodTarget.from_pod(pod)
    assert (t.variant, t.pool, t.ip, t.port, t.identity) == ("redrafter", "base", "10.0.0.7", c.METRICS_PORT, "u-1/2")
    assert t.started_at == 1767225900.0
    with pytest.raises(ValueError, match="variant"):
        PodTarget.from_pod({"metadata": {"name": "x", "labels": {}}, "status": {}})


def test_targets_from_pods_keeps_ready_serving_pods():
    from redrafter_operator.metrics import targets_from_pods

    def pod(name, ready=True, variant="base", deleting=False, role="primary"):
        meta = {
            "name": name,
            "uid": name,
            "labels": {"redrafter.dev/variant": variant, "redrafter.dev/role": role} if variant else {},
        }
        if deleting:
            meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        return {
            "metadata": meta,
            "status": {"podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": str(ready)}]},
        }

    pods = [
        pod("b"),
        pod("a", variant="redrafter"),
        pod("not-ready", ready=False),
        pod("no-label", variant=None),
        pod("deleting", deleting=True),
        pod("candidate", variant="redrafter", role="candidate"),
    ]
    assert [(t.name, t.variant, t.pool) for t in targets_from_pods(pods)] == [
        ("a", "redrafter", "redrafter"),
        ("b", "base", "base"),
    ]


def test_source_for_follows_the_spec():
    from redrafter_operator.api.spec import ReDrafterDeploymentSpec
    from redrafter_operator.metrics import PrometheusSource, source_for

    base = {"model": {"base": {"source": "hf://o/b"}, "drafter": {"source": "hf://o/d"}}}
    src = source_for(ReDrafterDeploymentSpec.model_validate(base), "chat", "ns")
    assert isinstance(src, PodScraper) and src.timeout == 2.0
    prom = ReDrafterDeploymentSpec.model_validate(
        {**base, "metrics": {"source": "Prometheus", "prometheusUrl": "http://prom:9090", "scrapeTimeoutSeconds": 4}}
    )
    src = source_for(prom, "chat", "ns")
    assert isinstance(src, PrometheusSource) and src.url == "http://prom:9090" and src.timeout == 4


async def test_large_exposition_is_read_whole(pods):
    """A real Triton exposition is hundreds of KiB: the body must be read to the end, not one chunk."""
    padding = "# TYPE nv_gpu_utilization gauge\n" + "".join(
        f'nv_gpu_utilization{{gpu_uuid="GPU-{i:06d}"}} 0.5\n' for i in range(20000)
    )

    async def big(_req):
        return web.Response(text=padding + exposition(42, 100, 70))

    port = await pods.serve(big)
    reading = await PodScraper("chat", timeout=5.0).read([target("big", port)])
    assert len(padding) > 500_000
    assert reading.samples[0].counters["requests"] == 42 and reading.samples[0].load == {"active": 3}


def front_exposition(in_flight: int, queued: int) -> str:
    return (
        f"# TYPE {c.METRIC_FRONT_IN_FLIGHT} gauge\n{c.METRIC_FRONT_IN_FLIGHT} {in_flight}\n"
        f"# TYPE {c.METRIC_FRONT_QUEUED} gauge\n{c.METRIC_FRONT_QUEUED} {queued}\n"
        f"# TYPE {c.METRIC_FRONT_MAX_QUEUED} gauge\n{c.METRIC_FRONT_MAX_QUEUED} 256\n"
    )


async def test_the_front_queue_is_part_of_the_load(pods):
    """Requests queued in the OpenAI front count as waiting; a front that cannot be read leaves the rest of
    the sample (missing data for that part only), a pod without a front port is not asked."""
    from redrafter_operator.metrics import queue_of

    async def triton(_req):
        return web.Response(text=exposition(10, 100, 60, active=8))

    async def front(_req):
        return web.Response(text=front_exposition(8, 5))

    async def broken(_req):
        return web.Response(status=500)

    t_port, f_port, bad_port = await pods.serve(triton), await pods.serve(front), await pods.serve(broken)
    reading = await PodScraper("chat", timeout=1.0).read(
        [
            target("with-front", t_port, front_port=f_port),
            target("front-down", t_port, front_port=free_port()),
            target("front-broken", t_port, front_port=bad_port),
            target("no-front", t_port),
        ]
    )
    assert not reading.errors
    loads = {s.pod: dict(s.load) for s in reading.samples}
    assert loads["with-front"] == {"active": 8, "front_in_flight": 8, "front_queued": 5}
    assert loads["front-down"] == loads["front-broken"] == loads["no-front"] == {"active": 8}
    assert queue_of(loads["with-front"]) == 13 and queue_of(loads["no-front"]) == 8
    assert all(s.counters["requests"] == 10 for s in reading.samples)
    # Triton's port decides whether the pod answered, whatever its front says
    reading = await PodScraper("chat", timeout=1.0).read([target("triton-down", free_port(), front_port=f_port)])
    assert not reading.samples and reading.errors[0].pod == "triton-down"


def test_front_port_comes_from_the_pod_spec():
    from redrafter_operator.render.serving import PORTS

    def pod(ports):
        return {
            "metadata": {"name": "p", "labels": {"redrafter.dev/variant": "base"}},
            "spec": {"containers": [{"name": "triton", "ports": ports}]},
            "status": {"podIP": "10.0.0.7"},
        }

    rendered = [{"name": n, "containerPort": p, "protocol": "TCP"} for n, p in PORTS]
    assert PodTarget.from_pod(pod(rendered)).front_port == c.OPENAI_PORT
    # a pod rendered before the front existed runs none: nothing to ask
    assert PodTarget.from_pod(pod(rendered[:3])).front_port is None
    assert PodTarget.from_pod({**pod([]), "spec": {}}).front_port is None
