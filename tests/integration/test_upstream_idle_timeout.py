"""The idle timeout of an upstream body fires close to its configured value, not at up to twice it."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from gateway.proxy.upstream import iter_body

IDLE = 1.0


async def _serve_then_stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
    await writer.drain()
    # Bytes just after the watchdog started: a watchdog that checks once per idle period
    # notices them only then, and cuts the silence that follows at about twice IDLE.
    await asyncio.sleep(0.05)
    writer.write(b"6\r\nsecond\r\n")
    await writer.drain()
    await asyncio.sleep(2 * IDLE)
    writer.close()


async def test_a_stall_is_cut_within_a_small_fraction_over_the_idle_timeout() -> None:
    server = await asyncio.start_server(_serve_then_stall, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, aiohttp.ClientSession() as session:
        response = await session.get(f"http://127.0.0.1:{port}/")
        chunks = []
        last_chunk_at = 0.0
        with pytest.raises(TimeoutError):
            async for chunk in iter_body(response, IDLE):
                chunks.append(chunk)
                last_chunk_at = time.monotonic()
        silence = time.monotonic() - last_chunk_at
    assert b"".join(chunks) == b"firstsecond"
    assert IDLE <= silence + 0.05 < 1.5 * IDLE
