"""A fault-injecting proxy between a client (the operator) and the real kube-apiserver.

It serves TLS on 127.0.0.1 with a certificate from the control plane's CA, so a copy of the client's kubeconfig
with only ``server`` changed keeps working; it forwards every request to kube-apiserver (verified against the same
CA) with the client's ``Authorization`` header, and streams watch responses chunk by chunk. Bearer tokens only: a
client certificate ends at the proxy.

What it can do to the traffic (each call thread-safe, effective for the next requests):

* :meth:`FaultProxy.inject`: the next ``times`` matching requests answer ``status`` as kube-apiserver writes it
  (a ``Status`` body; 429 as its priority-and-fairness filter writes it, plain text with ``Retry-After``), or
  ``status=0``: pass through ``delay`` seconds late;
* :meth:`FaultProxy.cut_watches`: end every open watch stream, cleanly (the last chunk, as a server-side watch
  timeout does) or by a reset connection (TCP RST mid-stream);
* :meth:`FaultProxy.lift_faults`: drop what is left of the injected faults.

It records every request (:class:`Request`: who, what, the status the client got, injected or not) and counts
the ``ERROR`` events that watch streams carried (``watch_errors``: a 410 there came from kube-apiserver, never
from the proxy). Who: the name given to the bearer token with :meth:`FaultProxy.name_token`, else the token's
``sub`` claim (read, not verified: the API server verifies it), else ``anonymous``.

The proxy runs its own event loop in a thread, so blocking callers (a benchmark, a synchronous test) and
asynchronous ones use it alike.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import re
import socket
import ssl
import struct
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web

from .controlplane import ControlPlane, free_port, write_yaml

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# Hop-by-hop headers (RFC 9110 7.6.1) and what aiohttp sets itself.
_DROP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "host"}
)
_REASONS = {  # k8s.io/apimachinery pkg/api/errors: the reason each constructor sets
    403: "Forbidden",
    409: "Conflict",
    410: "Expired",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}
# k8s.io/apiserver pkg/server/filters/priority-and-fairness.go tooManyRequests (v0.37.2)
APF_429_BODY = "Too many requests, please try again later.\n"
_PATH = re.compile(
    r"^/(?:api/(?P<cv>v1)|apis/(?P<group>[^/]+)/(?P<gv>[^/]+))"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<resource>[^/]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>[^/]+))?$"
)


@dataclass
class Fault:
    """``times`` more requests matching ``methods`` and ``path`` answer ``status`` (0: pass, ``delay`` late)."""

    status: int
    remaining: int
    methods: frozenset[str]
    path: re.Pattern[str]
    message: str = ""
    retry_after: int | None = None
    delay: float = 0.0

    def matches(self, method: str, path: str) -> bool:
        return self.remaining > 0 and ("*" in self.methods or method in self.methods) and bool(self.path.search(path))


@dataclass(frozen=True)
class Request:
    """One request as the proxy saw it; ``status`` is what the client got (None: the connection broke first)."""

    at: float  # time.monotonic() when it arrived
    who: str
    user_agent: str
    method: str
    path: str
    query: str
    status: int | None
    injected: bool
    body: str = ""  # a write's body, its first 8,000 characters (what an idle write changed)

    @property
    def watch(self) -> bool:
        return is_watch(self.path, self.query)

    @property
    def write(self) -> bool:
        return self.method in WRITE_METHODS

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


def is_watch(path: str, query: str) -> bool:
    return "/watch/" in path or bool(re.search(r"(?:^|&)watch=(?:true|1)(?:&|$)", query))


def token_subject(token: str) -> str | None:
    """The ``sub`` claim of a JWT (unverified), e.g. ``system:serviceaccount:ns:name``."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, binascii.Error):
        return None
    sub = claims.get("sub") if isinstance(claims, dict) else None
    return sub if isinstance(sub, str) else None


def status_body(code: int, message: str, method: str, path: str, retry_after: int | None = None) -> dict[str, Any]:
    """The ``Status`` kube-apiserver writes for this error (``details`` name the object, as NewConflict does)."""
    details: dict[str, Any] = {}
    m = _PATH.match(path)
    if m and code == 409:
        resource = m["resource"] + (f".{m['group']}" if m["group"] else "")
        details = {"name": m["name"] or "", "group": m["group"] or "", "kind": m["resource"]}
        message = (
            message or "the object has been modified; please apply your changes to the latest version and try again"
        )
        message = f'Operation cannot be fulfilled on {resource} "{m["name"] or ""}": {message}'
    elif code == 500:
        details = {"causes": [{"message": message or "etcdserver: request timed out"}]}
        message = f"Internal error occurred: {message or 'etcdserver: request timed out'}"
    if retry_after is not None:
        details["retryAfterSeconds"] = retry_after
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message or f"{method} {path}: injected {code}",
        "reason": _REASONS.get(code, ""),
        "code": code,
    }
    if details:
        body["details"] = details
    return body


