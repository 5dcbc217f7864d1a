"""llama-server's route table, one module per concern; each adds its handlers to the app's router.
Handlers reach the server through ``request.app.state.server`` (``state.ServerState``)."""
