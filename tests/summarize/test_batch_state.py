"""The records `summarize --batch` keeps beside its results: what a rerun finds open after an
interruption, and when the file goes away."""
from __future__ import annotations

from summarize.batch_state import BatchState, state_path


def test_open_batches_are_drafts_and_batches_with_a_child_to_collect(tmp_path):
    path = state_path(str(tmp_path / "r.jsonl"))
    state = BatchState(path, "ep").load()
    state.created("b1")
    state.added("b1", {"c1": "doc-a", "c2": "doc-b"})
    state.finalized("b1")
    state.created("b2")
    state.added("b2", {"c3": "doc-b"})  # a retry of doc-b: c2 is superseded
    state.created("b3")  # a draft, nothing added yet
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"event": "added", "batch": "b3", "chi')  # the process was killed mid-write

    again = BatchState(path, "ep", written={"c1"}).load()
    assert [b.id for b in again.open_batches()] == ["b3", "b2"]  # newest first; b1's children are settled
    assert again.unsettled(again.batches["b2"]) == {"c3": "doc-b"} and not again.batches["b2"].finalized
    assert again.batches["b3"].children == {}  # the torn line is left out

    again.finalized("b2")
    again.dropped("b3")
    assert [b.id for b in again.open_batches()] == ["b2"] and not again.remove_if_done()
    again.written.add("c3")
    assert again.open_batches() == [] and again.remove_if_done() and not tmp_path.joinpath("r.jsonl.batches").exists()


def test_batches_of_another_endpoint_are_left_alone(tmp_path):
    path = state_path(str(tmp_path / "r.jsonl"))
    other = BatchState(path, "ep-old").load()
    other.created("b1")
    other.added("b1", {"c1": "doc-a"})
    other.finalized("b1")
    state = BatchState(path, "ep-new").load()
    assert state.batches == {} and state.elsewhere == ["b1"]
    assert not state.remove_if_done()  # its records stay for a run on that endpoint
