"""The built-in tools ``--tools`` enables, with upstream's names, definitions (what a model is
shown), parameters, limits and answers: ``read_file``, ``file_glob_search``, ``grep_search``,
``exec_shell_command`` (the one that streams), ``write_file``, ``edit_file`` and ``get_info``.

A tool's answer is a JSON object: ``plain_text_response`` (what a model reads), structured fields,
or ``{"error": "..."}`` for a failure the caller should see (a missing file, a bad pattern). A
missing or mistyped required parameter is a :class:`ToolParamError` (upstream's 400); an unusable
runtime a ``ToolRuntimeError`` (500). Optional parameters of the wrong type take their default, as
upstream's ``json_value`` does.
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Callable

from mlxcel.server.tools.edit import EditError, apply_edits
from mlxcel.server.tools.glob import path_glob_match
from mlxcel.server.tools.io import make_io

READ_FILE_MAX_SIZE = 16 * 1024
READ_FILE_MAX_SIZE_BASE64 = 32 * 1024 * 1024
FILE_SEARCH_MAX_RESULTS = 100
GREP_SEARCH_MAX_RESULTS = 100
EXEC_MAX_OUTPUT = 16 * 1024
EXEC_MAX_TIMEOUT_S = 60
GET_INFO_MAX_OUTPUT = 4096
GET_INFO_TIMEOUT_S = 5
_MISSING = object()


class ToolParamError(Exception):
    """A required parameter is missing or has the wrong type (upstream's 400)."""


def required(params: dict, key: str, kind: type = str):
    value = params.get(key, _MISSING)
    if value is _MISSING:
        raise ToolParamError(f"missing required parameter '{key}'")
    if not _is(value, kind):
        raise ToolParamError(f"parameter '{key}' must be of type {kind.__name__}")
    return value


def optional(params: dict, key: str, default, kind: type):
    value = params.get(key)
    return value if value is not None and _is(value, kind) else default


def _is(value, kind: type) -> bool:
    if kind is int:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, kind)


def _fn(name: str, description: str, properties: dict, required_keys: list[str] | None) -> dict:
    parameters: dict = {"type": "object", "properties": properties}
    if required_keys is not None:
        parameters["required"] = required_keys
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def _p(kind: str, description: str) -> dict:
    return {"type": kind, "description": description}


class Tool:
    name = ""
    display_name = ""
    permission_write = False
    support_stream = False
    uses_cwd = True
    kind = "server"

    def definition(self) -> dict:
        raise NotImplementedError

    def invoke(self, params: dict, stream: Callable[[str], bool] | None = None) -> dict | None:
        """The answer; with ``stream`` (a tool with ``support_stream``) output goes to it as it comes
        and the return value is ignored."""
        raise NotImplementedError

    def to_json(self) -> dict:
        return {"display_name": self.display_name, "tool": self.name, "type": self.kind,
                "permissions": {"write": self.permission_write}, "uses_cwd": self.uses_cwd,
                "definition": self.definition()}


class ReadFile(Tool):
    name, display_name = "read_file", "Read file"

    def definition(self):
        return _fn(self.name, "Read the contents of a file. Optionally specify a 1-based line range. If append_loc is "
                              "true, each line is prefixed with its line number (e.g. \"1\u2192...\").", {
            "path": _p("string", "Path to the file"),
            "start_line": _p("integer", "First line to read, 1-based (default: 1)"),
            "end_line": _p("integer", "Last line to read, 1-based inclusive (default: end of file)"),
            "append_loc": _p("boolean", "Prefix each line with its line number"),
        }, ["path"])

    def invoke(self, params, stream=None):
        path = required(params, "path")
        start_line = int(optional(params, "start_line", 1, int))
        end_line = int(optional(params, "end_line", -1, int))
        append_loc = optional(params, "append_loc", False, bool)
        as_base64 = optional(params, "resp_type", "", str) == "base64"  # the x-resp-type header only
        io = make_io(params)
        size = io.file_size(path)
        if size is None:
            return {"error": f"cannot stat file: {path}"}
        if as_base64:
            if size > READ_FILE_MAX_SIZE_BASE64:
                return {"error": f"file too large ({size} bytes, max {READ_FILE_MAX_SIZE_BASE64})"}
            content = io.read_file(path)
            if content is None:
                return {"error": f"failed to open file: {path}"}
            return {"base64": base64.b64encode(content).decode("ascii"), "size_bytes": len(content)}
        if size > READ_FILE_MAX_SIZE and end_line == -1:
            return {"error": f"file too large ({size} bytes, max {READ_FILE_MAX_SIZE}). Use start_line/end_line to "
                             f"read a portion."}
        content = io.read_file(path)
        if content is None:
            return {"error": f"failed to open file: {path}"}
        result: list[str] = []
        used = 0
        for lineno, line in enumerate(_lines(content.decode("utf-8", errors="replace")), start=1):
            if lineno < start_line:
                continue
            if end_line != -1 and lineno > end_line:
                break
            out_line = f"{lineno}\u2192{line}\n" if append_loc else f"{line}\n"
            if used + len(out_line.encode()) > READ_FILE_MAX_SIZE:
                result.append("[output truncated]")
                break
            result.append(out_line)
            used += len(out_line.encode())
        return {"plain_text_response": "".join(result)}


