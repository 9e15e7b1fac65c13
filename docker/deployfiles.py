"""Reads the deployment files the way Docker and the RunPod Hub do, for the image
rehearsal (scripts/rehearse_image.sh) and the tests in tests/deploy/: the
Dockerfile's stages, ARG defaults, ENV and COPY lines; .dockerignore; the wheel's
file list against the package's files; the hub.json env list made from
handler/settings.py's table. Not part of the image.

    python docker/deployfiles.py materialize STAGE ROOT      # a stage's COPY lines, into ROOT
    python docker/deployfiles.py env STAGE ROOT              # its ENV as `export` lines, paths under ROOT
    python docker/deployfiles.py wheel-check WHEEL SRC_DIR   # every package file made it into the wheel
    python docker/deployfiles.py hub-env [--write]           # .runpod/hub.json's env list (and .runpod/Dockerfile) current
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shlex
import shutil
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCKERFILE = REPO / "docker" / "Dockerfile"
PACKAGES = ("engine", "llm_kernels", "handler")


# --------------------------------------------------------------------------- #
# Dockerfile
# --------------------------------------------------------------------------- #


@dataclass
class Stage:
    name: str
    base: str  # the FROM image or stage, ARGs resolved
    instructions: list[tuple[str, str]] = field(default_factory=list)  # (KEYWORD, rest)

    def all(self, keyword: str) -> list[str]:
        return [rest for kw, rest in self.instructions if kw == keyword]


@dataclass
class Dockerfile:
    global_args: dict[str, str]
    stages: list[Stage]

    def stage(self, name: str) -> Stage:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(f"no stage {name!r} in the Dockerfile ({[s.name for s in self.stages]})")

    def chain(self, name: str) -> list[Stage]:
        """The stage and the stages it is built FROM, base first."""
        names = {s.name for s in self.stages}
        out = [self.stage(name)]
        while out[0].base in names:
            out.insert(0, self.stage(out[0].base))
        return out

    @property
    def base_image(self) -> str:
        """The external image the final stage is built on."""
        return self.chain(self.stages[-1].name)[0].base

    def env(self, name: str) -> dict[str, str]:
        env: dict[str, str] = {}
        for s in self.chain(name):
            for rest in s.all("ENV"):
                env.update(parse_env(rest, env))
        return env

    def arg_defaults(self, name: str) -> dict[str, str]:
        args: dict[str, str] = {}
        for s in self.chain(name):
            for rest in s.all("ARG"):
                key, _, value = rest.partition("=")
                args[key.strip()] = _unquote(value.strip()) if value else self.global_args.get(key.strip(), "")
        return args

    def workdir(self, name: str, upto: int | None = None) -> str:
        wd = "/"
        for s in self.chain(name):
            items = s.instructions if s.name != name or upto is None else s.instructions[:upto]
            for kw, rest in items:
                if kw == "WORKDIR":
                    wd = os.path.normpath(os.path.join(wd, rest.strip()))
        return wd

    def copies(self, name: str) -> list[tuple[list[str], str]]:
        """(sources, absolute destination) of the stage's own COPY lines from the build context."""
        stage = self.stage(name)
        out = []
        for i, (kw, rest) in enumerate(stage.instructions):
            if kw not in ("COPY", "ADD"):
                continue
            words = shlex.split(rest)
            if any(w.startswith("--from") for w in words):
                continue
            words = [w for w in words if not w.startswith("--")]
            *sources, dest = words
            out.append((sources, os.path.join(self.workdir(name, upto=i), dest) + ("/" if dest.endswith("/") else "")))
        return out


def _logical_lines(text: str) -> list[str]:
    lines, current = [], ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue  # comment lines inside a continued instruction
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append(current + stripped)
        current = ""
    if current:
        lines.append(current)
    return lines


def _unquote(value: str) -> str:
    return shlex.split(value)[0] if value else ""


def _subst(value: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), value)


def parse_env(rest: str, current: dict[str, str]) -> dict[str, str]:
    """`ENV A=1 B="x y"` (and the old `ENV A 1`), $VAR expanded from earlier ENV."""
    words = shlex.split(rest)
    if words and "=" not in words[0]:
        return {words[0]: " ".join(words[1:])}
    out: dict[str, str] = {}
    for w in words:
        key, _, value = w.partition("=")
        out[key] = re.sub(r"\$\{?(\w+)\}?", lambda m: {**current, **out}.get(m.group(1), m.group(0)), value)
    return out


