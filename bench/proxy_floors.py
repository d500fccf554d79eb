"""Minimal passthrough proxies: the floors the gateway's overhead is measured against.

    python bench/proxy_floors.py --client httpx|aiohttp --port P --upstream http://127.0.0.1:U

Each forwards any request to the upstream with one shared client and relays
the answer as a stream, byte for byte, with hop-by-hop headers dropped both
ways. Nothing more: no parsing, counting, retries or timeouts. That is the
least a correct reverse proxy does, so whatever the gateway costs above it is
the price of its own features. `GET /healthz` answers 200 once the client is
open. Served like the gateway: uvicorn, uvloop, httptools, one worker.
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import aiohttp
import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

# RFC 9110 connection-specific headers, plus those the server or client recomputes.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
# As large as the gateway's default pool, so neither floor queues on connections.
MAX_CONNECTIONS = 1000


def end_to_end(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(name, value) for name, value in headers if name.lower() not in HOP_BY_HOP]


def raw(headers: Iterable[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in end_to_end(headers)]


def target(request: Request) -> str:
    query = request.url.query
    return request.url.path + (f"?{query}" if query else "")


def httpx_app(upstream: str) -> Starlette:
    client: httpx.AsyncClient | None = None

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        nonlocal client
        limits = httpx.Limits(max_connections=MAX_CONNECTIONS, max_keepalive_connections=MAX_CONNECTIONS)
        async with httpx.AsyncClient(base_url=upstream, timeout=None, limits=limits) as opened:
            client = opened
            yield

    async def proxy(request: Request) -> Response:
        assert client is not None
        outgoing = client.build_request(
            request.method,
            target(request),
            headers=end_to_end(request.headers.items()),
            content=await request.body(),
        )
        reply = await client.send(outgoing, stream=True)
        response = StreamingResponse(
            reply.aiter_raw(), status_code=reply.status_code, background=BackgroundTask(reply.aclose)
        )
        response.raw_headers = raw(reply.headers.multi_items())
        return response

    return _app(proxy, lifespan)


def aiohttp_app(upstream: str) -> Starlette:
    session: aiohttp.ClientSession | None = None

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        nonlocal session
        connector = aiohttp.TCPConnector(limit=MAX_CONNECTIONS, limit_per_host=0)
        # auto_decompress=False: relay compressed bytes as they come. The dummy jar:
        # a proxy must not replay one caller's cookies to the next.
        async with aiohttp.ClientSession(
            upstream,
            connector=connector,
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None),
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
        ) as opened:
            session = opened
            yield

    async def proxy(request: Request) -> Response:
        assert session is not None
        reply = await session.request(
            request.method,
            target(request),
            headers=end_to_end(request.headers.items()),
            data=await request.body(),
            allow_redirects=False,
        )

        async def body() -> AsyncIterator[bytes]:
            try:
                async for chunk in reply.content.iter_any():
                    yield chunk
            finally:
                reply.release()

        response = StreamingResponse(body(), status_code=reply.status)
        response.raw_headers = raw(
            (name.decode("latin-1"), value.decode("latin-1")) for name, value in reply.raw_headers
        )
        return response

    return _app(proxy, lifespan)


def _app(
    proxy: Callable[[Request], Awaitable[Response]],
    lifespan: Callable[[Starlette], AbstractAsyncContextManager[None]],
) -> Starlette:
    async def healthz(request: Request) -> Response:
        return Response(b"ok")

    return Starlette(
        routes=[
            Route("/healthz", healthz, methods=["GET"]),
            Route("/{path:path}", proxy, methods=ALL_METHODS),
        ],
        lifespan=lifespan,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--client", choices=("httpx", "aiohttp"), required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="upstream origin, e.g. http://127.0.0.1:9000")
    args = parser.parse_args()
    app = httpx_app(args.upstream) if args.client == "httpx" else aiohttp_app(args.upstream)
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=args.port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        access_log=False,
        log_level="warning",
    )


if __name__ == "__main__":
    main()
