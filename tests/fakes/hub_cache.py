"""A Hugging Face hub cache folder as huggingface_hub writes it and RunPod mounts it for its
cached models (the tests of handler/cached_model.py, the image's job run)."""
from __future__ import annotations

import hashlib
import os


def lay_out(hub, folder: str, source: str, snapshots: dict, refs: dict | None = None) -> str:
    """A repo folder as huggingface_hub writes it: each file once under blobs/ (named by its
    hash), linked from snapshots/<commit>/; `snapshots` maps a commit to its mtime (newest
    last), `refs` a ref name to its commit."""
    repo = hub / folder
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    for commit, mtime in snapshots.items():
        snap = repo / "snapshots" / commit
        snap.mkdir(parents=True)
        for name in os.listdir(source):
            data = open(os.path.join(source, name), "rb").read()
            blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
            if not blob.exists():
                blob.write_bytes(data)
            os.symlink(os.path.relpath(blob, snap), snap / name)
        os.utime(snap, (mtime, mtime))
    for ref, commit in (refs or {}).items():
        (repo / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return str(repo)
