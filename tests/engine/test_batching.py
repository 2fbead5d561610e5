"""The ready queue: uniform batches per batching key, timeouts, retries first (engine/run/batching.py)."""

from __future__ import annotations

from warpdeck.engine.run.batching import ReadyQueue
from warpdeck.engine.state.batches import Batch, BatchKey, TaskInput

KEY_A = BatchKey("array", (4,), "float32")
KEY_B = BatchKey("array", (8,), "float32")
KEY_C = BatchKey("array", (4,), "int16")


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def item(row: int, key: BatchKey = KEY_A) -> TaskInput:
    return TaskInput(f"task-{row}", key, row)


def fill(q: ReadyQueue, rows: range | list[int], key: BatchKey = KEY_A) -> None:
    for r in rows:
        q.put(r, item(r, key))


def rows_of(b: Batch | None) -> list[int]:
    assert b is not None
    return b.idx.tolist()


# -- grouping -------------------------------------------------------------------------------------
def test_batches_never_mix_batching_keys() -> None:
    clock = FakeClock()
    q = ReadyQueue(batch_size=3, timeout_s=1.0, clock=clock)
    keys = [KEY_A, KEY_B, KEY_A, KEY_C, KEY_B, KEY_A, KEY_C, KEY_A, KEY_B]
    for row, key in enumerate(keys):
        q.put(row, item(row, key))
    seen: list[int] = []
    while (b := q.take(flush=True)) is not None:
        assert {t.batch_key for t in b.items} == {b.key}
        assert [keys[r] for r in b.idx.tolist()] == [b.key] * len(b)
        assert [t.handle for t in b.items] == b.idx.tolist()
        seen += b.idx.tolist()
    assert sorted(seen) == list(range(len(keys)))
    assert len(q) == 0


def test_put_many_queues_as_put_does_each_key_in_arrival_order() -> None:
    # Keys equal but not the same object, interleaved: put_many looks a key up again where it changes.
    keys = [KEY_A, KEY_A, KEY_B, BatchKey("array", (4,), "float32"), KEY_C, KEY_B, KEY_A]
    one, many = ReadyQueue(3, 1.0, clock=FakeClock()), ReadyQueue(3, 1.0, clock=FakeClock())
    for row, key in enumerate(keys):
        one.put(row, item(row, key))
    many.put_many(range(len(keys)), [item(row, key) for row, key in enumerate(keys)])
    assert len(many) == len(one) == len(keys) and many.divergence == one.divergence == 3
    while (a := one.take(flush=True)) is not None:
        b = many.take(flush=True)
        assert b is not None and (b.key, rows_of(b)) == (a.key, rows_of(a))
    assert many.take(flush=True) is None and len(many) == 0


def test_full_batch_is_taken_without_waiting_for_the_timeout() -> None:
    q = ReadyQueue(batch_size=4, timeout_s=10.0, clock=FakeClock())
    fill(q, range(3))
    assert q.take() is None
    q.put(3, item(3))
    b = q.take()
    assert rows_of(b) == [0, 1, 2, 3]
    assert b is not None and b.key == KEY_A and not b.retry
    assert len(q) == 0


def test_full_batch_of_a_later_key_goes_before_a_partial_older_key() -> None:
    q = ReadyQueue(batch_size=2, timeout_s=10.0, clock=FakeClock())
    q.put(0, item(0, KEY_A))
    fill(q, [1, 2], KEY_B)
    b = q.take()
    assert b is not None and b.key == KEY_B
    assert rows_of(b) == [1, 2]


def test_full_key_yields_batch_size_tasks_in_arrival_order() -> None:
    q = ReadyQueue(batch_size=3, timeout_s=10.0, clock=FakeClock())
    fill(q, [5, 9, 2, 7, 4])
    assert rows_of(q.take()) == [5, 9, 2]
    assert len(q) == 2


# -- partial batches ------------------------------------------------------------------------------
def test_partial_batch_waits_until_timeout_on_the_clock() -> None:
    clock = FakeClock(50.0)
    q = ReadyQueue(batch_size=8, timeout_s=0.5, clock=clock)
    fill(q, range(3))
    clock.t = 50.49
    assert q.take() is None
    assert len(q) == 3
    clock.t = 50.5
    b = q.take()
    assert rows_of(b) == [0, 1, 2]
    assert b is not None and b.formed_at == 50.5


def test_partial_timeout_counts_from_the_oldest_task_of_the_key() -> None:
    clock = FakeClock(0.0)
    q = ReadyQueue(batch_size=8, timeout_s=1.0, clock=clock)
    q.put(0, item(0))
    clock.t = 0.9
    q.put(1, item(1))
    clock.t = 1.0
    assert rows_of(q.take()) == [0, 1]


def test_flush_sends_a_partial_batch_at_once() -> None:
    q = ReadyQueue(batch_size=8, timeout_s=100.0, clock=FakeClock())
    fill(q, range(2))
    assert q.take() is None
    assert rows_of(q.take(flush=True)) == [0, 1]
    assert q.take(flush=True) is None


def test_next_due_is_the_oldest_partial_plus_timeout() -> None:
    clock = FakeClock(10.0)
    q = ReadyQueue(batch_size=8, timeout_s=0.25, clock=clock)
    assert q.next_due() is None
    q.put(0, item(0, KEY_A))
    clock.t = 11.0
    q.put(1, item(1, KEY_B))
    assert q.next_due() == 10.25


# -- divergence -----------------------------------------------------------------------------------
def test_divergence_counts_distinct_keys_waiting() -> None:
    q = ReadyQueue(batch_size=4, timeout_s=1.0, clock=FakeClock())
    assert q.divergence == 0
    fill(q, [0, 1], KEY_A)
    assert q.divergence == 1
    fill(q, [2], KEY_B)
    fill(q, [3, 4], KEY_C)
    fill(q, [5], KEY_A)
    assert q.divergence == 3


