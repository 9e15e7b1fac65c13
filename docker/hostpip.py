"""This machine's pip configuration, handed to a `docker build` (scripts/build_image.sh
runs it; not part of the image). A build step sees only its own filesystem, so the
local folders pip is configured with (find-links such as the CPU torch wheel, file://
indexes, a constraints file) are served over HTTP on 127.0.0.1 (the build runs with
`--network host`) and the configuration is rewritten to point at them:

    python docker/hostpip.py OUT_DIR      # writes OUT_DIR/pip.conf (+ pip_cert), serves until stopped

OUT_DIR/pip.conf and OUT_DIR/pip_cert go to the build as BuildKit secrets `pip_conf` and
`pip_cert` (docker/Dockerfile mounts them at /run/secrets/; a secret never enters a layer,
so index credentials stay out of the image). OUT_DIR/port is written last: once it is
there the server is up. Nothing but the configured folders is served.
"""
from __future__ import annotations

import configparser
import functools
import os
import re
import shutil
import subprocess
import sys
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

SECRETS = "/run/secrets"
# options whose values are locations (several, space separated)
LOCATIONS = ("find-links", "index-url", "extra-index-url", "constraint", "requirement")


def pip_config(python: str = sys.executable) -> dict[str, str]:
    """`pip config list` as {option: value}, later scopes winning (global < user < site < env)."""
    out = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True).stdout
    options: dict[str, str] = {}
    for line in out.splitlines():
        m = re.match(r"^(?::env:|[\w-]+)\.([\w-]+)=(.*)$", line.strip())
        if m:
            value = m.group(2)
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            options[m.group(1)] = value
    return options


def _local_path(value: str) -> Path | None:
    if value.startswith("file://"):
        return Path(unquote(urlsplit(value).path))
    if value.startswith("/"):
        return Path(value)
    return None


def translate(options: dict[str, str], base_url: str, out_dir: Path) -> tuple[dict[str, str], list[Path]]:
    """The options as the build must see them, and the local paths to serve (index i at /i/)."""
    served: list[Path] = []
    conf: dict[str, str] = {}
    for key, value in options.items():
        if key == "cert":
            shutil.copyfile(value, out_dir / "pip_cert")
            conf[key] = f"{SECRETS}/pip_cert"
        elif key in LOCATIONS:
            urls = []
            for item in value.split():
                path = _local_path(item)
                if path is None:
                    urls.append(item)
                    continue
                if not path.exists():
                    continue  # pip ignores a missing folder too
                # an index's pages link to its files by relative paths (../../files/x.whl):
                # its parent folder is served; a single file is served alone
                if key.endswith("index-url"):
                    root, rest = path.parent, path.name + "/"
                else:
                    root, rest = path, "" if path.is_dir() else path.name
                if root not in served:
                    served.append(root)
                urls.append(f"{base_url}/{served.index(root)}/{rest}")
            if urls:
                conf[key] = " ".join(urls)
        elif key not in ("cache-dir", "target", "prefix", "root", "src", "log"):
            conf[key] = value  # timeouts, version check and the like; host paths are dropped
    return conf, served


class _Handler(SimpleHTTPRequestHandler):
    roots: list[Path] = []

    def log_message(self, *args):  # quiet
        pass

    def translate_path(self, path: str) -> str:
        parts = unquote(urlsplit(path).path).lstrip("/").split("/", 1)
        if not parts[0].isdigit() or int(parts[0]) >= len(self.roots):
            return "/nonexistent"
        root = self.roots[int(parts[0])].resolve()
        if root.is_file():  # served alone, under its own name
            return str(root) if len(parts) > 1 and parts[1] == root.name else "/nonexistent"
        # checked before symlinks are followed: a link inside the folder may point elsewhere
        # (find-links folders often hold such links), a `..` may not leave it
        target = os.path.normpath(os.path.join(root, parts[1] if len(parts) > 1 else ""))
        if target != str(root) and not target.startswith(str(root) + os.sep):
            return "/nonexistent"
        return target


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    out_dir = Path(args[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Handler))
    server.daemon_threads = True
    port = server.server_address[1]
    conf, served = translate(pip_config(), f"http://127.0.0.1:{port}", out_dir)
    _Handler.roots = served
    parser = configparser.ConfigParser()
    parser["global"] = conf
    with open(out_dir / "pip.conf", "w", encoding="utf-8") as f:
        parser.write(f)
    for i, root in enumerate(served):
        print(f"hostpip: serving {root} at http://127.0.0.1:{port}/{i}/", file=sys.stderr)
    (out_dir / "port.tmp").write_text(str(port))
    os.replace(out_dir / "port.tmp", out_dir / "port")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
