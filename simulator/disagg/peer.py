"""The HTTP client a live server of a disaggregated deployment calls its peers with (SGLang's decode
server its prefill server's bootstrap port, vLLM's decode server a prefill server's NIXL side channel):
one session opened on first use, the calls in flight kept so that they are cancelled when it closes."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import aiohttp
import orjson


class PeerClient:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task] = set()

    def spawn(self, call: Coroutine[Any, Any, None]) -> None:
        """Run ``call`` beside the engine, cancelled at ``close`` if it has not ended."""
        task = self.loop.create_task(call)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def post(self, url: str, body: dict[str, Any]) -> Any:
        """``body`` POSTed to ``url``: its JSON answer. Raises aiohttp.ClientError, OSError or ValueError
        (a status other than 2xx, no connection, an answer that is not JSON)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        async with self._session.post(url, json=body) as resp:
            resp.raise_for_status()
            return await resp.json(loads=orjson.loads)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._session is not None:
            await self._session.close()
