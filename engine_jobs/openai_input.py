"""A request body in, a validated request out: every way a body can be hostile or wrong is a 4xx in OpenAI's
error body, never a 5xx (body size 413, a body that does not arrive in time 408, JSON that is not JSON, nests
too deep, holds lone surrogates or too many messages 400)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from .openai_protocol import ApiError, ChatCompletionRequest, _Request, validation_error
from .openai_settings import FrontSettings


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"the number {text[:32]} is out of range")
    return value


def _check_shape(body: Any, max_depth: int) -> None:
    """Refuses nesting deeper than ``max_depth`` and strings that are not Unicode text (lone surrogates,
    which ``\\ud800`` escapes produce and no tokenizer can encode). Iterative: its cost is the body's size."""
    stack: list[tuple[Any, int]] = [(body, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > max_depth:
                raise ApiError(
                    400,
                    f"the request body nests arrays and objects deeper than {max_depth} levels (max_json_depth)",
                    code="invalid_json",
                )
            if isinstance(value, dict):
                for k, v in value.items():
                    _check_text(k)
                    stack.append((v, depth + 1))
            else:
                stack.extend((v, depth + 1) for v in value)
        elif isinstance(value, str):
            _check_text(value)


def _check_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(
            400, "the request body holds a string that is not valid Unicode (a lone surrogate)", code="invalid_json"
        ) from None


async def read_body(request: web.Request, s: FrontSettings) -> bytes:
    """The body, at most ``max_body_bytes`` (413) and arriving within ``body_timeout`` (408)."""
    too_large = ApiError(
        413,
        f"the request body exceeds this server's limit of {s.max_body_bytes} bytes (max_body_bytes)",
        code="request_too_large",
    )
    if request.content_length is not None and request.content_length > s.max_body_bytes:
        raise too_large
    try:
        async with asyncio.timeout(s.body_timeout):
            return await request.read()  # the app's client_max_size bounds chunked bodies too
    except web.HTTPRequestEntityTooLarge:
        raise too_large from None
    except TimeoutError:
        raise ApiError(
            408,
            f"the request body did not arrive within {s.body_timeout:g}s (body_timeout)",
            code="request_timeout",
        ) from None


def parse_body(raw: bytes, model: type[_Request], s: FrontSettings) -> _Request:
    """A request model from a body: every way a body can be wrong is a 400 in OpenAI's error body."""
    try:
        body = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant, parse_float=_finite)
    except RecursionError:  # deeper than the interpreter's own limit: certainly deeper than ours
        raise ApiError(
            400,
            f"the request body nests arrays and objects deeper than {s.max_json_depth} levels (max_json_depth)",
            code="invalid_json",
        ) from None
    except UnicodeDecodeError as exc:
        raise ApiError(
            400, f"the request body is not UTF-8: {exc.reason} at byte {exc.start}", code="invalid_json"
        ) from None
    except ValueError as exc:  # JSONDecodeError, NaN/Infinity, integers past Python's digit limit
        raise ApiError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    _check_shape(body, s.max_json_depth)
    try:
        req = model.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from None
    if isinstance(req, ChatCompletionRequest) and len(req.messages) > s.max_messages:
        raise ApiError(
            400,
            f"the request has {len(req.messages)} messages, more than this server's limit of {s.max_messages} "
            "(max_messages)",
            param="messages",
            code="invalid_value",
        )
    return req


async def receive(request: web.Request, model: type[_Request], s: FrontSettings) -> _Request:
    """``request``'s body as a ``model``, within the front's limits."""
    return parse_body(await read_body(request, s), model, s)
