"""ReplaySnapshot: a buffer's state as of one instant, read out in chunks while inserts go on."""

import threading

import numpy as np
import pytest
import torch

from actorlearner.replay import PrioritizedReplay, SnapshotColumn, make_replay

FIELDS = {
    "obs": ((3,), torch.float32),
    "action": ((), torch.int64),
    "frame": ((2, 5), torch.uint8),
}


def batch(start: int, n: int) -> dict[str, torch.Tensor]:
    """Items whose every field encodes its insertion number."""
    ids = torch.arange(start, start + n)
    return {"obs": ids[:, None].float().repeat(1, 3) + torch.tensor([0.0, 0.25, 0.5]),
            "action": ids, "frame": (ids % 251).to(torch.uint8)[:, None, None].repeat(1, 2, 5)}


def filled(replay_path: dict, capacity: int, inserted: int) -> PrioritizedReplay:
    """A buffer with ``inserted`` items of varied priorities and versions, sampled from a little."""
    buf = make_replay(capacity, FIELDS, **replay_path)
    for start in range(0, inserted, 7):
        n = min(7, inserted - start)
        buf.add(batch(start, n), priorities=np.linspace(0.1, 3.0, n) + start, policy_version=start // 10)
    if inserted:
        buf.sample(min(4, inserted))
    return buf


def read_all(state: dict) -> dict:
    """A snapshot's state with every column read out through its chunks."""
    out = {}
    for key, value in state.items():
        if isinstance(value, SnapshotColumn):
            chunks = [c.cpu() for c in value.chunks()]
            out[key] = torch.cat(chunks) if chunks else torch.empty(value.shape, dtype=value.dtype)
        else:
            out[key] = value.cpu() if isinstance(value, torch.Tensor) else value
    return out


def assert_states_equal(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            assert got[key].dtype == value.dtype and got[key].shape == value.shape, key
            assert torch.equal(got[key], value), key
        else:
            assert got[key] == value, key


@pytest.mark.parametrize("inserted", [0, 13, 40, 95])  # empty, partly filled, full, full and wrapped
@pytest.mark.parametrize("chunk_bytes", [1, 64, 4 << 20])  # one row per chunk and per block, a few, one
def test_a_snapshot_reads_out_its_instant_however_much_is_inserted_meanwhile(replay_path, inserted, chunk_bytes):
    buf = filled(replay_path, 40, inserted)
    want = buf.state_dict()
    snapshot = buf.snapshot(chunk_bytes=chunk_bytes)
    state = snapshot.state()
    columns = {key: value.chunks() for key, value in state.items() if isinstance(value, SnapshotColumn)}
    got = {key: value for key, value in state.items() if key not in columns}
    got_chunks: dict[str, list] = {key: [] for key in columns}
    start = 1000
    for round_ in range(60):  # interleave: inserts of every size (past the capacity too), then one chunk each
        n = [1, 5, 17, 3, 90][round_ % 5]
        buf.add(batch(start, n), priorities=np.full(n, 0.5 + round_), policy_version=100 + round_)
        start += n
        if round_ % 3 == 2:  # priorities change too: the snapshot keeps its own
            sample = buf.sample(8)
            buf.update_priorities(sample.indices, torch.full((8,), 9.0))
        for key, chunks in columns.items():
            chunk = next(chunks, None)
            if chunk is not None:
                got_chunks[key].append(chunk.cpu())
    for key, chunks in columns.items():
        got_chunks[key].extend(c.cpu() for c in chunks)
        got[key] = torch.cat(got_chunks[key]) if got_chunks[key] else torch.empty(state[key].shape, dtype=state[key].dtype)
    snapshot.close()
    got = read_all(got)
    assert_states_equal(got, want)
    assert buf.inserted == inserted + start - 1000  # the inserts themselves went in
    with buf.snapshot() as fresh:
        assert_states_equal(read_all(fresh.state()), buf.state_dict())


def test_reading_between_single_inserts_sees_no_later_row(replay_path):
    """Each slot overwritten right before its chunk is read: every chunk must come from the copies set aside."""
    buf = filled(replay_path, 16, 16)
    want = buf.state_dict()
    with buf.snapshot(chunk_bytes=1) as snapshot:
        column = snapshot.state()["field.action"]
        rows = []
        for chunk in column.chunks():
            buf.add(batch(500 + len(rows), 1))
            rows.append(chunk.cpu())
        assert torch.equal(torch.cat(rows), want["field.action"])


def test_a_closed_snapshot_cannot_be_read_and_the_buffer_goes_on(replay_path):
    buf = filled(replay_path, 10, 10)
    snapshot = buf.snapshot()
    keys = snapshot.state()["keys"]
    snapshot.close()
    snapshot.close()  # closing twice is harmless
    buf.add(batch(100, 25))
    with pytest.raises(RuntimeError, match="closed"):
        next(keys.chunks())
    assert sorted(buf.state_dict()["keys"].tolist()) == list(range(25, 35))


def test_loading_a_state_while_a_snapshot_is_open_is_refused():
    buf = filled({"device": "cpu"}, 10, 5)
    state = buf.state_dict()
    with buf.snapshot(), pytest.raises(RuntimeError, match="snapshot"):
        buf.load_state_dict(state)
    buf.load_state_dict(state)


def test_two_open_snapshots_each_keep_their_own_instant():
    buf = filled({"device": "cpu"}, 12, 30)
    first_want = buf.state_dict()
    first = buf.snapshot(chunk_bytes=40)
    buf.add(batch(200, 5))
    second_want = buf.state_dict()
    second = buf.snapshot(chunk_bytes=8)
    buf.add(batch(300, 20))
    assert_states_equal(read_all(second.state()), second_want)
    assert_states_equal(read_all(first.state()), first_want)
    first.close()
    second.close()


def test_reads_racing_with_inserts_from_another_thread_see_the_instant():
    """Rows are copied without the lock while another thread overwrites them under it."""
    fields = {"frame": ((64, 64), torch.uint8), "action": ((), torch.int64)}
    buf = make_replay(2048, fields)
    ids = torch.arange(16)
    wide = {"frame": torch.zeros(16, 64, 64, dtype=torch.uint8), "action": ids}
    for start in range(0, 2048 + 1000, 16):
        buf.add({"frame": wide["frame"] + start % 251, "action": ids + start})
    lock, stop = threading.Lock(), threading.Event()

    def insert_forever() -> None:
        start = 10_000
        while not stop.is_set():
            with lock:
                buf.add({"frame": wide["frame"] + start % 251, "action": ids + start})
            start += 16

    inserter = threading.Thread(target=insert_forever, daemon=True)
    try:
        for _ in range(5):
            with lock:
                want = buf.state_dict()
                snapshot = buf.snapshot(lock)  # one 8 MB chunk per column: inserts land during its copy
            if not inserter.is_alive():
                inserter.start()
            with snapshot:
                got = read_all(snapshot.state())
            assert_states_equal(got, want)
    finally:
        stop.set()
        inserter.join()
