"""One package per API the server speaks, each holding what is that API's own: its request
translation, its response format, its routes. Each exposes ``add_routes(router, config)``, and the
app adds them in the order of ``app.APIS``; adding an API is adding a package here and naming it
there. An API package imports only the shared modules of ``server.http`` (the pipeline, the plan,
the formats' shared pieces, the chat output...), never another API package (the ``http-pipeline``
and ``http-apis`` import contracts). Handlers reach the server through
``request.app.state.server`` (``state.ServerState``)."""
