"""The code's shape (DESIGN.md, "Layers"): imports only run summarize -> handler -> engine ->
llm_kernels (the summarize client above the worker, which never imports it), no import cycle,
nothing private imported across files, short files and functions, every module saying its role."""
from __future__ import annotations

import ast
import importlib.metadata
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("summarize", "handler", "engine", "llm_kernels")
SOURCE_DIRS = PACKAGES + ("benchmarks", "docker", "scripts", "tests")
MAX_FILE_LINES = 450
MAX_FUNCTION_LINES = 80
# each package and what it may import of ours; nothing may import summarize (the client)
LAYERS = {"llm_kernels": set(), "engine": {"llm_kernels"}, "handler": {"engine", "llm_kernels"},
          "summarize": {"handler", "engine", "llm_kernels"}}
RUNPOD_USERS = ("handler", "summarize")  # the worker's loop and the client's endpoint mode


def source_files(dirs=SOURCE_DIRS) -> list[Path]:
    out = []
    for d in dirs:
        for dirpath, dirnames, filenames in os.walk(ROOT / d):
            dirnames[:] = [n for n in dirnames if not n.startswith(".") and n != "__pycache__"]
            out += [Path(dirpath) / f for f in filenames if f.endswith(".py")]
    return sorted(out)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(module imported, names taken from it, line) for every import in the file, at any depth."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    here = module_name(path)
    package = here if is_package(path) else here.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            out.append((base, [a.name for a in node.names], node.lineno))
    return out


def our_modules() -> dict[str, Path]:
    return {module_name(p): p for p in source_files(PACKAGES)}


def resolve(target: str, names: list[str], modules: dict[str, Path]) -> list[str]:
    """Our modules an import statement loads: the module, or its submodules named in a from-import."""
    found = [f"{target}.{n}" for n in names if f"{target}.{n}" in modules]
    if target in modules:
        found.append(target)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = our_modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        for target, names, _ in imports(path):
            graph[mod].update(t for t in resolve(target, names, modules) if t != mod)
    return graph


def test_imports_only_run_down_the_layers():
    bad = []
    for path in source_files(PACKAGES):
        layer = module_name(path).split(".")[0]
        for target, _, line in imports(path):
            top = target.split(".")[0]
            if top in LAYERS and top != layer and top not in LAYERS[layer]:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
            if layer not in RUNPOD_USERS and top == "runpod":
                bad.append(f"{path.relative_to(ROOT)}:{line} imports runpod")
    assert not bad, bad


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_between_modules_or_subpackages():
    graph = import_graph()
    # a package's __init__ re-exporting its modules is not a cycle of concepts
    modules = {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in graph.items()}
    assert not _cycles(modules), _cycles(modules)
    packages: dict[str, set[str]] = {}
    for m, ts in modules.items():
        pm = m.rpartition(".")[0] if m in our_modules() and not is_package(our_modules()[m]) else m
        for t in ts:
            pt = t.rpartition(".")[0] if not is_package(our_modules()[t]) else t
            if pm != pt and not pm.startswith(pt + ".") and not pt.startswith(pm + "."):
                packages.setdefault(pm, set()).add(pt)
    assert not _cycles(packages), _cycles(packages)


def test_nothing_private_is_imported_across_files():
    modules = our_modules()
    bad = []
    for path in source_files():
        for target, names, line in imports(path):
            if target.split(".")[0] not in PACKAGES:
                continue
            where = f"{path.relative_to(ROOT)}:{line}"
            if any(part.startswith("_") and part != "__main__" for part in target.split(".")):
                bad.append(f"{where} imports the private module {target}")
            bad += [f"{where} imports the private name {target}.{n}" for n in names
                    if n.startswith("_") and not n.startswith("__") and f"{target}.{n}" not in modules]
    assert not bad, bad


def test_files_are_short():
    long = [f"{p.relative_to(ROOT)}: {n}" for p in source_files()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_FILE_LINES]
    assert not long, long


def _is_triton_kernel(node) -> bool:
    """A `@triton.jit` function (jitted at its definition or lazily): it reads its program id
    or takes constexpr parameters."""
    if any("jit" in ast.unparse(d).split("(")[0].split(".")[-1] for d in node.decorator_list):
        return True
    args = node.args.args + node.args.kwonlyargs
    if any(a.annotation is not None and ast.unparse(a.annotation).endswith("constexpr") for a in args):
        return True
    return any(isinstance(n, ast.Attribute) and n.attr == "program_id" for n in ast.walk(node))


def test_functions_are_short_outside_kernels_and_tests():
    long = []
    for path in source_files(PACKAGES + ("benchmarks", "docker", "scripts")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not _is_triton_kernel(node):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {n} lines")
    assert not long, long


def test_no_script_folder_shadows_an_installed_package():
    """`python benchmarks/x.py` puts benchmarks/ first on sys.path, so a module there named like an
    installed package replaces it for everything the script imports (benchmarks/kernels.py hid
    Hugging Face's `kernels`, which transformers >= 5.25 imports: cpu.py and the structured
    scripts failed at `import transformers`)."""
    installed = set(importlib.metadata.packages_distributions())
    clash = [f"{d}/{p.name}" for d in ("benchmarks", "scripts", "docker", "tests")
             for p in (ROOT / d).glob("*.py") if p.stem in installed]
    assert not clash, clash


@pytest.mark.parametrize("package", PACKAGES)
def test_every_module_says_its_role(package):
    silent = [str(p.relative_to(ROOT)) for p in source_files((package,))
              if p.read_text(encoding="utf-8").strip() and ast.get_docstring(ast.parse(p.read_text())) is None]
    assert not silent, silent


def test_the_checks_see_what_they_check(tmp_path):
    """The checkers find a cycle, a private import and a long function when there is one."""
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert not _cycles({"a": {"b"}, "b": set()})
    f = tmp_path / "m.py"
    f.write_text("def f():\n" + "    x = 1\n" * 90 + "from llm_kernels._dispatch import y\n")
    tree = ast.parse(f.read_text())
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef))
    assert fn.end_lineno - fn.lineno + 1 > MAX_FUNCTION_LINES
    imp = next(n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom))
    assert any(part.startswith("_") for part in imp.module.split("."))
