"""Running the server once the command line is valid: the speculative setup checked before anything
loads, logging, BLAS threads, the app, and uvicorn with a clean SIGTERM shutdown."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

import uvicorn
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from mlxcel.engine.distributed.world import DistributedError, world
from mlxcel.engine.platform.device import set_cpu_threads
from mlxcel.engine.platform.settings import set_switches
from mlxcel.server.cli import follower
from mlxcel.server.cli.connection_guard import guarded_protocol, header_deadline, max_per_ip
from mlxcel.server.cli.flag_table import EXTENSIONS, FLAGS
from mlxcel.server.cli.listen import bind, hosts
from mlxcel.server.http.app import create_app
from mlxcel.server.http.disconnects import QuietDisconnects
from mlxcel.server.router import options
from mlxcel.server.router.app import RouterSetupError, create_router_app
from mlxcel.server.runtime.config import ArgumentError, ServerConfig
from mlxcel.server.runtime.distributed_setup import refusals
from mlxcel.server.tools.registry import ToolsSetupError

log = logging.getLogger("mlxcel.server")


def _setup_logging(config: ServerConfig) -> None:
    if config.log_disable:
        logging.basicConfig(level=logging.CRITICAL + 1)
        return
    level = logging.DEBUG if config.verbose or config.verbosity >= 5 else (
        logging.INFO if config.verbosity >= 3 else logging.WARNING if config.verbosity == 2 else logging.ERROR)
    kwargs = {"filename": config.log_file} if config.log_file else {"stream": sys.stderr}
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", **kwargs)


GRACEFUL_SHUTDOWN_S = 30  # at most this long for open connections to finish after SIGTERM


def _server_class():
    class Server(uvicorn.Server):
        """uvicorn's server, which also tells the scheduler to end in-flight requests when a
        signal stops it: uvicorn stops accepting, the scheduler sends every running request an
        error event (or error body), the connections close, and the process exits 0."""

        on_exit = None

        def handle_exit(self, sig, frame) -> None:
            super().handle_exit(sig, frame)
            if self.on_exit is not None:
                self.on_exit()

    return Server


def _connection_limits(config: ServerConfig) -> dict:
    """uvicorn's protocol with the header deadline and the per-address connection limit
    (``connection_guard.py``). No WebSocket upgrades: no route takes one, and an upgraded
    connection would leave the guard's count."""
    per_ip = max_per_ip()
    if config.router:  # the children are reached only by this router, over loopback: no limit there
        set_switches(max_connections_per_ip=0)  # they inherit it
    return {"http": guarded_protocol(AutoHTTPProtocol, header_deadline(float(config.timeout)), per_ip),
            "ws": "none"}


def _router_app(config: ServerConfig):
    """No model, models to route to: upstream's router mode."""
    options.register([*FLAGS, *EXTENSIONS])  # how presets and the command line name flags
    return create_router_app(config)


def _begin_shutdown(app) -> None:
    """On the stopping signal: the scheduler ends in-flight requests, tool calls are cancelled and
    MCP servers told to stop, while uvicorn drains the connections."""
    server = getattr(app.state, "server", None)  # the single-model app's (the router has none)
    if server is not None and server.scheduler is not None:
        server.scheduler.begin_shutdown()
    models = getattr(app.state, "models", None)  # the router's: its event streams end now
    if models is not None:
        models.stopping = True
    if app.state.tools is not None:
        try:
            asyncio.get_running_loop().call_soon_threadsafe(app.state.tools.begin_shutdown)
        except RuntimeError:  # no loop running (not started yet)
            pass


def run(config: ServerConfig) -> int:
    """Serve until a signal (or a model that fails to load) stops the server; the exit status."""
    _setup_logging(config)
    for note in config.notes:
        log.info("%s", note)
    if config.hf_token:
        os.environ["HF_TOKEN"] = config.hf_token
    if config.offline:
        os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        config.api_keys()
    except ArgumentError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    if config.threads and config.threads > 0:
        if not set_cpu_threads(config.threads):
            log.info("-t %d: neither OpenBLAS nor the CPU kernels are loaded in this process; nothing to set",
                     config.threads)

    group = _distributed_group(config)
    if isinstance(group, int):
        return group
    if group is not None and group.rank() != 0:
        return _run_follower(config, group)

    _Server = _server_class()
    try:
        app = _router_app(config) if config.router else create_app(config)
    except (ToolsSetupError, RouterSetupError) as exc:  # tool flags, MCP config, model sources
        print(f"error: {exc}", file=sys.stderr)
        return 1
    failed: list[BaseException] = []
    server_ref: list[uvicorn.Server] = []

    def on_load_error(exc: BaseException) -> None:  # a model that cannot load ends the server
        failed.append(exc)
        if server_ref:
            server_ref[0].should_exit = True

    app.state.on_load_error = on_load_error  # the router's children report their own
    # keep-alive as upstream's (5 s); --timeout bounds each request instead (see Scheduler)
    uv_kwargs = {"log_level": "warning" if not config.verbose else "info", "timeout_keep_alive": 5,
                 "timeout_graceful_shutdown": GRACEFUL_SHUTDOWN_S, **_connection_limits(config)}
    addresses = hosts(config.host)
    sockets = None
    if len(addresses) > 1:  # several addresses: bound here, then served by one uvicorn server
        try:
            sockets = bind(config.host, config.port)
        except OSError as exc:
            print(f"error: {exc.strerror or exc}", file=sys.stderr)
            return 1
    elif addresses[0].endswith(".sock"):
        uv_kwargs["uds"] = addresses[0]
    else:
        uv_kwargs.update(host=addresses[0], port=config.port)
    if config.ssl_key_file or config.ssl_cert_file:
        uv_kwargs.update(ssl_keyfile=config.ssl_key_file, ssl_certfile=config.ssl_cert_file)
    server = _Server(uvicorn.Config(QuietDisconnects(app), **uv_kwargs))
    server.on_exit = lambda: _begin_shutdown(app)
    server_ref.append(server)
    log.info("listening on %s port %s", ", ".join(hosts(config.host)), config.port)
    # uvicorn re-raises the signal that stopped it once it is done, under the handler that was in
    # place before it ran: with this one a SIGTERM shutdown ends with exit status 0.
    signal.signal(signal.SIGTERM, lambda *_: None)
    server.run(sockets=sockets)
    if failed:
        print(f"error: {failed[0]}", file=sys.stderr)
    _exit_now(1 if failed else 0)
    return 1 if failed else 0  # not reached


def _distributed_group(config: ServerConfig):
    """The mlx.launch group (None in a single process), or the exit status of a refusal."""
    try:
        group = world()
    except DistributedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if group is None:
        return None
    reason = refusals(config)
    if reason is not None:
        print(f"error: {reason}", file=sys.stderr)
        return 2
    log.info("distributed: rank %d of %d, pid %d", group.rank(), group.size(), os.getpid())
    return group


def _run_follower(config: ServerConfig, group) -> int:
    try:
        code = follower.run(config, group)
    except Exception as exc:  # a load failure or a failed agreement: every rank says why
        print(f"error: rank {group.rank()}: {exc}", file=sys.stderr)
        code = 1
    _exit_now(code)
    return code  # not reached


def _exit_now(code: int) -> None:
    """End the process once the server has shut down, skipping the interpreter's teardown: MLX
    used from threads other than the main one (the engine and loading threads) can abort at
    teardown ("terminate called without an active exception", ml-explore/mlx#3126), which would
    turn a clean SIGTERM into exit status -6. Everything that matters is flushed first."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
