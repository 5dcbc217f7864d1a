"""The tools a server offers on ``/tools``, built from the command line as upstream builds them:
``--tools`` (a comma-separated list of built-in tool names, or ``all``; an unknown name stops the
server), then the tools of the MCP servers, each named ``<server>_<tool>`` (one whose name is
taken already is skipped), and ``--tools-runtime``.

A call's parameters are the client's, with three of them only ever coming from headers, never
from the body (a model cannot choose them): ``cwd`` (``x-tool-cwd``), ``runtime``
(``x-tool-runtime``, else ``--tools-runtime``) and ``resp_type`` (``x-resp-type``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from mlxcel.server.tools.builtin import BUILTIN, Tool
from mlxcel.server.tools.io import ToolRuntimeError
from mlxcel.server.tools.mcp import McpConfigError, McpManager, McpToolDef, load_configs
from mlxcel.server.tools.runtime import make_runtime

log = logging.getLogger(__name__)


class ToolsSetupError(Exception):
    """The tool flags cannot be honoured (the server does not start)."""


class UnknownTool(Exception):
    """No such tool, or it cannot stream (upstream's 404)."""


class McpTool(Tool):
    """One tool of an MCP server (its call is async: ``McpManager.call_tool``)."""

    kind = "mcp"
    uses_cwd = False

    def __init__(self, tool: McpToolDef, manager: McpManager):
        self.tool, self.manager = tool, manager
        self.name = self.display_name = f"{tool.server_name}_{tool.name}"

    def definition(self) -> dict:
        schema = self.tool.input_schema if isinstance(self.tool.input_schema, dict) else {}
        return {"type": "function", "function": {"name": self.name, "description": self.tool.description,
                                                 "parameters": schema}}

    async def ainvoke(self, params: dict) -> dict:
        return await self.manager.call_tool(self.tool.server_name, self.tool.name, params)


def check_flags(config) -> None:
    """Refuse, before anything heavy loads, what ``ServerTools.from_config`` would refuse: an
    unknown tool name, an MCP config that cannot be read or parsed."""
    known = [cls.name for cls in BUILTIN]
    for name in (t.strip() for t in (config.tools or "").split(",")):
        if name and name != "all" and name not in known:
            raise ToolsSetupError(f'unknown tool "{name}". available tools: {", ".join(known)}')
    try:
        load_configs(config.mcp_servers_config, config.mcp_servers_json)
    except McpConfigError as exc:
        raise ToolsSetupError(f"MCP starting failed: {exc}") from None


class ServerTools:
    def __init__(self, enabled: list[str], mcp: McpManager, runtime_spec: str = ""):
        self.mcp = mcp
        self.builtin: list[Tool] = []
        self.tools: list[Tool] = []
        self.runtime = None
        if enabled:
            known = [cls.name for cls in BUILTIN]
            for name in enabled:
                if name != "all" and name not in known:
                    raise ToolsSetupError(f'unknown tool "{name}". available tools: {", ".join(known)}')
            self.builtin = [cls() for cls in BUILTIN if "all" in enabled or cls.name in enabled]
        if runtime_spec:
            try:
                self.runtime = make_runtime(runtime_spec)
            except ToolRuntimeError as exc:
                raise ToolsSetupError(str(exc)) from None
        self.tools = list(self.builtin)

    @classmethod
    def from_config(cls, config) -> ServerTools | None:
        """The tools ``config`` enables, or None when ``/tools`` stays disabled (403)."""
        try:
            mcp = McpManager(load_configs(config.mcp_servers_config, config.mcp_servers_json))
        except McpConfigError as exc:
            raise ToolsSetupError(f"MCP starting failed: {exc}") from None
        enabled = [t.strip() for t in (config.tools or "").split(",") if t.strip()]
        if not enabled and not mcp:
            return None
        return cls(enabled, mcp, config.tools_runtime or "")

    async def start(self) -> None:
        """Discover the MCP servers' tools (startup, before the server listens)."""
        if not self.mcp:
            return
        await self.mcp.warmup()
        seen = {t.name for t in self.tools}
        added = 0
        for tool in self.mcp.registry:
            mcp_tool = McpTool(tool, self.mcp)
            if mcp_tool.name in seen:
                log.warning('MCP tool "%s" from server "%s" collides with an existing tool, skipping', mcp_tool.name,
                            tool.server_name)
                continue
            seen.add(mcp_tool.name)
            self.tools.append(mcp_tool)
            added += 1
        if added:
            log.info("Added %d MCP tools", added)

    def begin_shutdown(self) -> None:
        if self.mcp:
            self.mcp.begin_shutdown()

    async def stop(self) -> None:
        if self.mcp:
            await self.mcp.shutdown()
        if self.runtime is not None:
            self.runtime.close()

    def listing(self) -> list[dict]:
        return [t.to_json() for t in self.tools]

    def find(self, name: str, stream: bool) -> Tool:
        for tool in self.tools:
            if tool.name == name:
                if stream and not tool.support_stream:
                    raise UnknownTool(f'tool "{name}" does not support stream = true')
                return tool
        raise UnknownTool(f'unknown tool "{name}"')

    def call_params(self, params: dict, headers: Mapping[str, str]) -> dict:
        """The parameters a call runs with: the header-only ones replaced from the headers."""
        params = {k: v for k, v in params.items() if k not in ("cwd", "runtime", "resp_type")}
        if headers.get("x-tool-cwd"):
            params["cwd"] = headers["x-tool-cwd"]
        if headers.get("x-tool-runtime"):
            params["runtime"] = headers["x-tool-runtime"]
        elif self.runtime is not None:
            params["runtime"] = self.runtime.spec()
        if headers.get("x-resp-type"):
            params["resp_type"] = headers["x-resp-type"]
        return params

