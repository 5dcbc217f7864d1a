"""MCP servers (``--mcp-servers-config FILE`` / ``--mcp-servers-json JSON``, Cursor's
``{"mcpServers": {name: {command, args, env, cwd, timeout_ms}}}``): stdio servers whose tools are
served on ``/tools`` as ``<server>_<tool>``.

As upstream: at startup each server is spawned once, its tools listed (at most 10 s each) and
then shut down; a server that cannot start is logged and left out, a config that cannot be read or
parsed stops the server. A tool call (re)spawns its server when it is not running, a server that
fails to start is not tried again for 5 s, each call is bounded by the server's ``timeout_ms``
(default 30000), and the answer is upstream's: the text parts of the result joined by newlines as
``plain_text_response``, or ``{"error": ...}`` (a tool error, an RPC error, a timeout). A server
is spawned with this process's environment, ``env`` laid over it.

The protocol (framing, the handshake, request ids, notifications, and stopping a server and its
process group) is the maintained ``mcp`` SDK's; this module only owns each session's life: a
background task holds ``stdio_client`` and ``ClientSession`` open (anyio needs them entered and
left in one task) while request handlers call through it on the same event loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

COOLDOWN_S = 5.0
WARMUP_TIMEOUT_S = 10.0
DEFAULT_TIMEOUT_MS = 30000


class McpConfigError(Exception):
    """The MCP configuration cannot be read or parsed (the server does not start)."""


@dataclass
class McpServerConfig:
    name: str
    command: str
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = ""
    timeout_ms: int = DEFAULT_TIMEOUT_MS


@dataclass
class McpToolDef:
    server_name: str
    name: str
    description: str
    input_schema: Any


def parse_config(text: str) -> list[McpServerConfig]:
    """Cursor's format; no ``mcpServers`` object is no servers, an entry without a command is skipped."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise McpConfigError(f"failed to parse MCP config JSON: {exc}") from None
    servers = data.get("mcpServers") if isinstance(data, dict) else None
    if not isinstance(servers, dict):
        return []
    out = []
    for name, cfg in servers.items():
        if not isinstance(cfg, dict):
            raise McpConfigError(f"failed to parse MCP config JSON: server '{name}' must be an object")
        command = cfg.get("command")
        if not isinstance(command, str) or not command:
            log.warning("MCP server '%s' has no command, skipping", name)
            continue
        args, env = cfg.get("args") or [], cfg.get("env") or {}
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise McpConfigError(f"failed to parse MCP config JSON: 'args' of server '{name}' must be strings")
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            raise McpConfigError(f"failed to parse MCP config JSON: 'env' of server '{name}' must map to strings")
        timeout_ms = cfg.get("timeout_ms", DEFAULT_TIMEOUT_MS)
        if not isinstance(timeout_ms, int) or isinstance(timeout_ms, bool) or timeout_ms <= 0:
            timeout_ms = DEFAULT_TIMEOUT_MS
        cwd = cfg.get("cwd") if isinstance(cfg.get("cwd"), str) else ""
        out.append(McpServerConfig(name, command, list(args), dict(env), cwd, timeout_ms))
    return out


def load_configs(config_path: str | None, config_json: str | None) -> list[McpServerConfig]:
    """Both sources, the file first; a name seen twice keeps its first definition."""
    texts = []
    if config_path:
        try:
            with open(config_path, encoding="utf-8") as f:
                texts.append(f.read())
        except OSError:
            raise McpConfigError(f"failed to open MCP config file: {config_path}") from None
    if config_json:
        texts.append(config_json)
    configs: list[McpServerConfig] = []
    for text in texts:
        parsed = parse_config(text)
        if not parsed:
            log.warning("MCP config: no servers found in JSON")
        for cfg in parsed:
            if any(c.name == cfg.name for c in configs):
                log.warning("MCP config: duplicate server name '%s', skipping", cfg.name)
                continue
            configs.append(cfg)
    return configs


