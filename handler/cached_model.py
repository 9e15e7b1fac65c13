"""A MODEL_NAME hub id found already on disk in a Hugging Face hub cache: RunPod's cached models
(the host holds the endpoint's model under /runpod-volume/huggingface-cache/hub, its
`models--org--name` folder lowercased) or a network volume that huggingface_hub filled under
BASE_PATH. Found, it loads from that snapshot with no hub call at all; the worker still serves it
under MODEL_NAME as written."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("handler")

# where RunPod mounts an endpoint's cached model, whatever BASE_PATH says
RUNPOD_HUB_CACHE = "/runpod-volume/huggingface-cache/hub"
REPO_PREFIX = "models--"


@dataclass(frozen=True, slots=True)
class CachedModel:
    repo_folder: str  # the cache's models--org--name folder
    snapshot: str  # the snapshot folder to load
    chosen_by: str  # why this snapshot: MODEL_REVISION, refs/main, or the newest


def hub_caches(settings: Any) -> list[str]:
    """The hub cache folders to look in, in order, those that exist: under BASE_PATH (the folder
    itself, its hub/, its huggingface-cache/hub/ where the worker points HF_HOME), the Hugging
    Face cache (HF_HOME/hub, huggingface_hub's HF_HUB_CACHE), and RunPod's cached-models folder."""
    candidates = []
    if settings.base_path:
        base = settings.base_path
        candidates += [base, os.path.join(base, "hub"), os.path.join(base, "huggingface-cache", "hub")]
    from huggingface_hub import constants

    hf_home = os.environ.get("HF_HOME")  # read now: the worker may have pointed it under BASE_PATH since the import
    candidates += [os.path.join(hf_home, "hub") if hf_home else None, constants.HF_HUB_CACHE, RUNPOD_HUB_CACHE]
    found: dict[str, str] = {}  # real path -> the path as configured (logged as such)
    for c in candidates:
        if c and os.path.isdir(c):
            found.setdefault(os.path.realpath(c), c)
    return list(found.values())


def repo_folder(cache: str, repo_id: str) -> str | None:
    """The repo's folder in `cache`: huggingface_hub's own name for it, else the one whose name
    matches it ignoring case (RunPod lowercases org and name)."""
    from huggingface_hub.file_download import repo_folder_name

    wanted = repo_folder_name(repo_id=repo_id, repo_type="model")
    if os.path.isdir(os.path.join(cache, wanted)):
        return os.path.join(cache, wanted)
    try:
        names = sorted(os.listdir(cache))
    except OSError:
        return None
    matches = [n for n in names if n.lower() == wanted.lower() and os.path.isdir(os.path.join(cache, n))]
    return os.path.join(cache, matches[0]) if matches else None


def pick_snapshot(folder: str, revision: str | None, label: str) -> tuple[str, str] | None:
    """(snapshot folder, why) of the repo folder: MODEL_REVISION's (a commit hash, or a branch or
    tag name under refs/) when set, else refs/main's, else the newest snapshot; None when the
    cache lacks it. Resolved by huggingface_hub itself with local files only (its cached file
    listing, when it has one, must show the snapshot complete: else ModelLoadError naming
    `label`, e.g. `MODEL_NAME=org/name`)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import LocalEntryNotFoundError

    cache, name = os.path.split(folder)
    repo_id = name[len(REPO_PREFIX):].replace("--", "/")  # the folder's own case, so the paths it builds match
    try:
        return snapshot_download(repo_id, revision=revision or "main", cache_dir=cache,
                                 local_files_only=True), "MODEL_REVISION" if revision else "refs/main"
    except LocalEntryNotFoundError as exc:
        if type(exc).__name__ == "IncompleteSnapshotError":  # huggingface_hub >= 2.x: its own listing says so
            from engine.errors import ModelLoadError

            raise ModelLoadError(f"{label}: the cached snapshot "
                                 f"{getattr(exc, 'snapshot_path', folder)} is incomplete: {exc}") from None
        if revision:
            return None
    snapshots = os.path.join(folder, "snapshots")
    found = [os.path.join(snapshots, s) for s in os.listdir(snapshots)] if os.path.isdir(snapshots) else []
    found = [s for s in found if os.path.isdir(s)]
    return (max(found, key=os.path.getmtime), "the newest snapshot") if found else None


def is_hub_id(name: str | None) -> bool:
    """`org/name` that is no local path: what the loader would fetch from the hub."""
    from handler.model_roots import is_local_path

    return bool(name) and name.count("/") == 1 and not is_local_path(name)


def find_in_hub_caches(settings: Any, repo_id: str, revision: str | None, label: str) -> CachedModel | None:
    """A hub id in the first hub cache that holds it, at `revision`'s snapshot (or refs/main's, or
    the newest); None when it is no hub id or no cache holds it (the hub download as before).
    `label` names it in errors and logs (`MODEL_NAME=org/name`, a LoRA adapter)."""
    if not is_hub_id(repo_id):
        return None
    for cache in hub_caches(settings):
        folder = repo_folder(cache, repo_id)
        if folder is None:
            continue
        picked = pick_snapshot(folder, revision, label)
        if picked is None:
            log.info("%s is cached in %s but not at revision %s; looking further", label, folder, revision)
            continue
        return CachedModel(folder, picked[0], picked[1])
    return None


def find_cached_model(settings: Any) -> CachedModel | None:
    """MODEL_NAME (a hub id) in the first hub cache that holds it, at MODEL_REVISION's snapshot
    (or refs/main's, or the newest); None when no cache holds it (the hub download as before)."""
    name = settings.model_name
    return find_in_hub_caches(settings, name, settings.model_revision, f"MODEL_NAME={name}")
