"""The SFTP channel's incoming buffer: what is fed comes out in order, in reads of any size, and
reads wait, time out and end as paramiko's BufferedPipe's do."""

from __future__ import annotations

import os
import threading
import time

import pytest
from paramiko.buffered_pipe import PipeTimeout

from core.transport.chunk_pipe import ChunkPipe


def test_reads_of_any_size_give_back_the_fed_bytes_in_order() -> None:
    pipe = ChunkPipe()
    fed = [os.urandom(n) for n in (1, 4, 32768, 5, 100_000, 3)]
    for chunk in fed:
        pipe.feed(chunk)
    whole = b"".join(fed)
    assert len(pipe) == len(whole)

    got = bytearray()
    for size in (4, 1, 3, 32770, 1, 70_000, 10**6):
        got += pipe.read(size)
    assert bytes(got) == whole
    assert len(pipe) == 0
    assert not pipe.read_ready()


def test_a_read_takes_no_more_than_asked_and_leaves_the_rest_of_a_chunk() -> None:
    pipe = ChunkPipe()
    pipe.feed(b"abcdef")
    pipe.feed(b"ghij")

    assert pipe.read(2) == b"ab"
    assert pipe.read(6) == b"cdefgh"
    assert len(pipe) == 2
    assert pipe.read(100) == b"ij"


def test_a_read_waits_for_the_feeding_thread() -> None:
    pipe = ChunkPipe()
    feeder = threading.Timer(0.1, pipe.feed, args=(b"late",))
    feeder.start()
    started = time.monotonic()

    assert pipe.read(10, timeout=5) == b"late"
    assert time.monotonic() - started >= 0.09
    feeder.join()


def test_a_read_times_out_and_a_closed_empty_pipe_reads_as_the_end() -> None:
    pipe = ChunkPipe()
    with pytest.raises(PipeTimeout):
        pipe.read(1, timeout=0.05)
    with pytest.raises(PipeTimeout):
        pipe.read(1, timeout=0.0)

    pipe.feed(b"last")
    pipe.close()
    assert pipe.read(10) == b"last"
    assert pipe.read(10) == b""


def test_close_wakes_a_waiting_reader_and_the_event_follows_what_is_held() -> None:
    pipe = ChunkPipe()
    event = threading.Event()
    pipe.set_event(event)
    assert not event.is_set()
    pipe.feed(b"x")
    assert event.is_set()
    assert pipe.empty() == b"x"
    assert not event.is_set()

    closer = threading.Timer(0.05, pipe.close)
    closer.start()
    assert pipe.read(1, timeout=5) == b""
    assert event.is_set()
    closer.join()
