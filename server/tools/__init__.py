"""The web UI's backend tools, behind upstream's flags and off unless they are given: the built-in
tools (``--tools``: read, search, write and edit files, run shell commands), optionally routed
through an isolate (``--tools-runtime`` / ``x-tool-runtime``: a container or an ssh host), and the
tools of MCP servers (``--mcp-servers-config`` / ``--mcp-servers-json``). ``server.http`` serves
them on ``GET`` / ``POST /tools``; nothing here knows about HTTP or the model."""
