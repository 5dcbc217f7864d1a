"""Fetching what ``-hf <user>/<model>[:quant]`` chose (``hub_select``): from the local Hugging Face
cache when it holds every file (no network at all then), else from the hub into that cache, through
huggingface_hub so the cache stays the one every other tool shares.

Two steps, so the router can answer ``POST /models`` once the choice is known and download after:
:func:`plan` decides the files (the cache's snapshot first; the hub's listing only when the cache
cannot answer), :func:`fetch` makes them local. :func:`resolve` is both.

With no quant, the cache answers only when it holds the default quant (``Q4_K_M``): the hub may have
it where the cache has another, and upstream would download it. Offline (``HF_HUB_OFFLINE=1``,
``--offline``), or when the hub cannot be reached, the cache answers by the full rules, and a miss is
an error naming what the cache has. The offline switch, the cache's place (``HF_HUB_CACHE``,
``HF_HOME``) and the hub's (``HF_ENDPOINT``) are read at each call, not at import, so ``--offline``
set after huggingface_hub was imported still holds.

Downloads show huggingface_hub's progress bars on a terminal; otherwise (a log file, a service) one
line per file as it starts and ends. A caller may follow the bytes too (``progress``), as the router
does for its ``download_progress`` events.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import HfApi, constants, hf_hub_download
from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError
from huggingface_hub.utils import tqdm as hf_tqdm

from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.model.hub_select import DEFAULT_QUANTS, RepoChoice, choose_files, is_model_gguf, split_repo_tag

log = logging.getLogger(__name__)

Progress = Callable[[str, int, "int | None"], None]  # (repository path, bytes so far, total or None)
TRUE = ("1", "on", "yes", "true")


class HubUnreachableError(ModelLoadError):
    """The hub could not be asked (no network, a proxy, its own 5xx), as opposed to a repository or
    quant that does not exist: a router answers it as unavailable rather than as a bad request."""


@dataclass(frozen=True)
class Snapshot:
    """One cached revision of a repository: its folder and the files it holds (relative paths)."""

    root: Path
    files: tuple[str, ...]

    def has(self, files: tuple[str, ...]) -> bool:
        return all((self.root / f).is_file() for f in files)


@dataclass(frozen=True)
class HubPlan:
    """The files chosen, and whether the cache already holds all of them (``snapshot`` then has them)."""

    choice: RepoChoice
    snapshot: Snapshot | None
    cached: bool


@dataclass(frozen=True)
class HubModel:
    """What ``-hf`` resolved to: ``path`` is the GGUF to load (a split one's first part) or the
    model directory; ``choice`` says what was picked, the projector (``choice.mmproj``) included."""

    path: Path
    choice: RepoChoice


def cache_root() -> Path:
    """huggingface_hub's cache folder, by its variables as they are now."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path(constants.HF_HUB_CACHE)


def endpoint() -> str:
    """The hub's address (``HF_ENDPOINT``, else huggingface.co)."""
    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in TRUE or bool(constants.HF_HUB_OFFLINE)


def cached_snapshot(repo: str) -> Snapshot | None:
    """The cached snapshot ``refs/main`` points to (else another ref's, else the newest folder)."""
    base = cache_root() / ("models--" + repo.replace("/", "--"))
    snapshots = base / "snapshots"
    if not snapshots.is_dir():
        return None
    refs = base / "refs"
    names = sorted(refs.iterdir(), key=lambda p: p.name != "main") if refs.is_dir() else []
    commits = [p.read_text().strip() for p in names if p.is_file()]
    folder = next((snapshots / c for c in commits if c and (snapshots / c).is_dir()), None)
    if folder is None:
        folders = [p for p in snapshots.iterdir() if p.is_dir()]
        if not folders:
            return None
        folder = max(folders, key=lambda p: p.stat().st_mtime)
    files = tuple(sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()))
    return Snapshot(folder, files)


def plan(spec: str, hf_file: str | None = None) -> HubPlan:
    """The files ``spec`` (and ``-hff``'s ``hf_file``) means, and where they are."""
    repo, tag = split_repo_tag(spec)
    snapshot = cached_snapshot(repo)
    if snapshot is not None and not offline():
        default = not tag and not hf_file and any(is_model_gguf(f) for f in snapshot.files)
        choice = _try_choose(f"{repo}:{DEFAULT_QUANTS[0]}" if default else spec, snapshot, hf_file)
        if choice is not None:
            return HubPlan(choice, snapshot, cached=True)
    if offline():
        return HubPlan(_offline_choice(spec, snapshot, hf_file), snapshot, cached=True)
    try:
        files = remote_files(repo)
    except HubUnreachableError as exc:
        if snapshot is None:
            raise
        log.warning("%s; choosing from the cached copy instead", exc)  # as upstream falls back to its cache
        return HubPlan(_offline_choice(spec, snapshot, hf_file), snapshot, cached=True)
    return HubPlan(choose_files(spec, files, hf_file), snapshot, cached=False)


