"""Where the built-in tools read, write and run: the host (``LocalIO``), or an isolate that every
operation is a command inside (``ContainerIO``: ``docker|podman exec`` into a running container;
``SshIO``: a host reached over ssh), chosen per call by ``make_io`` from the call's ``cwd`` and
``runtime`` (the ``x-tool-cwd`` / ``x-tool-runtime`` headers, or ``--tools-runtime``), as upstream.

Subprocesses (``run_subprocess``) always get their stdin closed, are read as raw bytes (streamed to
a callback as they arrive, capped, drained past the cap so the child never blocks), and are killed
at their timeout. Unlike upstream, a child runs in its own process group and the whole group is
killed, so a background grandchild cannot keep a timed-out command's output open.
"""

from __future__ import annotations

import os
import posixpath
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

GIT_LS_FILES_MAX_OUTPUT = 8 * 1024 * 1024
LIST_ENTRIES_TIMEOUT_S = 15
ISOLATE_EXEC_TIMEOUT_S = 15
ISOLATE_READ_FILE_MAX_SIZE = 64 * 1024 * 1024
# listed, never walked into (they can be enormous)
JUNK_DIRS = (".git", ".svn", ".hg", "node_modules", "__pycache__", ".venv", "venv", "dist", "build", "target",
             ".cache", ".idea", ".vscode")


class ToolRuntimeError(Exception):
    """A call's runtime is unusable (unknown scheme, an id or target that would be an option):
    upstream answers 500 with the message; the call never falls back to the host."""


@dataclass
class ExecResult:
    output: str = ""  # decoded (invalid UTF-8 replaced), with the truncation note
    raw: bytes = b""  # the bytes as read
    exit_code: int = -1
    timed_out: bool = False


@dataclass
class ListResult:
    entries: list[tuple[str, bool]] = field(default_factory=list)  # ('/'-separated relative path, is_dir)
    err: str = ""
    truncated: bool = False


def run_subprocess(args: list[str], max_output: int, timeout_s: float,
                   on_chunk: Callable[[str], bool] | None = None, combine_stderr: bool = True,
                   cwd: str | None = None, stdin_data: bytes | None = None) -> ExecResult:
    res = ExecResult()
    try:
        proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT if combine_stderr else subprocess.DEVNULL,
                                cwd=cwd or None, start_new_session=True)
    except (OSError, ValueError):
        res.output = "failed to spawn process"
        return res
    done = threading.Event()
    timed_out = threading.Event()

    def kill_group() -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def watchdog() -> None:
        if not done.wait(timeout_s):
            timed_out.set()
            kill_group()

    threading.Thread(target=watchdog, daemon=True).start()
    try:
        if stdin_data:
            proc.stdin.write(stdin_data)
    except OSError:
        pass  # a short write is not an error by itself: the exit code decides
    try:
        proc.stdin.close()
    except OSError:
        pass
    out = bytearray()
    truncated = False
    fd = proc.stdout.fileno()
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        if truncated:
            continue
        if len(out) + len(chunk) <= max_output:
            out += chunk
            if on_chunk is not None and not on_chunk(chunk.decode("utf-8", errors="replace")):
                kill_group()
                break
        else:
            room = max_output - len(out)
            out += chunk[:room]
            if on_chunk is not None and room > 0:
                on_chunk(chunk[:room].decode("utf-8", errors="replace"))
            truncated = True
    proc.stdout.close()
    code = proc.wait()
    done.set()
    res.exit_code = code if code >= 0 else 1  # killed by a signal: a failure, as upstream reports it
    res.raw = bytes(out)
    res.output = out.decode("utf-8", errors="replace") + ("\n[output truncated]" if truncated else "")
    res.timed_out = timed_out.is_set()
    return res


def _expand_home(path: str) -> str:
    if not path.startswith("~") or (len(path) > 1 and path[1] not in "/\\"):
        return path
    home = os.environ.get("HOME", "")
    return home + path[1:] if home else path