def test_batch_records_divergence_and_max_divergence_is_kept() -> None:
    q = ReadyQueue(batch_size=2, timeout_s=1.0, clock=FakeClock())
    fill(q, [0, 1], KEY_A)
    fill(q, [2], KEY_B)
    fill(q, [3], KEY_C)
    b = q.take()
    assert b is not None and b.divergence == 3
    assert q.divergence == 2
    q.take(flush=True)
    q.take(flush=True)
    assert q.divergence == 0
    assert q.max_divergence == 3


def test_divergence_counts_retried_keys_as_distinct_keys() -> None:
    q = ReadyQueue(batch_size=4, timeout_s=1.0, clock=FakeClock())
    fill(q, [0], KEY_A)
    q.put_retry(1, item(1, KEY_A), isolate=False)
    assert q.divergence == 1
    q.put_retry(2, item(2, KEY_B), isolate=False)
    q.put_retry(3, item(3, KEY_C), isolate=False)
    assert q.divergence == 3


# -- retries ----------------------------------------------------------------------------------------
def test_retries_come_out_before_full_normal_batches() -> None:
    q = ReadyQueue(batch_size=2, timeout_s=1.0, clock=FakeClock())
    fill(q, [0, 1, 2, 3])
    q.put_retry(9, item(9), isolate=False)
    b = q.take()
    assert rows_of(b) == [9]
    assert b is not None and b.retry
    assert rows_of(q.take()) == [0, 1]


def test_non_isolated_retries_of_one_key_share_a_batch() -> None:
    q = ReadyQueue(batch_size=3, timeout_s=1.0, clock=FakeClock())
    for r in (10, 11, 12, 13):
        q.put_retry(r, item(r), isolate=False)
    assert rows_of(q.take()) == [10, 11, 12]
    assert rows_of(q.take()) == [13]


def test_non_isolated_retries_of_different_keys_stay_apart() -> None:
    q = ReadyQueue(batch_size=4, timeout_s=1.0, clock=FakeClock())
    q.put_retry(1, item(1, KEY_A), isolate=False)
    q.put_retry(2, item(2, KEY_B), isolate=False)
    q.put_retry(3, item(3, KEY_A), isolate=False)
    batches = [q.take() for _ in range(3)]
    assert [rows_of(b) for b in batches] == [[1], [2], [3]]
    assert [b.key for b in batches if b is not None] == [KEY_A, KEY_B, KEY_A]


def test_isolated_retries_come_out_one_per_batch() -> None:
    q = ReadyQueue(batch_size=4, timeout_s=1.0, clock=FakeClock())
    for r in (4, 5, 6):
        q.put_retry(r, item(r), isolate=True)
    assert [rows_of(q.take()) for _ in range(3)] == [[4], [5], [6]]
    assert len(q) == 0
    assert q.take(flush=True) is None


def test_retries_are_due_immediately() -> None:
    clock = FakeClock(3.0)
    q = ReadyQueue(batch_size=8, timeout_s=60.0, clock=clock)
    q.put(0, item(0))
    q.put_retry(1, item(1), isolate=True)
    assert q.next_due() == 3.0


# -- removal and length ---------------------------------------------------------------------------
def test_remove_drops_rows_from_retries_and_groups_and_keeps_len_right() -> None:
    q = ReadyQueue(batch_size=4, timeout_s=1.0, clock=FakeClock())
    fill(q, [0, 1, 2], KEY_A)
    fill(q, [3], KEY_B)
    q.put_retry(7, item(7), isolate=False)
    q.put_retry(8, item(8), isolate=True)
    assert len(q) == 6
    assert q.remove([1, 3, 8, 99]) == 3
    assert len(q) == 3
    assert sorted(q.pending()) == [0, 2, 7]
    assert q.divergence == 1  # KEY_B is gone; the waiting retry (row 7) shares KEY_A
    assert rows_of(q.take()) == [7]
    assert rows_of(q.take(flush=True)) == [0, 2]
    assert q.take(flush=True) is None


def test_pending_lists_retries_first() -> None:
    q = ReadyQueue(batch_size=4, timeout_s=1.0, clock=FakeClock())
    fill(q, [0, 1])
    q.put_retry(5, item(5), isolate=True)
    assert q.pending() == [5, 0, 1]


def test_len_counts_puts_minus_takes() -> None:
    q = ReadyQueue(batch_size=2, timeout_s=1.0, clock=FakeClock())
    fill(q, range(5))
    q.put_retry(9, item(9), isolate=True)
    assert len(q) == 6
    q.take()
    assert len(q) == 5
    q.take()
    assert len(q) == 3


# -- fairness -------------------------------------------------------------------------------------
def test_two_full_keys_alternate_round_robin() -> None:
    q = ReadyQueue(batch_size=2, timeout_s=1.0, clock=FakeClock())
    fill(q, range(6), KEY_A)
    fill(q, range(10, 16), KEY_B)
    batches = [q.take() for _ in range(6)]
    assert [b.key for b in batches if b is not None] == [KEY_A, KEY_B] * 3
    assert [rows_of(b) for b in batches] == [[0, 1], [10, 11], [2, 3], [12, 13], [4, 5], [14, 15]]


def test_batch_ids_are_unique_and_increasing() -> None:
    q = ReadyQueue(batch_size=1, timeout_s=1.0, clock=FakeClock())
    fill(q, range(3))
    q.put_retry(7, item(7), isolate=True)
    ids = [b.id for b in (q.take() for _ in range(4)) if b is not None]
    assert ids == sorted(set(ids))
    assert len(ids) == 4