def read_dockerfile(path: Path = DOCKERFILE) -> Dockerfile:
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in _logical_lines(path.read_text(encoding="utf-8")):
        keyword, _, rest = line.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "FROM":
            words = [w for w in rest.split() if not w.startswith("--")]
            base = _subst(words[0], global_args)
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else str(len(stages))
            stages.append(Stage(name, base))
        elif not stages:
            if keyword == "ARG":
                key, _, value = rest.partition("=")
                global_args[key.strip()] = _unquote(value.strip())
        else:
            stages[-1].instructions.append((keyword, rest))
    return Dockerfile(global_args, stages)


# --------------------------------------------------------------------------- #
# .dockerignore and the build context
# --------------------------------------------------------------------------- #


def _pattern_regex(pattern: str) -> re.Pattern:
    """Docker's pattern syntax (Go filepath.Match plus `**`) as a regex on slash paths."""
    out, i = "", 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            i += 2
            if pattern.startswith("/", i):
                i += 1
                out += "(?:.*/)?"
            else:
                out += ".*"
            continue
        out += {"*": "[^/]*", "?": "[^/]"}.get(c, re.escape(c))
        i += 1
    return re.compile(out + r"\Z")


@dataclass
class DockerIgnore:
    rules: list[tuple[bool, re.Pattern, str]]  # (exclude?, regex, original)

    @classmethod
    def read(cls, path: Path) -> DockerIgnore:
        rules = []
        if path.is_file():
            for line in path.read_text(encoding="utf-8").splitlines():
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                negate = line.startswith("!")
                pat = os.path.normpath(line[1:] if negate else line).lstrip("/")
                rules.append((not negate, _pattern_regex(pat), line))
        return cls(rules)

    def ignored(self, rel: str) -> bool:
        """Whether the context path `rel` is left out (a match on a parent folder counts, last rule wins)."""
        parts = Path(rel).parts
        result = False
        for exclude, regex, _ in self.rules:
            if any(regex.match("/".join(parts[: i + 1])) for i in range(len(parts))):
                result = exclude
        return result


def context_files(source: str, context: Path, ignore: DockerIgnore) -> list[str]:
    """The context-relative files a COPY source brings in, after .dockerignore."""
    root = context / source
    if root.is_file():
        candidates = [source]
    else:
        candidates = [p.relative_to(context).as_posix() for p in sorted(root.rglob("*")) if p.is_file()]
    return [c for c in candidates if not ignore.ignored(c)]


def materialize(stage: str, root: Path, context: Path = REPO, dockerfile: Path = DOCKERFILE) -> list[Path]:
    """Copy what the stage's COPY lines copy into `root` (as if `root` were the image's /)."""
    df = read_dockerfile(dockerfile)
    ignore = DockerIgnore.read(context / ".dockerignore")
    written = []
    for sources, dest in df.copies(stage):
        into_dir = dest.endswith("/") or len(sources) > 1
        for source in sources:
            files = context_files(source, context, ignore)
            if not files:
                raise FileNotFoundError(f"COPY {source}: nothing in the build context (missing, or .dockerignore'd)")
            for rel in files:
                if (context / source).is_file():
                    target = Path(dest) / Path(rel).name if into_dir else Path(dest)
                else:
                    target = Path(dest) / Path(rel).relative_to(source)
                out = root / str(target).lstrip("/")
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(context / rel, out)
                written.append(out)
    return written


def stage_env(stage: str, root: Path, dockerfile: Path = DOCKERFILE) -> dict[str, str]:
    """The stage's ENV with absolute paths moved under `root`; PATH and VIRTUAL_ENV left to the caller."""
    env = read_dockerfile(dockerfile).env(stage)
    out = {}
    for key, value in env.items():
        if key in ("PATH", "VIRTUAL_ENV"):
            continue
        out[key] = str(root / value.lstrip("/")) if value.startswith("/") else value
    return out


# --------------------------------------------------------------------------- #
# The wheel against the package's files
# --------------------------------------------------------------------------- #