def _depth(rel: str) -> int:
    return 1 + rel.count("/")


class ToolsIO:
    """The operations every tool is written against."""

    def resolve(self, path: str) -> str: ...
    def is_directory(self, path: str) -> bool: ...
    def is_regular_file(self, path: str) -> bool: ...
    def file_size(self, path: str) -> int | None: ...
    def read_file(self, path: str) -> bytes | None: ...
    def write_file(self, path: str, content: bytes) -> bool: ...
    def list_entries(self, base: str, max_depth: int, kind: str) -> ListResult: ...

    def run(self, args: list[str], max_output: int, timeout_s: float,
            on_chunk: Callable[[str], bool] | None = None) -> ExecResult: ...


class LocalIO(ToolsIO):
    """The host, relative paths against ``cwd`` (or the server's working directory)."""

    def __init__(self, cwd: str = ""):
        self.cwd = cwd

    def resolve(self, path: str) -> str:
        p = _expand_home(path)
        if not os.path.isabs(p):
            p = os.path.join(self.cwd or os.getcwd(), p)
        return os.path.normpath(p)

    def is_directory(self, path: str) -> bool:
        return os.path.isdir(self.resolve(path))

    def is_regular_file(self, path: str) -> bool:
        return os.path.isfile(self.resolve(path))

    def file_size(self, path: str) -> int | None:
        try:
            return os.path.getsize(self.resolve(path))
        except OSError:
            return None

    def read_file(self, path: str) -> bytes | None:
        try:
            with open(self.resolve(path), "rb") as f:
                return f.read()
        except OSError:
            return None

    def write_file(self, path: str, content: bytes) -> bool:
        full = self.resolve(path)
        try:
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "wb") as f:
                f.write(content)
        except OSError:
            return False
        return True

    def list_entries(self, base: str, max_depth: int, kind: str) -> ListResult:
        out = ListResult()
        if not os.path.isdir(base):
            out.err = "path does not exist or is not a directory"
            return out
        deadline = time.monotonic() + LIST_ENTRIES_TIMEOUT_S
        if kind == "files":  # git knows what is ignored; it cannot list directories
            res = self.run(["git", "-C", base, "ls-files", "--cached", "--others", "--exclude-standard"],
                           GIT_LS_FILES_MAX_OUTPUT, LIST_ENTRIES_TIMEOUT_S)
            if res.exit_code == 0 and not res.timed_out:
                for line in res.output.splitlines():
                    line = line.rstrip("\r").replace("\\", "/")
                    if not line or (max_depth > 0 and _depth(line) > max_depth):
                        continue
                    if os.path.isfile(os.path.join(base, line)):
                        out.entries.append((line, False))
                return out
        out.entries = self._walk(base, max_depth, kind, deadline, out)
        return out

    @staticmethod
    def _walk(base: str, max_depth: int, kind: str, deadline: float, out: ListResult) -> list[tuple[str, bool]]:
        result: list[tuple[str, bool]] = []
        stack = [(base, "", 0)]
        while stack:
            if time.monotonic() >= deadline:
                out.truncated = True
                return result
            directory, rel_dir, depth = stack.pop()
            try:
                with os.scandir(directory) as it:
                    entries = sorted(it, key=lambda e: e.name, reverse=True)
            except OSError:
                out.truncated = True
                continue
            for entry in entries:
                rel = posixpath.join(rel_dir, entry.name) if rel_dir else entry.name
                try:
                    is_dir = entry.is_dir()
                except OSError:
                    continue
                if is_dir:
                    if kind in ("dirs", "all"):
                        result.append((rel, True))
                    if entry.name in JUNK_DIRS:
                        continue
                    if not entry.is_symlink() and (max_depth == 0 or depth + 1 < max_depth):
                        stack.append((entry.path, rel, depth + 1))
                elif entry.is_file() and kind in ("files", "all"):
                    result.append((rel, False))
        return result

    def run(self, args, max_output, timeout_s, on_chunk=None) -> ExecResult:
        return run_subprocess(args, max_output, timeout_s, on_chunk, combine_stderr=True, cwd=self.cwd or None)


