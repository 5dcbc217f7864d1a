"""A small MCP server over stdio (newline-delimited JSON-RPC) for the tools tests, run as
``python mcp_stdio_server.py``. Tools: ``echo`` (``{"text"}`` -> "echo: <text>", sending a
progress notification first), ``sleep`` (``{"seconds"}``), ``fail`` (a tool error) and ``exit``
(the process ends while answering nothing, so the next call must respawn it). Each process counts
its own calls, so a respawn is visible (``echo`` answers "... (call N)")."""

from __future__ import annotations

import json
import os
import sys
import time

TOOLS = [
    {"name": "echo", "description": "Echo the text back", "inputSchema": {
        "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}},
    {"name": "sleep", "description": "Sleep, then answer", "inputSchema": {
        "type": "object", "properties": {"seconds": {"type": "number"}}}},
    {"name": "fail", "description": "Always a tool error", "inputSchema": {"type": "object", "properties": {}}},
    {"name": "exit", "description": "End the server process", "inputSchema": {"type": "object", "properties": {}}},
]


def send(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main() -> None:
    calls = 0
    for line in sys.stdin:
        try:
            request = json.loads(line)
        except ValueError:
            continue
        rid, method, params = request.get("id"), request.get("method"), request.get("params") or {}
        if rid is None:
            continue  # a notification
        if method == "initialize":
            send({"jsonrpc": "2.0", "id": rid, "result": {"protocolVersion": "2024-11-05", "capabilities": {"tools": {}},
                                                          "serverInfo": {"name": "test", "version": "1"}}})
        elif method == "tools/list":
            send({"jsonrpc": "2.0", "id": rid, "result": {"tools": TOOLS}})
        elif method == "tools/call":
            calls += 1
            name, args = params.get("name"), params.get("arguments") or {}
            if name == "echo":
                send({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "hi"}})
                text = f"echo: {args.get('text', '')} (call {calls}, pid {os.getpid()})"
                send({"jsonrpc": "2.0", "id": rid, "result": {"content": [{"type": "text", "text": text}]}})
            elif name == "sleep":
                time.sleep(float(args.get("seconds", 1)))
                send({"jsonrpc": "2.0", "id": rid, "result": {"content": [{"type": "text", "text": "slept"}]}})
            elif name == "fail":
                send({"jsonrpc": "2.0", "id": rid, "result": {"content": [{"type": "text", "text": "it broke"}],
                                                              "isError": True}})
            elif name == "exit":
                os._exit(3)
            else:
                send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32602, "message": f"unknown tool {name}"}})
        else:
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "method not found"}})


if __name__ == "__main__":
    main()
