"""Router mode (no model given): several models, each in a child mlxcel-server that this
layer starts, stops and proxies to; above ``http``, whose routes and gate pieces it reuses."""