def shell_quote_join(argv: list[str]) -> str:
    """``argv`` as one string a POSIX shell parses back into exactly ``argv``."""
    return " ".join("'" + a.replace("'", "'\\''") + "'" for a in argv)


class IsolateIO(ToolsIO):
    """Every operation as a POSIX command inside the isolate (sh, cat, wc, mkdir, dirname, find,
    timeout); paths are POSIX paths there, relative ones against ``cwd``."""

    def __init__(self, cwd: str = ""):
        self.cwd = cwd

    def build_argv(self, inner: list[str], needs_stdin: bool) -> list[str]:
        raise NotImplementedError

    def resolve(self, path: str) -> str:
        if not self.cwd or path.startswith("/"):
            return path
        return self.cwd + "/" + path

    def _exec(self, inner: list[str], max_output: int, combine_stderr: bool = True) -> ExecResult:
        return run_subprocess(self.build_argv(inner, False), max_output, ISOLATE_EXEC_TIMEOUT_S, None, combine_stderr)

    def _test(self, flag: str, path: str) -> bool:
        res = self._exec(["sh", "-c", f'[ {flag} "$1" ]', "_", path], 4096)
        return res.exit_code == 0 and not res.timed_out

    def is_directory(self, path: str) -> bool:
        return self._test("-d", self.resolve(path))

    def is_regular_file(self, path: str) -> bool:
        return self._test("-f", self.resolve(path))

    def file_size(self, path: str) -> int | None:
        res = self._exec(["sh", "-c", 'wc -c < "$1"', "_", self.resolve(path)], 64)
        if res.exit_code != 0 or res.timed_out:
            return None
        try:
            return int(res.output.strip())
        except ValueError:
            return None

    def read_file(self, path: str) -> bytes | None:
        res = self._exec(["cat", "--", self.resolve(path)], ISOLATE_READ_FILE_MAX_SIZE, combine_stderr=False)
        if res.exit_code != 0 or res.timed_out:
            return None
        return res.raw

    def write_file(self, path: str, content: bytes) -> bool:
        argv = self.build_argv(["sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "_", self.resolve(path)], True)
        res = run_subprocess(argv, 4096, ISOLATE_EXEC_TIMEOUT_S, None, True, None, content)
        return res.exit_code == 0 and not res.timed_out

    def list_entries(self, base: str, max_depth: int, kind: str) -> ListResult:
        out = ListResult()
        abs_base = self.resolve(base)
        if not self.is_directory(base):
            out.err = "path does not exist or is not a directory"
            return out
        if kind == "files":
            res = self._exec(["sh", "-c", 'cd "$1" && git ls-files --cached --others --exclude-standard', "_", abs_base],
                             GIT_LS_FILES_MAX_OUTPUT)
            if res.exit_code == 0 and not res.timed_out:
                out.entries = [(rel, False) for rel in _lines(res.output, strip_dot_slash=False)
                               if not (max_depth > 0 and _depth(rel) > max_depth)]
                return out
        if kind in ("dirs", "all"):
            out.entries += [(rel, True) for rel in self._find(abs_base, max_depth, True, out)]
        if kind in ("files", "all"):
            out.entries += [(rel, False) for rel in self._find(abs_base, max_depth, False, out)]
        return out

    def _find(self, abs_base: str, max_depth: int, dirs: bool, out: ListResult) -> list[str]:
        prune = " -o ".join(f"-name {n}" for n in JUNK_DIRS)
        cmd = 'cd "$1" && find . -mindepth 1' + (f" -maxdepth {max_depth}" if max_depth > 0 else "")
        cmd += f" \\( {prune} \\) -prune" + (" -print -o -type d -print" if dirs else " -o -type f -print")
        res = self._exec(["sh", "-c", cmd, "_", abs_base], GIT_LS_FILES_MAX_OUTPUT)
        out.truncated = out.truncated or res.timed_out
        return _lines(res.output, strip_dot_slash=True)

    def run(self, args, max_output, timeout_s, on_chunk=None) -> ExecResult:
        # the isolate's own `timeout` ends the process tree inside it; the host-side kill comes later
        inner = ["timeout", f"{int(timeout_s)}s", *args]
        if self.cwd:
            inner = ["sh", "-c", 'cd "$1" || exit 127; shift; exec "$@"', "_", self.cwd, *inner]
        return run_subprocess(self.build_argv(inner, True), max_output, timeout_s + 5, on_chunk, True)


def _lines(text: str, strip_dot_slash: bool) -> list[str]:
    out = []
    for line in text.splitlines():
        line = line.rstrip("\r")
        if not line:
            continue
        if strip_dot_slash and line.startswith("./"):
            line = line[2:]
        out.append(line.replace("\\", "/"))
    return out


class ContainerIO(IsolateIO):
    """A running container, through ``<engine> exec``."""

    def __init__(self, engine: str, container_id: str, cwd: str = ""):
        super().__init__(cwd)
        self.engine, self.container_id = engine, container_id

    def build_argv(self, inner, needs_stdin):
        return [self.engine, "exec", *(["-i"] if needs_stdin else []), self.container_id, *inner]


SSH_OPTIONS = ["-o", "BatchMode=yes", "-o", "PasswordAuthentication=no", "-o", "KbdInteractiveAuthentication=no",
               "-o", "StrictHostKeyChecking=yes"]


class SshIO(IsolateIO):
    """A remote host over ssh (remoting, not isolation: the tools can do what the account can)."""

    def __init__(self, target: str, cwd: str = ""):
        super().__init__(cwd)
        self.target = target

    def build_argv(self, inner, needs_stdin):
        return ["ssh", *SSH_OPTIONS, *([] if needs_stdin else ["-n"]), self.target, shell_quote_join(inner)]


ENGINES = ("docker", "podman")


def parse_container_spec(spec: str) -> tuple[str, str, bool] | None:
    """``<engine>:<image>`` (spawn and own a container) or ``<engine>-container:<id>`` (attach):
    ``(engine, image or id, attach)``, or None for another kind of spec."""
    for engine in ENGINES:
        if spec.startswith(f"{engine}-container:"):
            return engine, spec[len(engine) + len("-container:"):], True
        if spec.startswith(f"{engine}:"):
            return engine, spec[len(engine) + 1:], False
    return None


def valid_container_id(cid: str) -> bool:
    """An id that cannot become an engine option (``--privileged``)."""
    return bool(cid) and cid[0].isascii() and cid[0].isalnum() and all(
        c.isascii() and (c.isalnum() or c in ".-_") for c in cid)


def valid_ssh_target(target: str) -> bool:
    """A target that cannot become an ssh option (``-oProxyCommand=...`` runs on the host)."""
    return bool(target) and target[0] != "-" and all(c.isascii() and (c.isalnum() or c in ".-_@") for c in target)


def make_io(params: dict) -> ToolsIO:
    cwd = params.get("cwd") or ""
    runtime = params.get("runtime") or ""
    if not runtime:
        return LocalIO(cwd)
    container = parse_container_spec(runtime)
    if container is not None:
        engine, arg, attach = container
        if not attach:  # spawning belongs to --tools-runtime, which owns the container
            raise ToolRuntimeError(f"tool runtime must name a running container: {runtime}")
        if not valid_container_id(arg):
            raise ToolRuntimeError(f"invalid container id: {arg}")
        return ContainerIO(engine, arg, cwd)
    if runtime.startswith("ssh:"):
        target = runtime[len("ssh:"):]
        if not valid_ssh_target(target):
            raise ToolRuntimeError(f"invalid ssh target: {target}")
        return SshIO(target, cwd)
    raise ToolRuntimeError(f"unknown tool runtime: {runtime}")
