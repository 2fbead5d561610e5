"""``warpdeck replay FILE`` tells a file that is not a recording at once, from its first line, in one
line naming the file and what it is instead, and exits 2. Before (issue 29) a text file or random
bytes came out as a raw decode error after the whole file had been read."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from textual.message import Message
from wd_cli import warpdeck
from wd_synthetic import SyntheticRun

from warpdeck.engine.api import ExitStatus
from warpdeck.engine.control.telemetry import summarize
from warpdeck.engine.control.wire import encode
from warpdeck.tui.attach import replay_link
from warpdeck.tui.messages import SnapshotArrived, StreamEnded

COLUMNS = 60
"""Narrow, so a message that Rich wrapped would come out on two lines."""


def _recording(frames: int) -> bytes:
    """What ``attach --record`` writes: each telemetry message inflated, one JSON object a line."""
    run = SyntheticRun(2_000, seed=5)
    return b"".join(encode(summarize(run.snapshot_at(0.5 * i, seq=i), 0.0)) + b"\n" for i in range(1, frames + 1))


def _refused(path: Path, *args: str) -> str:
    """Replay ``path``: it must exit 2 with one line on stderr, which is returned."""
    done = warpdeck("replay", str(path), *args, cwd=path.parent, columns=COLUMNS, timeout=60)
    assert done.returncode == ExitStatus.USAGE, done
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.mark.parametrize("trace", [False, True], ids=["room", "--trace"])
def test_a_text_file_is_named_and_refused(tmp_path: Path, trace: bool) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("what I did on the cluster today\nand then some\n", encoding="utf-8")
    args = ("--trace", str(tmp_path / "out.json")) if trace else ()
    line = _refused(text, *args)
    assert line == f"error: not a warpdeck recording: {text}: no telemetry on line 1 (not a JSON object)"
    assert not (tmp_path / "out.json").exists()


def test_random_bytes_are_said_not_to_be_text(tmp_path: Path) -> None:
    junk = tmp_path / "junk.bin"
    junk.write_bytes(bytes([0xFA, 0x01, 0x9C, 0x00]) * 4096)
    assert _refused(junk) == (f"error: not a warpdeck recording: {junk}: it is not text "
                              "(byte 0xfa at offset 0 is not UTF-8)")


def test_a_recording_cut_off_in_its_first_frame_says_so(tmp_path: Path) -> None:
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(_recording(1)[:700])
    assert _refused(cut) == f"error: not a warpdeck recording: {cut}: its first frame is cut off after 700 bytes"


def test_an_empty_file_and_a_missing_one(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    assert _refused(empty) == f"error: not a warpdeck recording: {empty}: it is empty"
    missing = tmp_path / "missing.jsonl"
    assert _refused(missing) == f"error: cannot read {missing}: No such file or directory"


def test_the_file_is_judged_from_its_first_line(tmp_path: Path) -> None:
    # A pipe whose writer stays open: reading past the first line would wait for ever.
    fifo = tmp_path / "live.jsonl"
    os.mkfifo(fifo)
    held = os.open(fifo, os.O_RDWR)  # (Linux) opens at once, and keeps the pipe's writing end open
    try:
        os.write(held, b"2024-05-01 12:00:00 INFO not telemetry\n")
        line = _refused(fifo)
    finally:
        os.close(held)
    assert line == f"error: not a warpdeck recording: {fifo}: no telemetry on line 1 (not a JSON object)"


def test_a_recording_cut_off_after_whole_frames_plays_them(tmp_path: Path) -> None:
    # What a recorder killed mid-write leaves: its whole frames are still a recording.
    whole = _recording(4)
    rec = tmp_path / "rec.jsonl"
    rec.write_bytes(whole[:-300])
    link = replay_link(rec, speed=1000)
    seqs: list[int] = []
    ended = threading.Event()

    def post(message: Message) -> None:
        if isinstance(message, SnapshotArrived):
            seqs.append(message.snapshot.seq)
        elif isinstance(message, StreamEnded):
            ended.set()

    link.start(post)
    try:
        assert ended.wait(30)
    finally:
        link.stop()
    assert seqs == [1, 2, 3]
