"""The lock that lets pytest-xdist's workers share one GPU (tests/gpu/sharing.py): shared
holders overlap, an exclusive one overlaps nobody and is not starved by later arrivals."""
import multiprocessing as mp
import time

from tests.gpu.sharing import gpu_turn


def _hold(folder, job, exclusive, start_after, hold_s, log):
    time.sleep(start_after)
    with gpu_turn(exclusive, folder):
        t_in = time.monotonic()
        time.sleep(hold_s)
        log.put((job, t_in, time.monotonic()))


def test_shared_holders_overlap_and_an_exclusive_one_runs_alone(tmp_path):
    # (exclusive, starts after s, holds for s): two shared from the start, an exclusive one
    # arriving while they hold, a shared one arriving while the exclusive one waits
    jobs = [(False, 0.0, 1.5), (False, 0.0, 1.5), (True, 0.5, 0.5), (False, 0.9, 0.3)]
    ctx = mp.get_context("spawn")
    log = ctx.Queue()
    procs = [ctx.Process(target=_hold, args=(str(tmp_path), i, *job, log)) for i, job in enumerate(jobs)]
    for p in procs:
        p.start()
    spans = {job: (t_in, t_out) for job, t_in, t_out in (log.get(timeout=60) for _ in jobs)}
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0

    def overlap(a, b):
        return spans[a][0] < spans[b][1] and spans[b][0] < spans[a][1]

    assert overlap(0, 1), "shared holders ran one after the other"
    assert not any(overlap(2, other) for other in (0, 1, 3)), spans
    assert spans[3][0] >= spans[2][1], "a later shared holder went ahead of the waiting exclusive one"