def _try_choose(spec: str, snapshot: Snapshot, hf_file: str | None) -> RepoChoice | None:
    """The cache's answer when it is a complete one, else None (the hub is asked)."""
    try:
        choice = choose_files(spec, list(snapshot.files), hf_file)
    except ModelLoadError:
        return None
    return choice if snapshot.has(choice.files) and _complete(choice, snapshot) else None


def _offline_choice(spec: str, snapshot: Snapshot | None, hf_file: str | None) -> RepoChoice:
    if snapshot is None:
        raise ModelLoadError(f"{spec} is not in the local Hugging Face cache ({cache_root()}) and the hub cannot "
                             "be reached (offline: HF_HUB_OFFLINE / --offline); download it first or pass -m with "
                             "a local path")
    try:
        choice = choose_files(spec, list(snapshot.files), hf_file)
    except ModelLoadError as exc:
        raise ModelLoadError(f"{exc} (offline, or the hub unreachable: only the local Hugging Face cache was "
                             "looked at)") from None
    if not _complete(choice, snapshot):
        raise ModelLoadError(f"the local Hugging Face cache's copy of {choice.repo} ({snapshot.root}) lacks weight "
                             "files its index names, and the hub cannot be asked (offline, or unreachable)")
    return choice


def _complete(choice: RepoChoice, snapshot: Snapshot) -> bool:
    """A model directory is complete when every shard its safetensors index names is there (or,
    without an index, some safetensors file is); a GGUF choice when its parts are."""
    if choice.primary is not None:
        return snapshot.has(choice.files)
    index = snapshot.root / "model.safetensors.index.json"
    if not index.is_file():
        return any(f.endswith(".safetensors") for f in snapshot.files)
    try:
        shards = set(json.loads(index.read_text()).get("weight_map", {}).values())
    except (OSError, ValueError, AttributeError):
        return False
    return snapshot.has(tuple(shards))


def remote_files(repo: str) -> list[str]:
    """The repository's file list from the hub (one request)."""
    try:
        return HfApi(endpoint=endpoint()).list_repo_files(repo)
    except GatedRepoError:
        raise ModelLoadError(f"{repo} is gated on Hugging Face: accept its terms on the hub and pass a token "
                             "(-hft / HF_TOKEN)") from None
    except RepositoryNotFoundError:
        raise ModelLoadError(f"{repo} was not found on Hugging Face (a private repository needs a token: "
                             "-hft / HF_TOKEN)") from None
    except Exception as exc:  # no network, a proxy, the hub's 5xx: one message either way
        raise HubUnreachableError(f"could not list {repo} on Hugging Face ({type(exc).__name__}: {exc}), and the "
                                  "local Hugging Face cache does not hold it; pass -m with a local path") from None


def fetch(hub_plan: HubPlan, progress: Progress | None = None) -> HubModel:
    """Make the plan's files local; the path to load."""
    choice, snapshot = hub_plan.choice, hub_plan.snapshot
    local: dict[str, Path] = {}
    for name in choice.files:
        if snapshot is not None and (hub_plan.cached or choice.primary is not None) and (snapshot.root / name).is_file():
            local[name] = snapshot.root / name  # a GGUF part the cache holds is never fetched again
        else:
            local[name] = download(choice.repo, name, progress)
    if choice.mmproj:
        log.info("%s: %s is the model's multimodal projector (fetched and loaded with the model, unless "
                 "--no-mmproj)", choice.repo, choice.mmproj)
    if choice.primary is not None:
        path = local[choice.primary]
    else:
        path = local["config.json"].parent
    log.info("%s resolved to %s", choice.repo + (f":{choice.tag}" if choice.tag else ""), path)
    return HubModel(path, choice)


def resolve(spec: str, hf_file: str | None = None, progress: Progress | None = None) -> HubModel:
    """:func:`plan`, then :func:`fetch`."""
    return fetch(plan(spec, hf_file), progress)


def download(repo: str, name: str, progress: Progress | None = None) -> Path:
    """One file into the cache: huggingface_hub's bar on a terminal, a line at each end otherwise."""
    quiet = not sys.stderr.isatty()
    if quiet:
        log.info("downloading %s from %s", name, repo)
    start = time.monotonic()
    try:
        path = Path(hf_hub_download(repo, name, cache_dir=cache_root(), endpoint=endpoint(),
                                    tqdm_class=_reporting_bar(name, progress)))
    except GatedRepoError:
        raise ModelLoadError(f"{repo} is gated on Hugging Face: accept its terms on the hub and pass a token "
                             "(-hft / HF_TOKEN)") from None
    except Exception as exc:
        raise HubUnreachableError(f"could not download {name} from {repo}: {type(exc).__name__}: {exc}") from None
    if quiet:
        log.info("downloaded %s (%.1f MiB) in %.1f s", name, path.stat().st_size / 2**20, time.monotonic() - start)
    return path


def _reporting_bar(name: str, progress: Progress | None):
    """huggingface_hub's bar class (None: its own), telling ``progress`` of every chunk; the bar
    itself still shows only on a terminal."""
    if progress is None:
        return None

    class ReportingBar(hf_tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.seen = self.n
            progress(name, self.seen, self.total)

        def update(self, n=1):
            self.seen += n or 0
            progress(name, self.seen, self.total)
            return super().update(n)

    return ReportingBar