class _Stream:
    """An open watch stream: cut it cleanly or by a reset."""

    def __init__(self, request: web.Request, response: web.StreamResponse) -> None:
        self.request = request
        self.response = response
        self.cut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()  # result: reset?


class FaultProxy:
    """Start with :meth:`start` (returns self), stop with :meth:`stop`; ``url`` is where clients connect."""

    def __init__(self, cp: ControlPlane, upstream: str | None = None) -> None:
        self.cp = cp
        self.upstream = upstream or cp.url
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self._serving = cp.pki.serving(f"faultproxy-{self.port}", ["127.0.0.1", "localhost"])
        self._lock = threading.Lock()
        self._faults: list[Fault] = []
        self._names: dict[str, str] = {}
        self.log: list[Request] = []
        self.watch_errors: Counter[int] = Counter()  # ERROR events in watch streams, by code
        self._streams: set[_Stream] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None

    # --- set-up --------------------------------------------------------------------------------------------------

    def name_token(self, token: str, name: str) -> None:
        """Record requests with this bearer token as ``name`` (one name per operator replica)."""
        with self._lock:
            self._names[token] = name

    def kubeconfig(self, source: Path, dest: Path, name: str | None = None) -> Path:
        """A copy of ``source`` (a bearer-token kubeconfig) that talks to the proxy; ``name`` names its token."""
        doc = yaml.safe_load(source.read_text())
        for cluster in doc["clusters"]:
            cluster["cluster"]["server"] = self.url
        if name is not None:
            for user in doc["users"]:
                token = user["user"].get("token")
                if not token:
                    raise ValueError(f"{source}: the proxy passes bearer tokens only, {user['name']} has none")
                self.name_token(token, name)
        return write_yaml(dest, doc)

    def start(self, timeout: float = 10.0) -> FaultProxy:
        ready = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._serve())
            except BaseException as exc:  # reported to start()
                errors.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._shutdown())
            loop.close()

        self._thread = threading.Thread(target=run, name="faultproxy", daemon=True)
        self._thread.start()
        if not ready.wait(timeout) or errors:
            raise RuntimeError(f"fault proxy did not start: {errors[0] if errors else 'timeout'}")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)
        self._loop = self._thread = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- faults ------------------------------------------------------------------------------------------------

    def inject(
        self,
        status: int,
        *,
        times: int = 1,
        methods: Iterable[str] = ("*",),
        path: str = r"^/api",
        message: str = "",
        retry_after: int | None = None,
        delay: float = 0.0,
    ) -> Fault:
        """The next ``times`` requests matching ``methods`` and the ``path`` regex answer ``status`` (0: pass
        through, ``delay`` seconds late). A 429 carries ``Retry-After: retry_after`` (1 unless given)."""
        if status == 429 and retry_after is None:
            retry_after = 1
        fault = Fault(
            status, times, frozenset(m.upper() for m in methods), re.compile(path), message, retry_after, delay
        )
        with self._lock:
            self._faults.append(fault)
        return fault

    def lift_faults(self) -> None:
        with self._lock:
            for f in self._faults:
                f.remaining = 0
            self._faults.clear()

    def cut_watches(self, reset: bool = False) -> int:
        """End every open watch stream: its last chunk (clean), or a TCP reset (``reset``). How many."""
        if self._loop is None:
            return 0
        return asyncio.run_coroutine_threadsafe(self._cut(reset), self._loop).result(10)

    async def _cut(self, reset: bool) -> int:
        streams = list(self._streams)
        for s in streams:
            if not s.cut.done():
                s.cut.set_result(reset)
        return len(streams)

    def _take(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.matches(method, path):
                    fault.remaining -= 1
                    return fault
            self._faults = [f for f in self._faults if f.remaining > 0]
        return None

    # --- what happened -----------------------------------------------------------------------------------------

    def requests(self, since: int = 0) -> list[Request]:
        with self._lock:
            return list(self.log[since:])

    def mark(self) -> int:
        with self._lock:
            return len(self.log)

    def writes_by(self, since: int = 0) -> Counter[str]:
        """Successful writes per identity since ``mark()`` was ``since``."""
        return Counter(r.who for r in self.requests(since) if r.write and r.ok)

    def _record(
        self, request: web.Request, who: str, status: int | None, injected: bool, at: float, body: bytes | None = None
    ) -> None:
        entry = Request(
            at,
            who,
            request.headers.get("User-Agent", ""),
            request.method,
            request.path,
            request.query_string,
            status,
            injected,
            (body or b"")[:8000].decode(errors="replace") if request.method in WRITE_METHODS else "",
        )
        with self._lock:
            self.log.append(entry)

    def _who(self, request: web.Request) -> str:
        auth = request.headers.get("Authorization", "")
        token = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        with self._lock:
            named = self._names.get(token)
        return named or (token_subject(token) if token else None) or "anonymous"

    # --- serving -----------------------------------------------------------------------------------------------

    async def _serve(self) -> None:
        upstream_ctx = ssl.create_default_context(cafile=str(self.cp.pki.ca.cert))
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=upstream_ctx, limit=0),
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
        )
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1)
        await self._runner.setup()
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(str(self._serving.cert), str(self._serving.key))
        await web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=ctx).start()

    async def _shutdown(self) -> None:
        await self._cut(True)
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        at, who = time.monotonic(), self._who(request)
        fault = self._take(request.method, request.path)
        if fault is not None and fault.delay:
            await asyncio.sleep(fault.delay)
        if fault is not None and fault.status:
            self._record(request, who, fault.status, True, at)
            return self._error(fault, request)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP and k.lower() != "content-length"}
        body = await request.read() if request.can_read_body else None
        assert self._session is not None
        url = self.upstream + request.rel_url.raw_path_qs
        try:
            upstream = await self._session.request(
                request.method, url, headers=headers, data=body, allow_redirects=False
            )
        except (aiohttp.ClientError, OSError) as exc:
            # kube-apiserver is down (a restart): what a load balancer in front of it answers
            self._record(request, who, 503, False, at)
            return web.json_response(
                status_body(503, f"upstream unavailable: {type(exc).__name__}", request.method, request.path),
                status=503,
            )
        out_headers = {
            k: v for k, v in upstream.headers.items() if k.lower() not in _DROP and k.lower() != "content-length"
        }
        if not is_watch(request.path, request.query_string) or upstream.status != 200:
            async with upstream:
                payload = await upstream.read()
            self._record(request, who, upstream.status, False, at, body)
            return web.Response(status=upstream.status, body=payload, headers=out_headers)
        return await self._stream(request, upstream, out_headers, who, at)

    def _error(self, fault: Fault, request: web.Request) -> web.Response:
        headers = {"Retry-After": str(fault.retry_after)} if fault.retry_after is not None else {}
        if fault.status == 429:  # as the priority-and-fairness filter writes it: text, not a Status
            return web.Response(
                status=429,
                text=APF_429_BODY,
                headers={**headers, "X-Content-Type-Options": "nosniff"},
                content_type="text/plain",
            )
        body = status_body(fault.status, fault.message, request.method, request.path, fault.retry_after)
        return web.json_response(body, status=fault.status, headers=headers)

    async def _stream(
        self, request: web.Request, upstream: aiohttp.ClientResponse, headers: dict[str, str], who: str, at: float
    ) -> web.StreamResponse:
        response = web.StreamResponse(status=upstream.status, headers=headers)
        await response.prepare(request)
        stream = _Stream(request, response)
        self._streams.add(stream)
        self._record(request, who, upstream.status, False, at)
        pending = b""
        reset = False
        try:
            while True:
                read = asyncio.ensure_future(upstream.content.readany())
                waiters: set[asyncio.Future[Any]] = {read, stream.cut}
                done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                if stream.cut in done:
                    read.cancel()
                    reset = stream.cut.result()
                    break
                chunk = read.result()
                if not chunk:
                    break
                pending = self._scan(pending + chunk)
                await response.write(chunk)
        except (aiohttp.ClientError, ConnectionError):
            reset = True  # upstream went away (a restart) or the client did: drop the connection
        except asyncio.CancelledError:
            _abort(request)
            raise
        finally:
            self._streams.discard(stream)
            upstream.close()
        if reset:
            _abort(request)
        else:
            with contextlib.suppress(ConnectionError, RuntimeError):
                await response.write_eof()
        return response

    def _scan(self, data: bytes) -> bytes:
        """Count ERROR events in complete lines; return the incomplete tail."""
        *lines, tail = data.split(b"\n")
        for line in lines:
            if b'"ERROR"' not in line:
                continue
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if event.get("type") == "ERROR":
                    code = int((event.get("object") or {}).get("code") or 0)
                    with self._lock:
                        self.watch_errors[code] += 1
        return tail[-65536:]


def _abort(request: web.Request) -> None:
    """Close the client's connection with a TCP RST (SO_LINGER 0), as a crashed server or a middlebox does."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()