def _lines(text: str) -> list[str]:
    """``std::getline`` over the text: split on ``\\n``, no empty last line after a final newline."""
    parts = text.split("\n")
    return parts[:-1] if parts and parts[-1] == "" else parts


LIST_KINDS = {"file": "files", "dir": "dirs", "all": "all"}


class FileGlobSearch(Tool):
    name, display_name = "file_glob_search", "File search"

    def definition(self):
        return _fn(self.name,
                   "Recursively search for files matching a glob pattern under a directory. Automatically skips files "
                   "ignored by .gitignore (when the directory is inside a git repo) and common junk directories (.git, "
                   "node_modules, build, dist, etc.) otherwise. A pattern with no '/' (e.g. \"*.cpp\") matches the "
                   "file's basename at any depth. A pattern containing '/' matches the full relative path; unless "
                   "already anchored with \"**/\" or a leading '/', it is automatically prefixed with \"**/\". Use "
                   "type=\"dir\" or \"all\" to also list directories; directory entries are suffixed with '/' in the "
                   "output. Note: directory listings do not apply .gitignore filtering.", {
                       "path": _p("string", "Base directory to search in"),
                       "include": _p("string", "Glob pattern for files to include (e.g. \"*.cpp\" or \"src/**/*.cpp\"). "
                                               "Default: **"),
                       "exclude": _p("string", "Glob pattern for files to exclude"),
                       "type": _p("string", "Entry type to return: \"file\" (default), \"dir\" or \"all\""),
                       "max_depth": _p("integer", "Maximum depth to descend into subdirectories (default: 0 = "
                                                  "unlimited; 1 = direct children only)"),
                       "limit": _p("integer", f"Maximum number of results to return, capped at "
                                              f"{FILE_SEARCH_MAX_RESULTS} (default {FILE_SEARCH_MAX_RESULTS})"),
                   }, ["path"])

    def invoke(self, params, stream=None):
        io = make_io(params)
        path = required(params, "path")
        base = io.resolve(path)
        include = optional(params, "include", "**", str)
        exclude = optional(params, "exclude", "", str)
        kind_name = optional(params, "type", "file", str)
        max_depth = max(0, int(optional(params, "max_depth", 0, int)))
        limit_req = int(optional(params, "limit", FILE_SEARCH_MAX_RESULTS, int))
        if limit_req < 1:
            return {"error": f"invalid limit: {limit_req} (expected 1 or more)"}
        limit = min(limit_req, FILE_SEARCH_MAX_RESULTS)
        if kind_name not in LIST_KINDS:
            return {"error": f'invalid type: {kind_name} (expected "file", "dir" or "all")'}
        listing = io.list_entries(base, max_depth, LIST_KINDS[kind_name])
        if listing.err:
            return {"error": f"{listing.err}: {path}"}
        matches = [(rel, is_dir) for rel, is_dir in listing.entries
                   if path_glob_match(include, rel) and not (exclude and path_glob_match(exclude, rel))]
        shown = matches[:limit]
        text = "".join(f"{rel}{'/' if is_dir else ''}\n" for rel, is_dir in shown)
        text += f"\n---\nTotal matches: {len(matches)}\n"
        if len(matches) > len(shown):
            text += (f"[{len(shown)} results limit reached ({len(matches)} total matches). Refine the glob pattern to "
                     f"narrow the search.]\n")
        if listing.truncated:
            text += "[results truncated: time budget or unreadable directory]\n"
        return {"plain_text_response": text,
                "entries": [{"path": rel, "type": "dir" if is_dir else "file"} for rel, is_dir in shown],
                "base": base}