def package_files(src: Path) -> set[str]:
    """Every file of the packages under `src` that an installed package might open."""
    out = set()
    for pkg in PACKAGES:
        for p in (src / pkg).rglob("*"):
            if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo"):
                out.add(p.relative_to(src).as_posix())
    return out


def wheel_files(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        return {n for n in z.namelist() if not n.split("/")[0].endswith((".dist-info", ".data"))}


def missing_from_wheel(wheel: Path, src: Path) -> list[str]:
    return sorted(package_files(src) - wheel_files(wheel))


# --------------------------------------------------------------------------- #
# hub.json's env list, from handler/settings.py
# --------------------------------------------------------------------------- #

HUB_JSON = REPO / ".runpod" / "hub.json"
# Shown first in the Hub's form; the rest go under "advanced".
PRIMARY = {"MODEL_NAME", "MODEL_REVISION", "QUANTIZATION", "HF_TOKEN", "MAX_MODEL_LEN", "GPU_MEMORY_UTILIZATION",
           "MAX_NUM_SEQS", "MAX_CONCURRENCY", "DEFAULT_MAX_TOKENS", "ENABLE_PREFIX_CACHING", "BASE_PATH"}


def _image_var(key: str, name: str, kind: str, description: str, **values) -> dict:
    """A Hub env entry, under "advanced", for a variable the image reads (values: a boolean's
    trueValue and falseValue)."""
    return {"key": key, "input": {"name": name, "type": kind, "advanced": True, **values, "description": description}}


# Variables the image itself reads besides the worker's settings.
IMAGE_ENV = (
    _image_var("HF_HUB_OFFLINE", "HF hub offline", "boolean",
               "Never contact the Hugging Face hub. Unset: on when the model baked into the image is served, "
               "off otherwise.", trueValue="1", falseValue="0"),
    _image_var("HF_HOME", "HF home", "string", "Hugging Face cache folder. Unset: BASE_PATH/huggingface-cache."),
    _image_var("LLM_KERNELS_CACHE_DIR", "Kernel tuning cache", "string",
               "Folder of the kernels' tuned configs, kept for the next worker on the same GPU model (empty: off). "
               "Unset: BASE_PATH/llm-kernels-cache, else ~/.cache/llm_kernels."),
    _image_var("TRITON_CACHE_DIR", "Triton cache", "string",
               "Folder of Triton's compiled kernels. Unset: BASE_PATH/triton-cache, else ~/.triton/cache."),
    _image_var("XDG_CACHE_HOME", "XDG cache home", "string",
               "Second place the default model is looked for and prepared (after BASE_PATH). Unset: the baked "
               "default model's folder while it is served, else ~/.cache. Leave it unset."),
)
_WORDS = {"XDG": "XDG", "GPU": "GPU", "KV": "KV", "HF": "HF", "TTL": "TTL", "OPENAI": "OpenAI", "DTYPE": "Dtype", "S": "(s)",
          "LORA": "LoRA", "LORAS": "LoRAs", "CPU": "CPU",
          "LEN": "length", "NUM": "number of", "MAX": "max", "MIN": "min"}


def _title(name: str) -> str:
    """MAX_MODEL_LEN -> 'Max model length' (the Hub form's label; the key stays the variable)."""
    words = [_WORDS.get(w, w.lower()) for w in name.split("_")]
    text = " ".join(words)
    return text[0].upper() + text[1:]


_HUB_TYPES = {"str": "string", "json": "string", "int": "number", "float": "number", "bool": "boolean",
              "choice": "string"}


# Settings the Hub's form does not offer (testing only); the worker still reads them.
HUB_HIDDEN = {"FAULT_INJECTION"}
# The Hub's Hugging Face model picker (the publishing guide's `"type": "huggingface"` input).
HUB_MODEL_PICKER = {"MODEL_NAME"}


def hub_env(settings=None, image_env: dict[str, str] | None = None) -> list[dict]:
    """One Hub env entry per setting, with the input types of the Hub's publishing guide
    (https://docs.runpod.io/hub/publishing-guide): string, huggingface (the model picker),
    string with options, number with min/max, boolean with trueValue/falseValue; defaults as
    the image has them. HUB_HIDDEN settings are left out."""
    if settings is None:
        sys.path.insert(0, str(REPO))
        from handler.settings import SETTINGS as settings
    image_env = read_dockerfile().env("worker") if image_env is None else image_env
    entries = []
    for s in settings:
        if s.name in HUB_HIDDEN:
            continue
        kind = "huggingface" if s.name in HUB_MODEL_PICKER else _HUB_TYPES[s.type]
        if s.type == "choice" and s.choices and isinstance(s.choices[0], int):
            kind = "number"
        spec: dict = {"name": _title(s.name), "type": kind, "description": s.description}
        default = s.parse(image_env[s.name]) if s.name in image_env else s.default
        if default is not None:
            spec["default"] = default
        if kind == "number" and not s.choices:
            if s.minimum is not None and not s.exclusive_minimum:  # the form's min is inclusive
                spec["min"] = int(s.minimum) if s.type == "int" else s.minimum
            if s.maximum is not None:
                spec["max"] = int(s.maximum) if s.type == "int" else s.maximum
        if kind == "boolean":
            spec["trueValue"], spec["falseValue"] = "true", "false"  # what handler/settings.py parses
        if s.choices:
            unset = [{"label": "unset", "value": ""}] if default is None else []  # empty counts as unset
            spec["options"] = unset + [{"label": str(c), "value": c} for c in s.choices]
        if s.name not in PRIMARY:
            spec["advanced"] = True
        entries.append({"key": s.name, "input": spec})
    return entries + [json.loads(json.dumps(e)) for e in IMAGE_ENV]


# The Hub looks for its Dockerfile in .runpod/ (first) or the root, and builds from the
# repository root: .runpod/Dockerfile is docker/Dockerfile's copy, kept equal by hub-env --write.
HUB_DOCKERFILE = REPO / ".runpod" / "Dockerfile"


def write_hub_env(path: Path = HUB_JSON) -> bool:
    """Refresh hub.json's config.env and the Hub's copy of the Dockerfile; True when either changed."""
    changed = False
    if not HUB_DOCKERFILE.is_file() or HUB_DOCKERFILE.read_bytes() != DOCKERFILE.read_bytes():
        shutil.copyfile(DOCKERFILE, HUB_DOCKERFILE)
        changed = True
    hub = json.loads(path.read_text(encoding="utf-8"))
    env = hub_env()
    if hub["config"].get("env") == env:
        return changed
    hub["config"]["env"] = env
    path.write_text(json.dumps(hub, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return True


# --------------------------------------------------------------------------- #
# Command line
# --------------------------------------------------------------------------- #


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="deployfiles.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("materialize")
    m.add_argument("stage")
    m.add_argument("root", type=Path)
    e = sub.add_parser("env")
    e.add_argument("stage")
    e.add_argument("root", type=Path)
    w = sub.add_parser("wheel-check")
    w.add_argument("wheel", type=Path)
    w.add_argument("src", type=Path)
    h = sub.add_parser("hub-env")
    h.add_argument("--write", action="store_true")
    args = p.parse_args(argv)
    if args.cmd == "materialize":
        for path in materialize(args.stage, args.root):
            print(path)
    elif args.cmd == "env":
        for key, value in stage_env(args.stage, args.root).items():
            print(f"export {key}={shlex.quote(value)}")
    elif args.cmd == "wheel-check":
        missing = missing_from_wheel(args.wheel, args.src)
        if missing:
            print(f"{args.wheel.name} lacks package files the code may open (add them to "
                  f"[tool.setuptools.package-data] in pyproject.toml): {', '.join(missing)}", file=sys.stderr)
            return 1
        print(f"{args.wheel.name}: all {len(package_files(args.src))} package files are in the wheel")
    elif args.cmd == "hub-env":
        if args.write:
            print("hub.json env updated" if write_hub_env() else "hub.json env already current")
        else:
            hub = json.loads(HUB_JSON.read_text(encoding="utf-8"))
            if hub["config"].get("env") != hub_env() or HUB_DOCKERFILE.read_bytes() != DOCKERFILE.read_bytes():
                print("hub.json env is stale: run python docker/deployfiles.py hub-env --write", file=sys.stderr)
                return 1
            print("hub.json env is current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
