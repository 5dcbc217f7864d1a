"""The HTTP API: the FastAPI app and its gate (auth, CORS, limits), request validation into a
plan, the completion pipeline and its response formats, SSE framing. Depends on the runtime."""
