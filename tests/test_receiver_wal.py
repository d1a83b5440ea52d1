"""Write-ahead log: durability, group commit, torn tails, segment cleanup."""

from __future__ import annotations

import threading

from otel_agenttape.receiver.wal import KIND_LOGS, KIND_TRACES, WriteAheadLog, read_segment


def test_append_then_reopen_replays_in_order(tmp_path):
    wal = WriteAheadLog(tmp_path)
    payloads = [bytes([i]) * (i * 10 + 1) for i in range(20)]
    for i, p in enumerate(payloads):
        wal.append(KIND_TRACES if i % 2 else KIND_LOGS, p)
    wal.close()  # not applied: must survive
    again = WriteAheadLog(tmp_path)
    got = list(again.replay())
    assert [p for _, p in got] == payloads
    assert [k for k, _ in got] == [KIND_TRACES if i % 2 else KIND_LOGS for i in range(20)]
    again.drop_replayed()
    assert list(again.replay()) == []
    again.close()
    assert list(WriteAheadLog(tmp_path).replay()) == []


def test_torn_tail_is_cut_off(tmp_path):
    wal = WriteAheadLog(tmp_path)
    wal.append(KIND_TRACES, b"a" * 100)
    wal.append(KIND_TRACES, b"b" * 100)
    wal.close()
    seg = wal.segments()[-1]
    data = seg.read_bytes()
    seg.write_bytes(data[:-30])  # crash in the middle of the second record
    assert [p for _, p in read_segment(seg)] == [b"a" * 100]
    corrupt = bytearray(data)
    corrupt[20] ^= 0xFF  # a flipped bit in the first payload: nothing after it is trusted
    seg.write_bytes(bytes(corrupt))
    assert list(read_segment(seg)) == []


def test_group_commit_shares_fsyncs(tmp_path):
    wal = WriteAheadLog(tmp_path)
    n_threads, per_thread = 16, 40
    barrier = threading.Barrier(n_threads)

    def work(i: int) -> None:
        barrier.wait()
        for j in range(per_thread):
            wal.append(KIND_TRACES, f"{i}-{j}".encode() * 50)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = n_threads * per_thread
    assert wal.lag_records == total
    assert wal.fsyncs < total  # concurrent appends were flushed together
    wal.close()
    assert len(list(WriteAheadLog(tmp_path).replay())) == total


def test_applied_segments_are_deleted_but_not_unapplied_ones(tmp_path):
    wal = WriteAheadLog(tmp_path, segment_bytes=1000)
    seqs = [wal.append(KIND_TRACES, b"x" * 600) for _ in range(6)]  # one segment per two records
    assert len(wal.segments()) >= 3
    wal.mark_applied(seqs[1:])  # the first record is still pending: nothing may go
    assert len(list(read_segment(wal.segments()[0]))) >= 1
    first = wal.segments()[0]
    wal.mark_applied(seqs[:1])
    assert not first.exists()
    assert wal.lag_records == 0
    wal.close(applied_all=True)
    assert wal.segments() == []


def test_group_commit_writes_many_records_in_order(tmp_path):
    # one flush may gather more buffers than one writev takes (two per record)
    from otel_agenttape.receiver import wal as wal_module

    chunks = [bytes([i % 251]) * (i % 7) for i in range(3 * wal_module._IOV_MAX + 5)]
    path = tmp_path / "chunks"
    with open(path, "wb", buffering=0) as fh:
        wal_module._write_all(fh.fileno(), chunks)
    assert path.read_bytes() == b"".join(chunks)