class GrepSearch(Tool):
    name, display_name = "grep_search", "Grep search"

    def definition(self):
        return _fn(self.name,
                   "Search for a pattern in files under a path. Returns matching lines with file paths (and, unless "
                   "searching a single file, paths relative to the given directory). Automatically skips files ignored "
                   "by .gitignore (when the directory is inside a git repo) and common junk directories (.git, "
                   "node_modules, build, dist, etc.) otherwise. include/exclude: a pattern with no '/' matches the "
                   "basename at any depth; a pattern containing '/' matches the full relative path (auto-anchored with "
                   "\"**/\" unless already anchored).", {
                       "path": _p("string", "File or directory to search in"),
                       "pattern": _p("string", "Pattern to search for (regular expression unless literal is true)"),
                       "include": _p("string", "Glob pattern to filter files (default: **)"),
                       "exclude": _p("string", "Glob pattern to exclude files"),
                       "return_line_numbers": _p("boolean", "If true, include line numbers in results"),
                       "literal": _p("boolean", "Treat pattern as a literal string instead of a regular expression "
                                                "(default: false)"),
                       "ignore_case": _p("boolean", "Case-insensitive search (default: false)"),
                       "context_lines": _p("integer", "Number of lines of context to show before and after each match "
                                                      "(default: 0)"),
                   }, ["path", "pattern"])

    def invoke(self, params, stream=None):
        path = required(params, "path")
        pattern_src = required(params, "pattern")
        include = optional(params, "include", "**", str)
        exclude = optional(params, "exclude", "", str)
        show_lineno = optional(params, "return_line_numbers", False, bool)
        literal = optional(params, "literal", False, bool)
        ignore_case = optional(params, "ignore_case", False, bool)
        ctx = max(0, int(optional(params, "context_lines", 0, int)))
        # upstream's regexes are ECMAScript (std::regex); Python's share that syntax, ASCII classes as there
        source = re.escape(pattern_src) if literal else pattern_src
        try:
            pattern = re.compile(source, re.ASCII | (re.IGNORECASE if ignore_case else 0))
        except re.error as exc:
            return {"error": f"invalid regex: {exc}"}
        io = make_io(params)
        files: list[tuple[str, str]] = []
        abs_path = io.resolve(path)
        if io.is_regular_file(abs_path):
            files.append((abs_path, path))
        elif io.is_directory(abs_path):
            listing = io.list_entries(abs_path, 0, "files")
            if listing.err:
                return {"error": f"{listing.err}: {path}"}
            for rel, _ in listing.entries:
                if path_glob_match(include, rel) and not (exclude and path_glob_match(exclude, rel)):
                    files.append((os.path.join(abs_path, rel), rel))
        else:
            return {"error": f"path does not exist: {path}"}
        out: list[str] = []
        total = 0
        limit_reached = False
        show_num = show_lineno or ctx > 0
        for fpath, display in files:
            if limit_reached:
                break
            content = io.read_file(fpath)
            if content is None:
                continue
            lines = _lines(content.decode("utf-8", errors="replace"))
            for i, line in enumerate(lines):
                if total >= GREP_SEARCH_MAX_RESULTS:
                    limit_reached = True
                    break
                if not pattern.search(line):
                    continue
                lo, hi = (max(0, i - ctx), min(len(lines) - 1, i + ctx)) if ctx > 0 else (i, i)
                for j in range(lo, hi + 1):
                    sep = ":" if j == i else "-"
                    out.append(f"{display}{sep}{f'{j + 1}{sep}' if show_num else ''}{lines[j]}\n")
                if ctx > 0:
                    out.append("--\n")
                total += 1
        text = "".join(out) + f"\n---\nTotal matches: {total}\n"
        if limit_reached:
            text += (f"[{GREP_SEARCH_MAX_RESULTS} matches limit reached. Narrow the path/pattern/include to see "
                     f"more.]\n")
        return {"plain_text_response": text}


