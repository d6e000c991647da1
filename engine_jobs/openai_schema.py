"""The OpenAPI 3.1 document of the OpenAI front (``GET /openapi.json``), generated from the pydantic models.

Request bodies are the models the front validates with (:mod:`.openai_protocol`); responses are the
models below, which describe what the handlers write. Every status a path can answer is listed, each
with OpenAI's error body, so a schema-driven fuzzer (the test suite runs schemathesis against it) can
check responses against the document.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from .contract import ACCEPTANCE_HEADER, OPENAI_READY_PATH
from .openai_protocol import ChatCompletionRequest, CompletionRequest


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    """OpenAI's error body."""

    error: ErrorDetail


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: None
    finish_reason: Literal["stop", "length"]


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: None
    finish_reason: Literal["stop", "length"]


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class Readiness(BaseModel):
    ready: bool


class Liveness(BaseModel):
    live: bool


_ERRORS = {
    "400": "Malformed or unsupported request (OpenAI's invalid_request_error)",
    "401": "Missing or wrong API key (invalid_api_key), when the server requires keys",
    "404": "Unknown model (model_not_found)",
    "408": "The request body did not arrive in time (request_timeout)",
    "413": "The request body is larger than the server's limit (request_too_large)",
    "429": "The server is at capacity (queue_full, queue_timeout); see Retry-After",
    "500": "The engine failed the request (upstream_error)",
    "503": "The inference server is not ready (service_unavailable); see Retry-After",
    "504": "The generation did not finish within the server's time limit (timeout)",
}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(name: str, description: str, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"description": description, "content": {"application/json": {"schema": _ref(name)}}}
    if headers:
        out["headers"] = headers
    return out


def _errors(*statuses: str) -> dict[str, Any]:
    return {s: _json("ErrorBody", _ERRORS[s]) for s in statuses}


_GENERATION_ERRORS = ("400", "401", "404", "408", "413", "429", "500", "503", "504")


def _generation(request: str, response: str, summary: str) -> dict[str, Any]:
    ok = _json(
        response,
        "The generation; with stream true, Server-Sent Events of chunks ending with `data: [DONE]` (a failure "
        "after the first chunk is an event holding OpenAI's error body)",
        {ACCEPTANCE_HEADER: {"description": "accepted / drafted tokens", "schema": {"type": "string"}}},
    )
    ok["content"]["text/event-stream"] = {"schema": {"type": "string"}}
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(request)}}},
            "responses": {"200": ok, **_errors(*_GENERATION_ERRORS)},
        }
    }


@cache
def openapi_document() -> dict[str, Any]:
    _, defs = models_json_schema(
        [
            (CompletionRequest, "validation"),
            (ChatCompletionRequest, "validation"),
            (ErrorBody, "serialization"),
            (ModelList, "serialization"),
            (Completion, "serialization"),
            (ChatCompletion, "serialization"),
            (Readiness, "serialization"),
            (Liveness, "serialization"),
        ],
        ref_template="#/components/schemas/{model}",
    )
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "ReDrafter OpenAI-compatible API",
            "version": "1",
            "description": "The serving pod's OpenAI-compatible front (docs/openai-api.md).",
        },
        "security": [{}, {"bearerAuth": []}],
        "paths": {
            "/v1/models": {
                "get": {
                    "summary": "The served model",
                    "responses": {"200": _json("ModelList", "The one model this server serves"), **_errors("401")},
                }
            },
            "/v1/models/{model}": {
                "get": {
                    "summary": "One model",
                    "parameters": [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}],
                    "responses": {"200": _json("ModelCard", "The model"), **_errors("401", "404")},
                }
            },
            "/v1/completions": _generation("CompletionRequest", "Completion", "Text completion"),
            "/v1/chat/completions": _generation("ChatCompletionRequest", "ChatCompletion", "Chat completion"),
            OPENAI_READY_PATH: {
                "get": {
                    "summary": "Readiness (Triton and its entry model)",
                    "security": [{}],
                    "responses": {
                        "200": _json("Readiness", "Ready"),
                        "503": _json("Readiness", "Not ready"),
                    },
                }
            },
            "/health/live": {
                "get": {"summary": "Liveness", "security": [{}], "responses": {"200": _json("Liveness", "Live")}}
            },
            "/metrics": {
                "get": {
                    "summary": "The front's metrics (Prometheus text format)",
                    "security": [{}],
                    "responses": {
                        "200": {"description": "Metrics", "content": {"text/plain": {"schema": {"type": "string"}}}}
                    },
                }
            },
        },
        "components": {
            "schemas": defs["$defs"],
            "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}},
        },
    }
