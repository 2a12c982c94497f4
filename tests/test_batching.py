"""CallBatcher: calls made together share batches; each caller gets its own answer."""

from __future__ import annotations

import asyncio
import threading

import pytest

from anarchon_core.batching import CallBatcher


class Recorder:
    """A ``send_many`` that records its batches and answers ``item * 10`` (or an error)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.batches: list[list[int]] = []
        self.delay = delay
        self.in_flight = 0
        self.most_in_flight = 0

    async def __call__(self, items: list[int]) -> list[int | BaseException]:
        self.batches.append(list(items))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
        finally:
            self.in_flight -= 1
        return [ValueError(f"bad {i}") if i < 0 else i * 10 for i in items]


async def test_calls_of_one_moment_share_a_batch_and_keep_their_own_answers() -> None:
    send = Recorder()
    batcher: CallBatcher[int, int] = CallBatcher(send, max_batch=100)
    results = await asyncio.gather(*(batcher.call(i) for i in range(50)))
    assert results == [i * 10 for i in range(50)]
    assert send.batches == [list(range(50))]
    assert (batcher.batches, batcher.calls) == (1, 50)


async def test_a_lone_call_goes_out_at_once_in_a_batch_of_its_own() -> None:
    send = Recorder()
    batcher: CallBatcher[int, int] = CallBatcher(send)
    assert await batcher.call(7) == 70
    assert await batcher.call(8) == 80
    assert send.batches == [[7], [8]]


async def test_batches_are_capped_and_so_are_batches_in_flight() -> None:
    send = Recorder(delay=0.02)
    batcher: CallBatcher[int, int] = CallBatcher(send, max_batch=10, max_in_flight=2)
    results = await asyncio.gather(*(batcher.call(i) for i in range(95)))
    assert results == [i * 10 for i in range(95)]
    assert all(len(b) <= 10 for b in send.batches)
    assert sorted(i for b in send.batches for i in b) == list(range(95))
    assert send.most_in_flight == 2
    assert len(send.batches) == 10


async def test_calls_arriving_while_a_batch_is_in_flight_wait_and_go_together() -> None:
    send = Recorder(delay=0.05)
    batcher: CallBatcher[int, int] = CallBatcher(send, max_in_flight=1)
    first = asyncio.ensure_future(batcher.call(0))
    await asyncio.sleep(0.01)  # the first batch is in flight now
    later = [asyncio.ensure_future(batcher.call(i)) for i in range(1, 6)]
    await asyncio.sleep(0.01)
    later += [asyncio.ensure_future(batcher.call(i)) for i in range(6, 9)]
    assert await first == 0
    assert await asyncio.gather(*later) == [i * 10 for i in range(1, 9)]
    assert send.batches == [[0], list(range(1, 9))]


async def test_an_item_error_reaches_only_its_caller() -> None:
    batcher: CallBatcher[int, int] = CallBatcher(Recorder())
    results = await asyncio.gather(batcher.call(1), batcher.call(-2), batcher.call(3),
                                   return_exceptions=True)
    assert results[0] == 10
    assert results[2] == 30
    assert isinstance(results[1], ValueError)
    assert str(results[1]) == "bad -2"


async def test_a_failed_batch_fails_each_of_its_callers_and_the_next_batch_goes_on() -> None:
    calls = 0

    async def send(items: list[int]) -> list[int]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("store down")
        return items

    batcher: CallBatcher[int, int] = CallBatcher(send)
    results = await asyncio.gather(batcher.call(1), batcher.call(2), return_exceptions=True)
    assert [type(r) for r in results] == [ConnectionError, ConnectionError]
    assert await batcher.call(3) == 3


async def test_a_wrong_number_of_answers_is_an_error_for_every_caller() -> None:
    async def send(items: list[int]) -> list[int]:
        return items[:1]

    batcher: CallBatcher[int, int] = CallBatcher(send)
    results = await asyncio.gather(batcher.call(1), batcher.call(2), return_exceptions=True)
    assert all(isinstance(r, RuntimeError) and "got 1 answers" in str(r) for r in results)


async def test_a_caller_that_gave_up_before_the_send_is_not_sent() -> None:
    send = Recorder(delay=0.05)
    batcher: CallBatcher[int, int] = CallBatcher(send, max_in_flight=1)
    first = asyncio.ensure_future(batcher.call(1))
    await asyncio.sleep(0.01)
    gone = asyncio.ensure_future(batcher.call(2))
    kept = asyncio.ensure_future(batcher.call(3))
    await asyncio.sleep(0)
    gone.cancel()
    assert await first == 10
    assert await kept == 30
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert send.batches == [[1], [3]]


def test_each_event_loop_has_its_own_queue() -> None:
    send = Recorder()
    batcher: CallBatcher[int, int] = CallBatcher(send)
    out: dict[str, list[int]] = {}

    def run(name: str, base: int) -> None:
        async def main() -> list[int]:
            return list(await asyncio.gather(*(batcher.call(base + i) for i in range(3))))
        out[name] = asyncio.run(main())

    threads = [threading.Thread(target=run, args=(n, b)) for n, b in (("a", 0), ("b", 100))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert out == {"a": [0, 10, 20], "b": [1000, 1010, 1020]}
    assert sorted(map(sorted, send.batches)) == [[0, 1, 2], [100, 101, 102]]


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        CallBatcher(Recorder(), max_batch=0)
    with pytest.raises(ValueError, match="at least 1"):
        CallBatcher(Recorder(), max_in_flight=0)
