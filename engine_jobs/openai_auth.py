"""API keys on the OpenAI front: ``Authorization: Bearer <key>`` on every path but health, metrics and the API's
description (the keys themselves, and their reloads: :mod:`.api_keys`)."""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from .api_keys import ApiKeys, bearer
from .contract import OPENAI_READY_PATH
from .openai_protocol import ApiError

#: paths answered without an API key: probes, scrapers, the API's description
UNAUTHENTICATED_PATHS = frozenset({OPENAI_READY_PATH, "/health/live", "/metrics", "/openapi.json"})


def auth(keys: ApiKeys | None) -> Middleware:
    """The middleware that refuses a request without one of ``keys`` (401); None: every request passes."""

    @web.middleware
    async def check_key(request: web.Request, handler: Handler) -> web.StreamResponse:
        if keys is not None and request.path not in UNAUTHENTICATED_PATHS:
            token = bearer(request.headers.get("Authorization"))
            if not keys.check(token):
                raise ApiError(
                    401,
                    "Incorrect API key provided." if token else "Missing API key: send Authorization: Bearer <key>.",
                    code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"},
                )
        return await handler(request)

    return check_key
