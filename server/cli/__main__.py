"""``python -m mlxcel.server.cli ARGS``: the same as ``mlxcel-server ARGS``."""

import sys

from mlxcel.server.cli.main import server_main

sys.exit(server_main())
