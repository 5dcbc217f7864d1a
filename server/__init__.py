"""The llama-server-compatible HTTP server, its scheduler (the one thread that runs MLX), and the
`mlxcel` command line."""
