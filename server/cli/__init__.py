"""The command line: ``mlxcel`` / ``mlxcel-server`` entry points (``main``), ``mlxcel generate``,
``mlxcel serve`` and llama-server's flag table. Top layer: may import the HTTP layer below it."""
