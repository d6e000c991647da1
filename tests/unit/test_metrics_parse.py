"""Parsing Triton's exposition and folding it into counters and load gauges."""

import pytest

from engine_jobs import contract as c
from redrafter_operator.metrics import collect, parse_exposition

TEXT = f"""# HELP {c.METRIC_REQUESTS} finished requests
# TYPE {c.METRIC_REQUESTS} counter
{c.METRIC_REQUESTS}{{model="chat",variant="redrafter"}} 120
{c.METRIC_REQUESTS}{{model="other",variant="redrafter"}} 999
# TYPE {c.METRIC_DRAFT_TOKENS} counter
{c.METRIC_DRAFT_TOKENS}{{model="chat",variant="redrafter"}} 1000
# TYPE {c.METRIC_ACCEPTED_DRAFT_TOKENS} counter
{c.METRIC_ACCEPTED_DRAFT_TOKENS}{{model="chat",variant="redrafter"}} 450
# TYPE {c.METRIC_ACCEPTANCE_HISTOGRAM} histogram
{c.METRIC_ACCEPTANCE_HISTOGRAM}_bucket{{model="chat",variant="redrafter",le="0.5"}} 3
{c.METRIC_ACCEPTANCE_HISTOGRAM}_bucket{{model="chat",variant="redrafter",le="+Inf"}} 5
{c.METRIC_ACCEPTANCE_HISTOGRAM}_sum{{model="chat",variant="redrafter"}} 2.5
{c.METRIC_ACCEPTANCE_HISTOGRAM}_count{{model="chat",variant="redrafter"}} 5
# TYPE {c.METRIC_TRTLLM_REQUESTS} gauge
{c.METRIC_TRTLLM_REQUESTS}{{model="tensorrt_llm",request_type="active",version="1"}} 5
{c.METRIC_TRTLLM_REQUESTS}{{model="tensorrt_llm",request_type="max",version="1"}} 8
{c.METRIC_TRTLLM_REQUESTS}{{model="tensorrt_llm",request_type="waiting",version="1"}} 2
{c.METRIC_TRTLLM_REQUESTS}{{model="tensorrt_llm",request_type="context",version="1"}} 1
# TYPE {c.METRIC_QUEUE_DURATION} counter
{c.METRIC_QUEUE_DURATION}{{model="tensorrt_llm",version="1"}} 12345
{c.METRIC_QUEUE_DURATION}{{model="ensemble",version="1"}} 99999
"""


def test_collect_keeps_this_deployment_and_engine_model():
    counters, load = collect(parse_exposition(TEXT), "chat")
    assert counters == {"requests": 120, "draft_tokens": 1000, "accepted_draft_tokens": 450, "queue_us": 12345}
    assert load == {"active": 5, "max": 8, "waiting": 2}


def test_missing_families_are_absent_not_zero():
    counters, load = collect(parse_exposition("# TYPE x counter\nx_total 1\n"), "chat")
    assert counters == {} and load == {}


def test_malformed_text_is_a_value_error():
    with pytest.raises(ValueError, match="malformed"):
        parse_exposition('redrafter_requests_total{model="chat" 12\n')


def test_nan_values_are_skipped():
    counters, _ = collect([(c.METRIC_REQUESTS, {"model": "chat"}, float("nan"))], "chat")
    assert counters == {}
