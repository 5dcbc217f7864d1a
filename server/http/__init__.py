"""The HTTP API: the FastAPI app, one package per API it speaks (``api/``), the gate every request
passes (``gate/``), request validation into a plan, the one completion pipeline and what the
response formats share, chat templates and output (``chat/``), SSE framing. Depends on the runtime."""
