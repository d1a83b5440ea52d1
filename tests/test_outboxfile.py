"""The outbox file format on real files: segments roll over and are deleted once acknowledged, a
reopened lane resumes after the acknowledged offset, a torn or corrupt record ends reading there and
never costs the records before it, and a held lane is not taken by anyone else."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from otel_agenttape import outboxfile
from otel_agenttape.outboxfile import KIND_TRACES


def _fill(root, n, size=100, segment_bytes=1000):
    lane, others = outboxfile.open_lane(root, segment_bytes)
    assert others == []
    for i in range(n):
        lane.append(KIND_TRACES, i + 1, bytes([i % 256]) * size)
    return lane


def test_segments_roll_over_and_go_once_acknowledged(tmp_path):
    lane = _fill(tmp_path, 30)
    assert len(outboxfile.segments(lane.path)) > 3
    assert lane.pending_records == 30 and lane.pending_items == sum(range(1, 31))
    for i in range(20):
        rec = lane.first()
        assert rec.payload == bytes([i]) * 100 and rec.items == i + 1
        lane.ack_first()
    firsts = [r.items for r in outboxfile.pending(lane.path)]
    assert firsts == list(range(21, 31))
    assert outboxfile.segments(lane.path)[0][0] == lane._records[0].segment  # spent segments deleted
    lane.close()
    again, _ = outboxfile.open_lane(tmp_path, 1000)  # the lane is free again: the next process takes it
    assert again.path == lane.path and again.first().items == 21 and again.pending_records == 10
    again.close()


def test_a_torn_tail_and_a_corrupt_record_end_reading_without_losing_what_came_before(tmp_path):
    lane = _fill(tmp_path, 5, segment_bytes=1 << 20)
    lane.close()
    (number, seg), = outboxfile.segments(lane.path)
    good = seg.stat().st_size
    with open(seg, "ab") as f:
        f.write(outboxfile.encode_record(KIND_TRACES, 9, b"t" * 300)[:150])
    assert [r.items for r in outboxfile.read_outbox(tmp_path)] == [1, 2, 3, 4, 5]
    assert outboxfile.summarize(tmp_path).torn_bytes == 150
    reopened, _ = outboxfile.open_lane(tmp_path, 1 << 20)
    assert reopened.torn_bytes == 150 and seg.stat().st_size == good  # cut away before appending
    reopened.append(KIND_TRACES, 6, b"after")
    assert [r.items for r in outboxfile.read_outbox(tmp_path)] == [1, 2, 3, 4, 5, 6]
    reopened.close()
    data = bytearray(seg.read_bytes())
    third = outboxfile.scan_segment(seg, number).records[2]
    data[third.offset + outboxfile.HEADER_SIZE + 10] ^= 0xFF  # a flipped bit in the third payload
    seg.write_bytes(bytes(data))
    assert [r.items for r in outboxfile.read_outbox(tmp_path)] == [1, 2]


def test_a_file_that_is_not_a_segment_is_refused(tmp_path):
    lane = _fill(tmp_path, 1)
    lane.close()
    (lane.path / f"{99:020d}.seg").write_bytes(b'{"foo": 1}')
    with pytest.raises(outboxfile.OutboxFormatError):
        list(outboxfile.read_outbox(tmp_path))


def test_a_lane_held_by_a_live_process_is_not_taken(tmp_path):
    hold = subprocess.Popen([sys.executable, "-c", (
        "import sys; from otel_agenttape import outboxfile as o; lane, _ = o.open_lane(sys.argv[1]); "
        "lane.append(1, 1, b'x'); print(lane.path, flush=True); sys.stdin.readline()"), str(tmp_path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ})
    try:
        held = hold.stdout.readline().strip()
        mine, others = outboxfile.open_lane(tmp_path)
        assert str(mine.path) != held and others == []
        assert outboxfile.summarize(tmp_path).lanes_in_use == 2
        mine.close()
    finally:
        hold.kill()
        hold.wait()
    adopted = outboxfile.adopt_free_lanes(tmp_path, {mine.path})  # its owner died: the lock is free
    assert [str(a.path) for a in adopted] == [held] and adopted[0].pending_records == 1
    outboxfile.remove_lane(adopted[0])
    assert [str(p) for p in outboxfile.lanes(tmp_path)] == [str(mine.path)]
