"""PrometheusSource against a small fake Prometheus HTTP API served locally."""

import aiohttp
import pytest
from aiohttp import web

from engine_jobs import contract as c
from redrafter_operator.metrics import PodTarget, PrometheusError, PrometheusSource, advance
from redrafter_operator.metrics.prometheus import build_query


def series(name, pod, value, **labels):
    return {"metric": {"__name__": name, "namespace": "ns", "pod": pod, **labels}, "value": [1.0, str(value)]}


@pytest.fixture
async def fake_prometheus():
    """Serves /api/v1/query; ``state['result']`` is returned, ``state['queries']`` records the queries."""
    state = {"result": [], "queries": [], "status": 200, "body": None}

    async def query(request):
        form = await request.post()
        state["queries"].append(form["query"])
        if state["body"] is not None:
            return web.Response(status=state["status"], text=state["body"])
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": state["result"]}})

    app = web.Application()
    app.router.add_post("/api/v1/query", query)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}", state
    await runner.cleanup()


TARGETS = [
    PodTarget("a", "ua", "redrafter", "redrafter"),
    PodTarget("b", "ub", "redrafter", "redrafter"),
    PodTarget("gone", "ug", "redrafter", "redrafter"),
]


def pod_series(pod, requests, draft, accepted, up=1):
    return [
        series(c.METRIC_REQUESTS, pod, requests, model="chat", variant="redrafter"),
        series(c.METRIC_DRAFT_TOKENS, pod, draft, model="chat", variant="redrafter"),
        series(c.METRIC_ACCEPTED_DRAFT_TOKENS, pod, accepted, model="chat", variant="redrafter"),
        series(c.METRIC_TRTLLM_REQUESTS, pod, 4, model="tensorrt_llm", request_type="active"),
        series(c.METRIC_QUEUE_DURATION, pod, 1000, model="tensorrt_llm"),
        series("up", pod, up),
    ]


async def test_same_interface_and_windows_as_the_scraper(fake_prometheus):
    url, state = fake_prometheus
    times = iter([100.0, 130.0])
    async with aiohttp.ClientSession() as session:
        src = PrometheusSource(url + "/", "chat", "ns", session=session, clock=lambda: next(times))
        state["result"] = pod_series("a", 10, 100, 50) + pod_series("b", 5, 100, 40, up=0)
        r1 = await src.read(TARGETS)
        assert [s.pod for s in r1.samples] == ["a"]
        errs = {e.pod: e.error for e in r1.errors}
        assert "up == 0" in errs["b"] and "no series" in errs["gone"]
        assert r1.samples[0].counters == {
            "requests": 10,
            "draft_tokens": 100,
            "accepted_draft_tokens": 50,
            "queue_us": 1000,
        }
        assert r1.samples[0].load == {"active": 4}
        _, st = advance(None, r1)
        state["result"] = pod_series("a", 70, 1100, 750)
        r2 = await src.read(TARGETS)
    w, _ = advance(st, r2)
    agg = w.variants["redrafter"]
    assert agg.samples == 60 and agg.acceptance_rate == pytest.approx(0.7) and agg.seconds == 30
    q = state["queries"][0]
    assert 'namespace="ns"' in q and 'pod=~"a|b|gone"' in q and c.METRIC_REQUESTS in q


async def test_prometheus_failure_raises(fake_prometheus):
    url, state = fake_prometheus
    state["body"], state["status"] = '{"status":"error","error":"parse error"}', 400
    with pytest.raises(PrometheusError, match="parse error"):
        await PrometheusSource(url, "chat", "ns").read(TARGETS)
    with pytest.raises(PrometheusError, match="ClientConnectorError|Connect"):
        await PrometheusSource("http://127.0.0.1:1", "chat", "ns", timeout=1).read(TARGETS)


async def test_no_targets_reads_nothing(fake_prometheus):
    url, state = fake_prometheus
    r = await PrometheusSource(url, "chat", "ns").read([])
    assert r.samples == () and r.errors == () and state["queries"] == []


def test_query_escapes_pod_names():
    q = build_query('n"s', ["a.b"])
    assert 'namespace="n\\"s"' in q and 'pod=~"a\\\\.b"' in q


async def test_the_front_queue_comes_from_its_own_endpoint(fake_prometheus):
    """The PodMonitor scrapes the front's port too: its gauges join the pod's load; a front endpoint that is
    down leaves the Triton part; only front series (Triton's went stale) is missing data."""
    url, state = fake_prometheus
    front = [series(c.METRIC_FRONT_QUEUED, "a", 7), series(c.METRIC_FRONT_IN_FLIGHT, "a", 4), series("up", "a", 1)]
    state["result"] = (
        pod_series("a", 10, 100, 50)
        + front
        + pod_series("b", 10, 100, 50)
        + [series("up", "b", 0)]  # b's front endpoint is down
        + [series(c.METRIC_FRONT_QUEUED, "gone", 3), series("up", "gone", 1), series("up", "gone", 0)]
    )
    r = await PrometheusSource(url, "chat", "ns").read(TARGETS)
    loads = {s.pod: dict(s.load) for s in r.samples}
    assert loads == {"a": {"active": 4, "front_queued": 7, "front_in_flight": 4}, "b": {"active": 4}}
    assert [e.pod for e in r.errors] == ["gone"] and "Triton" in r.errors[0].error
    assert c.METRIC_FRONT_QUEUED in state["queries"][0]
