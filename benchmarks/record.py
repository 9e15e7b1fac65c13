"""The result files of the benchmarks: one per script, benchmarks/results/<script>.json, holding
the latest run of each case. A row is {id, case, ratio_to_floor, target_floor, ratio_to_peer,
target_peer} plus where it was measured (commit, date, device, command) and the script's own
figures; a run replaces the rows of the cases it ran and keeps the others."""
from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
FIELDS = ("id", "case", "ratio_to_floor", "target_floor", "ratio_to_peer", "target_peer")


def default_out(script: str) -> str:
    """benchmarks/results/<script's name>.json"""
    return os.path.join(RESULTS, os.path.splitext(os.path.basename(script))[0] + ".json")


def commit() -> str | None:
    """BENCHMARK_COMMIT when set: it names the tree a copy holds (a GPU machine's copy may carry
    git metadata of another commit, or none). Otherwise the checkout's short commit, "+changes"
    when tracked files outside the results differ from it."""
    if os.environ.get("BENCHMARK_COMMIT"):
        return os.environ["BENCHMARK_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=10)
        if head.returncode == 0:
            changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                      ":(exclude)benchmarks/results"], cwd=ROOT, capture_output=True, text=True,
                                     timeout=30).stdout.strip()
            return head.stdout.strip() + ("+changes" if changed else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return None


def device() -> str:
    """The GPU's name, or the CPU's model and core count."""
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name()
    except ImportError:
        pass
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), model)
    except OSError:
        pass
    return f"{model} ({os.cpu_count()} cores)"


def command() -> str:
    """This process's command line, the script relative to the repository, without --out
    (where the rows went is not part of what was measured)."""
    script = os.path.relpath(os.path.abspath(sys.argv[0]), ROOT)
    args, skip = [], False
    for a in sys.argv[1:]:
        if skip:
            skip = False
        elif a == "--out":
            skip = True
        elif not a.startswith("--out="):
            args.append(a)
    return shlex.join(["python3", script, *args])


def stamp(rows: list[dict], where: str | None = None) -> list[dict]:
    """Each row in the result form: the six fields first, then commit, date, device, command,
    then the row's other figures."""
    run = {"commit": commit(), "date": datetime.date.today().isoformat(), "device": where or device(),
           "command": command()}
    out = []
    for r in rows:
        missing = [k for k in ("id", "case") if k not in r]
        assert not missing, f"a result row needs {missing}: {r}"
        head = {k: r.get(k) for k in FIELDS}
        out.append({**head, **{k: r.get(k, v) for k, v in run.items()},
                    **{k: v for k, v in r.items() if k not in head and k not in run}})
    return out


def merge(old: list[dict], new: list[dict]) -> list[dict]:
    """old with each row of a case in new replaced in place; new cases appended."""
    fresh = {(r["id"], r["case"]): r for r in new}
    kept = [fresh.pop((r["id"], r["case"]), r) for r in old]
    return kept + [r for r in new if (r["id"], r["case"]) in fresh]


def save(rows: list[dict], out: str, where: str | None = None) -> str:
    """Stamp rows and merge them into the result file `out` (created if absent)."""
    old = []
    if os.path.exists(out):
        with open(out, encoding="utf-8") as f:
            old = json.load(f).get("rows", [])
    rows = merge(old, stamp(rows, where))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"rows": rows}, f, indent=1, ensure_ascii=False)
        f.write("\n")
    os.replace(tmp, out)
    return out


def fmt(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def verdict(r: dict) -> str:
    """ok when every target the row sets is met; WRONG when its output was off."""
    if r.get("wrong"):
        return "WRONG"
    ok = True
    for ratio, target in (("ratio_to_floor", "target_floor"), ("ratio_to_peer", "target_peer")):
        if r.get(target) is not None:
            ok &= r.get(ratio) is not None and r[ratio] >= r[target]
    return "ok" if ok else "MISS"


def table(rows: list[dict], width: int = 44) -> str:
    """The rows as a short text table (ratios and their targets)."""
    lines = [f"{'id':10} {'case':{width}} {'floor':>6} {'tgt':>5} {'peer':>7} {'tgt':>5}  verdict"]
    for r in rows:
        lines.append(f"{r['id']:10} {r['case'][:width]:{width}} {fmt(r['ratio_to_floor']):>6} "
                     f"{fmt(r['target_floor']):>5} {fmt(r['ratio_to_peer']):>7} {fmt(r['target_peer']):>5}  "
                     f"{verdict(r)}")
    return "\n".join(lines)