class McpSession:
    """One running MCP server and its initialized session."""

    def __init__(self, config: McpServerConfig):
        self.config = config
        self.session = None
        self.error = ""
        self.dead = False
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def start(self, timeout_s: float) -> bool:
        self._task = asyncio.create_task(self._run(timeout_s), name=f"mcp-{self.config.name}")
        await self._ready.wait()
        return self.session is not None

    async def _run(self, timeout_s: float) -> None:
        import anyio  # noqa: PLC0415 -- the SDK's concurrency library, loaded with it
        from mcp import ClientSession, StdioServerParameters  # noqa: PLC0415 -- the SDK loads only with MCP servers
        from mcp.client.stdio import stdio_client  # noqa: PLC0415
        from mcp_types import Implementation  # noqa: PLC0415

        cfg = self.config
        params = StdioServerParameters(command=cfg.command, args=cfg.args, env={**os.environ, **cfg.env},
                                       cwd=cfg.cwd or None)

        async def pump(read, forward) -> None:
            """The server's messages on to the session; their end is the server's (EOF), which makes
            this session dead at once, so the next call respawns the server (as upstream's reader)."""
            try:
                async with forward:
                    async for message in read:
                        await forward.send(message)
            finally:
                self.dead = True
                self._stop.set()

        try:
            async with stdio_client(params) as (read, write), anyio.create_task_group() as group:
                forward, messages = anyio.create_memory_object_stream(0)
                group.start_soon(pump, read, forward)
                async with ClientSession(messages, write, client_info=Implementation(name="mlxcel", version="1.0")) as s:
                    await asyncio.wait_for(s.initialize(), timeout_s)
                    self.session = s
                    self._ready.set()
                    await self._stop.wait()
                group.cancel_scope.cancel()
        except Exception as exc:  # a command that does not exist, a server that dies or never answers
            while isinstance(exc, BaseExceptionGroup) and exc.exceptions:  # anyio's task groups wrap it
                exc = exc.exceptions[0]
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.session = None
            self.dead = True
            self._ready.set()

    @property
    def alive(self) -> bool:
        return self.session is not None and not self.dead

    async def list_tools(self, timeout_s: float) -> list[McpToolDef]:
        result = await asyncio.wait_for(self.session.list_tools(), timeout_s)
        return [McpToolDef(self.config.name, t.name, t.description or "", t.input_schema) for t in result.tools]

    async def call(self, tool: str, arguments: dict) -> dict:
        try:
            result = await self.session.call_tool(tool, arguments, read_timeout_seconds=self.config.timeout_ms / 1e3)
        except Exception as exc:  # the SDK's MCPError: an RPC error, a timeout, a closed connection
            message = str(exc) or type(exc).__name__
            if "timed out" in message:
                return {"error": "request timed out"}
            if "closed" in message.lower():
                self.dead = True  # the next call respawns it
                return {"error": "transport closed"}
            return {"error": message}
        return _to_response(result)

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None:
            try:
                await self._task
            except BaseException:  # noqa: BLE001 -- teardown of a server that already failed
                pass


def _to_response(result) -> dict:
    """Upstream's ``/tools`` answer for a ``tools/call`` result."""
    texts = [part.text for part in (getattr(result, "content", None) or []) if getattr(part, "type", "") == "text"]
    text = "\n".join(texts)
    if getattr(result, "is_error", False):
        return {"error": text or "MCP tool returned an error"}
    return {"plain_text_response": text}


class McpManager:
    def __init__(self, configs: list[McpServerConfig]):
        self.configs = {c.name: c for c in configs}
        self.registry: list[McpToolDef] = []
        self._sessions: dict[str, McpSession] = {}
        self._dead_until: dict[str, float] = {}
        self._lock: asyncio.Lock | None = None
        self._calls: set[asyncio.Task] = set()
        self.stopping = False

    def __bool__(self) -> bool:
        return bool(self.configs)

    async def warmup(self) -> None:
        """Spawn each server, list its tools, shut it down (in order, as upstream)."""
        discovered: list[McpToolDef] = []
        for cfg in self.configs.values():
            session = McpSession(cfg)
            if not await session.start(WARMUP_TIMEOUT_S):
                log.warning("MCP warmup: failed to spawn '%s': %s", cfg.name, session.error)
                await session.close()
                continue
            try:
                tools = await session.list_tools(WARMUP_TIMEOUT_S)
            except Exception as exc:
                log.warning("MCP warmup: '%s' did not list its tools: %s", cfg.name, exc)
                tools = []
            log.info("MCP warmup: '%s' discovered %d tools", cfg.name, len(tools))
            discovered += tools
            await session.close()
        self.registry = discovered

    async def _get_or_create(self, name: str) -> McpSession | None:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self.stopping:
                return None
            if time.monotonic() < self._dead_until.get(name, 0.0):
                return None
            session = self._sessions.get(name)
            if session is not None and session.alive:
                return session
            if session is not None:
                log.warning("MCP '%s' is no longer alive: %s", name, session.error)
                self._sessions.pop(name)
                asyncio.create_task(session.close())
            cfg = self.configs.get(name)
            if cfg is None:
                return None
            fresh = McpSession(cfg)
            if await fresh.start(WARMUP_TIMEOUT_S):  # the handshake; each call then has timeout_ms
                self._sessions[name] = fresh
                return fresh
            log.warning("MCP '%s': failed to start: %s", name, fresh.error)
            await fresh.close()
            self._dead_until[name] = time.monotonic() + COOLDOWN_S
            return None

    async def call_tool(self, server: str, tool: str, arguments: dict) -> dict:
        session = await self._get_or_create(server)
        if session is None:
            return {"error": f"MCP server unavailable: {server}"}
        task = asyncio.create_task(session.call(tool, arguments))
        self._calls.add(task)
        try:
            return await task
        except asyncio.CancelledError:
            if self.stopping:  # the server is shutting down: the call ends now
                return {"error": "cancelled"}
            raise
        finally:
            self._calls.discard(task)

    def begin_shutdown(self) -> None:
        """Called as a shutdown starts (on the event loop): no new calls, in-flight ones end at once
        with ``cancelled``, and every server is told to stop (the SDK closes its stdin, then
        terminates its process group), while open connections drain."""
        self.stopping = True
        for task in list(self._calls):
            task.cancel()
        for session in list(self._sessions.values()):
            asyncio.get_running_loop().create_task(session.close())

    async def shutdown(self) -> None:
        if not self.stopping:
            self.begin_shutdown()
        await asyncio.gather(*(s.close() for s in self._sessions.values()), return_exceptions=True)
        self._sessions.clear()
