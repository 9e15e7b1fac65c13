"""benchmarks/record.py's commit label: BENCHMARK_COMMIT names the tree when set (a GPU machine's
copy may carry another commit's git metadata), else the checkout's own short commit."""
import subprocess

from benchmarks import record


def test_benchmark_commit_names_the_tree_over_git(monkeypatch):
    monkeypatch.setenv("BENCHMARK_COMMIT", "abc1234")
    assert record.commit() == "abc1234"
    assert record.stamp([{"id": "X", "case": "c"}])[0]["commit"] == "abc1234"


def test_without_it_the_checkouts_commit(monkeypatch):
    monkeypatch.delenv("BENCHMARK_COMMIT", raising=False)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=record.ROOT, capture_output=True, text=True)
    got = record.commit()
    if head.returncode:  # a copy without git
        assert got is None
    else:
        assert got.split("+")[0] == head.stdout.strip() and got in (head.stdout.strip(), head.stdout.strip() + "+changes")