class ExecShellCommand(Tool):
    name, display_name = "exec_shell_command", "Execute shell command"
    permission_write = True
    support_stream = True

    def definition(self):
        return _fn(self.name, "Execute a shell command and return its output (stdout and stderr combined).", {
            "command": _p("string", "Shell command to execute"),
            "timeout": _p("integer", f"Timeout in seconds (default 10, max {EXEC_MAX_TIMEOUT_S})"),
            "max_output_size": _p("integer", f"Maximum output size in bytes (default {EXEC_MAX_OUTPUT})"),
        }, ["command"])

    def invoke(self, params, stream=None):
        command = required(params, "command")
        timeout = min(int(optional(params, "timeout", 10, int)), EXEC_MAX_TIMEOUT_S)
        max_output = min(int(optional(params, "max_output_size", EXEC_MAX_OUTPUT, int)), EXEC_MAX_OUTPUT)
        io = make_io(params)
        res = io.run(["sh", "-c", command], max(max_output, 0), max(timeout, 0), stream)
        tail = f"\n[exit code: {res.exit_code}]" + (" [exit due to timed out]" if res.timed_out else "")
        if stream is not None:
            stream(tail)
            return None
        return {"plain_text_response": res.output + tail}


class WriteFile(Tool):
    name, display_name = "write_file", "Write file"
    permission_write = True

    def definition(self):
        return _fn(self.name, "Write content to a file, creating it (including parent directories) if it does not "
                              "exist. May use with edit_file for more complex edits.", {
            "path": _p("string", "Path of the file to write"),
            "content": _p("string", "Content to write"),
        }, ["path", "content"])

    def invoke(self, params, stream=None):
        path = required(params, "path")
        content = required(params, "content").encode("utf-8", errors="surrogatepass")
        if not make_io(params).write_file(path, content):
            return {"error": f"failed to write file: {path}"}
        return {"result": "file written successfully", "path": path, "bytes": len(content)}


class EditFile(Tool):
    name, display_name = "edit_file", "Edit file"
    permission_write = True

    def definition(self):
        return _fn(self.name,
                   "Edit a file using exact text replacement. Each edits[].old_text must be unique in the file and is "
                   "matched against the original content, not incrementally. Merge nearby changes into one edit "
                   "instead of overlapping edits. Use write_file to replace the whole file.", {
                       "path": _p("string", "Path to the file to edit"),
                       "edits": {"type": "array", "description": "One or more exact text replacements to apply",
                                 "items": {"type": "object", "properties": {
                                     "old_text": _p("string", "Exact text to find; must be unique in the file and "
                                                              "must not overlap with other edits"),
                                     "new_text": _p("string", "Text to replace old_text with"),
                                 }, "required": ["old_text", "new_text"]}},
                   }, ["path", "edits"])

    def invoke(self, params, stream=None):
        path = required(params, "path")
        edits_json = params.get("edits", _MISSING)
        if edits_json is _MISSING:
            raise ToolParamError("missing required parameter 'edits'")
        if not isinstance(edits_json, list) or not edits_json:
            return {"error": '"edits" must be a non-empty array'}
        edits = []
        for i, e in enumerate(edits_json):
            if not isinstance(e, dict):
                raise ToolParamError(f"edits[{i}] must be an object")
            old, new = required(e, "old_text"), required(e, "new_text")
            if not old:
                return {"error": f"edits[{i}].old_text must not be empty"}
            edits.append((old, new))
        io = make_io(params)
        raw = io.read_file(path)
        if raw is None:
            return {"error": f"failed to open file: {path}"}
        try:
            new_content = apply_edits(raw.decode("utf-8", errors="surrogateescape"), edits, path)
        except EditError as exc:
            return {"error": str(exc)}
        if not io.write_file(path, new_content.encode("utf-8", errors="surrogateescape")):
            return {"error": f"failed to write file: {path}"}
        return {"result": "file edited successfully", "path": path, "edits_applied": len(edits)}


class GetInfo(Tool):
    name, display_name = "get_info", "Get Runtime Info"

    def definition(self):
        return _fn(self.name, "Returns runtime info: the OS name/version and the current working directory",
                   {}, None)

    def invoke(self, params, stream=None):
        io = make_io(params)
        res = io.run(["uname", "-a"], GET_INFO_MAX_OUTPUT, GET_INFO_TIMEOUT_S)
        os_info = res.output.strip() if res.exit_code == 0 and not res.timed_out else "unknown"
        cwd = optional(params, "cwd", "", str)
        if not cwd:
            if not optional(params, "runtime", "", str):
                cwd = os.getcwd()
            else:
                pwd = io.run(["pwd"], GET_INFO_MAX_OUTPUT, GET_INFO_TIMEOUT_S)
                cwd = pwd.output.strip() if pwd.exit_code == 0 and not pwd.timed_out else "unknown"
        return {"os": os_info, "cwd": cwd}


# upstream's order (GET /tools lists them so)
BUILTIN = (ReadFile, FileGlobSearch, GrepSearch, ExecShellCommand, WriteFile, EditFile, GetInfo)
