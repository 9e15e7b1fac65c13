"""What structured output needs on a GPU machine whose Python lacks it (benchmarks/structured.py,
the structured GPU tests), put under .whl/structured/ (git-ignored through /.whl/), about 12 MB:

  site/               llguidance, unpacked (an abi3 build: one wheel serves CPython 3.9 and
                      later, so the device's 3.12 too; manylinux_2_31 x86_64, no dependencies),
                      and the --extra packages for CPython 3.12 (jsonschema for the GPU tests)
  smollm2-tokenizer/  the embedded default model's tokenizer (49,152 tokens), so the E1
                      run masks a real vocabulary rather than the test tokenizer's 400

    python benchmarks/tools/structured_vendor.py               # llguidance from this venv's copy
    python benchmarks/tools/structured_vendor.py --wheel PATH  # or from a wheel file
    python benchmarks/tools/structured_vendor.py --download    # or: pip download (PyPI), for 3.12
    python benchmarks/tools/structured_vendor.py --extra jsonschema   # and jsonschema with its dependencies

Then carry ".whl/structured" to the device: benchmarks/structured.py puts its site/ on sys.path
when it is there and uses the tokenizer on CUDA; benchmarks/gpu_run.sh puts it on PYTHONPATH.
"""
from __future__ import annotations

import argparse
import glob
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
DEST = os.path.join(ROOT, ".whl", "structured")


def from_installed(site: str) -> str:
    spec = importlib.util.find_spec("llguidance")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llguidance is not installed here: use --wheel or --download")
    pkg = spec.submodule_search_locations[0]
    if not glob.glob(os.path.join(pkg, "*.abi3.so")):
        raise SystemExit(f"{pkg} has no abi3 extension: use --download for the device's Python")
    shutil.copytree(pkg, os.path.join(site, "llguidance"), ignore=shutil.ignore_patterns("__pycache__"))
    dist = importlib.metadata.distribution("llguidance")
    info = os.path.join(os.path.dirname(pkg), f"llguidance-{dist.version}.dist-info")
    if os.path.isdir(info):
        shutil.copytree(info, os.path.join(site, os.path.basename(info)))
    return f"llguidance {dist.version} copied from {pkg}"


def from_wheel(site: str, wheel: str) -> str:
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    return f"{os.path.basename(wheel)} unpacked"


def download(site: str, version: str | None) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        spec = f"llguidance=={version}" if version else "llguidance"
        subprocess.run([sys.executable, "-m", "pip", "download", spec, "--no-deps", "--only-binary", ":all:",
                        "--python-version", "3.12", "--platform", "manylinux_2_31_x86_64", "-d", tmp], check=True)
        wheel = glob.glob(os.path.join(tmp, "llguidance-*.whl"))[0]
        return from_wheel(site, wheel)


def extras(site: str, packages: list[str]) -> str:
    """pip download packages and their dependencies as CPython 3.12 manylinux wheels, unpacked into site."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", *packages, "--only-binary", ":all:",
                        "--python-version", "3.12", "--platform", "manylinux_2_31_x86_64",
                        "--platform", "manylinux2014_x86_64", "-d", tmp], check=True)
        wheels = sorted(glob.glob(os.path.join(tmp, "*.whl")))
        for wheel in wheels:
            from_wheel(site, wheel)
        return ", ".join(os.path.basename(w) for w in wheels)


def tokenizer(dest: str) -> str:
    from benchmarks.structured_backends import load_tokenizer

    tok, what = load_tokenizer("default")
    tok.save_pretrained(dest)
    return f"{what}, {len(tok)} tokens"


def size_mb(path: str) -> float:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs) / 2**20


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--wheel", help="an llguidance wheel to unpack")
    src.add_argument("--download", action="store_true", help="pip download llguidance for CPython 3.12")
    ap.add_argument("--version", help="with --download: the llguidance version (default: this venv's)")
    ap.add_argument("--extra", nargs="+", default=[], metavar="PKG",
                    help="also these packages with their dependencies, downloaded for CPython 3.12 (jsonschema)")
    ap.add_argument("--no-tokenizer", action="store_true")
    args = ap.parse_args()
    site = os.path.join(DEST, "site")
    shutil.rmtree(site, ignore_errors=True)
    os.makedirs(site)
    if args.wheel:
        what = from_wheel(site, args.wheel)
    elif args.download:
        version = args.version
        if version is None:
            try:
                version = importlib.metadata.version("llguidance")
            except importlib.metadata.PackageNotFoundError:
                pass
        what = download(site, version)
    else:
        what = from_installed(site)
    if args.extra:
        what += "; " + extras(site, args.extra)
    print(f"{site}: {what} ({size_mb(site):.1f} MB)")
    if not args.no_tokenizer:
        dest = os.path.join(DEST, "smollm2-tokenizer")
        shutil.rmtree(dest, ignore_errors=True)
        print(f"{dest}: {tokenizer(dest)} ({size_mb(dest):.1f} MB)")
    print(f"carry: .whl/structured ({size_mb(DEST):.1f} MB in all)")


if __name__ == "__main__":
    main()
