"""Erasure reaching every copy of a span: a Parquet export, a lake, a receiver's WAL, an agent's outbox.

``store/erasure.py`` plans an erasure on the DuckDB store and on each copy (the same rule,
``integrity.erasure.erase_span``, on the copy's own rows: a span's salts are the same wherever it is,
so are its commitments), signs one record naming every span erased anywhere, then rewrites the store
and calls ``apply`` on each copy:

- ``ParquetCopy``: a folder written by ``agenttape export parquet`` or ``serve --parquet-dir``. Each
  file holding an erased value is written again under its own name (hidden temp file, fsync, rename);
  the record goes in as a file of its own, so ``verify --parquet`` reports the erasure.
- ``LakeCopy``: a folder or S3 lake with a manifest. The changed files are written under new names and
  listed in one new snapshot that drops the old ones, which are deleted at once (no grace period: an
  erasure cannot wait for readers); the record is a new file in the same snapshot.
- ``WalCopy``: a receiver's write-ahead log (segments a crash left for replay). Each segment with an
  erased value is written again with the changed requests re-encoded (the torn tail, if any, dropped).
- ``OutboxCopy``: an agent's outbox folder. Every lane is locked for the erasure (a lane a live process
  holds is refused: stop it or let it drain first); each segment with an erased value is written again
  and the lane's acknowledged offset moved to the same record.

A WAL or outbox request is converted to rows (``rows.traces_to_tables``) to be selected with the same
SQL; the erased request keeps every other byte of its spans as it was.
"""

from __future__ import annotations

import glob
import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from otel_agenttape import outboxfile, semconv, walfile
from otel_agenttape.atomicfile import fsync_dir
from otel_agenttape.store import parquet as pqlake
from otel_agenttape.store.erasure import EraseResult, Plan, plan
from otel_agenttape.store.readers import StoreError

_EDITED = (semconv.CHAIN_SALTS, semconv.CHAIN_ERASED)


class Copy:
    """One copy an erasure reaches: ``plan`` reads what the selection picks there (nothing written),
    ``apply`` rewrites it once the record is signed, ``close`` releases what ``plan`` held."""

    kind = "copy"

    def __init__(self, path: str) -> None:
        self.path = os.fspath(path)

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": self.path}

    def plan(self, where: str, params: Sequence[Any], also: Sequence[tuple[str, str]], result: EraseResult) -> Plan:
        raise NotImplementedError

    def apply(self, p: Plan, record: pa.Table) -> dict[str, Any]:
        raise NotImplementedError

    def close(self) -> None:
        pass


# --- Parquet files --------------------------------------------------------------------------------


def _touches(t: pa.Table, table: str, p: Plan) -> bool:
    """Whether rows of ``spans``, ``span_events`` or ``log_records`` (their key columns are enough) hold a
    planned change."""
    if table == "log_records":
        return bool(p.logs) and any(lid in p.logs for lid in t.column("log_id").to_pylist())
    tids = t.column("trace_id").to_pylist()
    sids = t.column("span_id").to_pylist()
    if table == "spans":
        return any((a, b) in p.spans for a, b in zip(tids, sids))
    return any((a, b, i) in p.events for a, b, i in zip(tids, sids, t.column("event_index").to_pylist()))


def _replace_attributes(t: pa.Table, table: str, p: Plan) -> pa.Table | None:
    """``t`` (rows of ``spans``, ``span_events`` or ``log_records``) with the planned attribute sets (for
    log records, and bodies), or None if none is in it."""
    if table == "log_records":
        new_logs = [p.logs.get(lid) for lid in t.column("log_id").to_pylist()] if p.logs else []
        if not any(n is not None for n in new_logs):
            return None
        t = _set_json(t, "body", [None if n is None else n[0] for n in new_logs], [n is not None for n in new_logs])
        return _set_json(t, "attributes", [None if n is None else n[1] for n in new_logs],
                         [n is not None for n in new_logs])
    tids = t.column("trace_id").to_pylist()
    sids = t.column("span_id").to_pylist()
    if table == "spans":
        new = [p.spans.get((a, b)) for a, b in zip(tids, sids)]
    else:
        new = [p.events.get((a, b, i)) for a, b, i in zip(tids, sids, t.column("event_index").to_pylist())]
    if not any(n is not None for n in new):
        return None
    return _set_json(t, "attributes", new, [n is not None for n in new])


def _set_json(t: pa.Table, name: str, new: Sequence[Any], changed: Sequence[bool]) -> pa.Table:
    """``t`` with column ``name`` (JSON text, possibly an extension type) set to ``new`` where ``changed``
    (a None there: NULL)."""
    i = t.schema.get_field_index(name)
    col = t.column(i)
    storage_type = col.type.storage_type if isinstance(col.type, pa.ExtensionType) else col.type
    old = (col.combine_chunks().storage if isinstance(col.type, pa.ExtensionType) else col.combine_chunks()).to_pylist()
    vals = [(None if n is None else orjson.dumps(n).decode()) if c else o for n, c, o in zip(new, changed, old)]
    arr = pa.array(vals, type=storage_type)
    if isinstance(col.type, pa.ExtensionType):
        arr = pa.ExtensionArray.from_storage(col.type, arr)
    return t.set_column(i, t.schema.field(i), arr)


def _write_parquet(t: pa.Table, out: str) -> None:
    pq.write_table(t, out, row_group_size=pqlake.ROW_GROUP_ROWS,
                   **pqlake.writer_options(t.column_names, pqlake.ZSTD_LEVEL_EXPORT))


def _plan_files(lake: Any, spans: Sequence[str], events: Sequence[str], where: str, params: Sequence[Any],
                also: Sequence[tuple[str, str]], result: EraseResult, logs: Sequence[str] = ()) -> Plan:
    from otel_agenttape.store.lake.read import scan_sql

    if not spans:
        return Plan()
    con = duckdb.connect(":memory:")
    try:
        con.execute(f"CREATE VIEW spans AS {scan_sql(con, lake, 'spans', list(spans), '_es')}")
        if events:
            con.execute(f"CREATE VIEW span_events AS {scan_sql(con, lake, 'span_events', list(events), '_ee')}")
        else:
            con.execute("CREATE VIEW span_events AS SELECT '' AS trace_id, '' AS span_id, 0 AS event_index, "
                        "'{}' AS attributes WHERE false")
        if logs:
            con.execute(f"CREATE VIEW log_records AS {scan_sql(con, lake, 'log_records', list(logs), '_el')}")
        return plan(con, where, params, result, also, logs=bool(logs))
    finally:
        con.close()


_TABLES = ("spans", "span_events", "log_records")  # what an erasure changes in a copy


class ParquetCopy(Copy):
    """A Parquet export folder (``agenttape export parquet``, ``serve --parquet-dir``)."""

    kind = "parquet"

    def _files(self, table: str) -> list[str]:
        root = os.path.join(self.path, table)
        return sorted(os.path.relpath(f, self.path) for f in glob.glob(os.path.join(root, "**", "*.parquet"),
                                                                        recursive=True)
                      if not os.path.basename(f).startswith("."))

    def plan(self, where: str, params: Sequence[Any], also: Sequence[tuple[str, str]], result: EraseResult) -> Plan:
        from otel_agenttape.store.lake.fs import lake_fs

        if not os.path.isdir(os.path.join(self.path, "spans")):
            raise StoreError(f"{self.path}: no Parquet export here (no spans folder)")
        return _plan_files(lake_fs(self.path), self._files("spans"), self._files("span_events"), where, params,
                           also, result, self._files("log_records"))

    def apply(self, p: Plan, record: pa.Table) -> dict[str, Any]:
        rewritten = 0
        for table in _TABLES:
            for rel in self._files(table):
                path = os.path.join(self.path, rel)
                t = _replace_attributes(pq.read_table(path, partitioning=None), table, p)
                if t is None:
                    continue
                tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.erasing.tmp")
                try:
                    _write_parquet(t, tmp)
                    with open(tmp, "rb") as fh:
                        os.fsync(fh.fileno())
                    os.replace(tmp, path)
                finally:
                    if os.path.exists(tmp):
                        os.unlink(tmp)
                fsync_dir(os.path.dirname(path))
                rewritten += 1
        pqlake.write_partitions("spans", record, self.path, prefix="erasure")
        if os.path.isdir(os.path.join(self.path, pqlake.RUN_TRACES)):
            pqlake.export_run_traces(self.path)  # it lists the span files: one more now
        return {"files_rewritten": rewritten}


class LakeCopy(Copy):
    """A folder or S3 lake with a manifest (``serve --lake``); rewritten as one new snapshot."""

    kind = "lake"

    def __init__(self, path: str) -> None:
        from otel_agenttape.store.lake.fs import lake_fs

        super().__init__(path)
        self.lake = lake_fs(path)

    def plan(self, where: str, params: Sequence[Any], also: Sequence[tuple[str, str]], result: EraseResult) -> Plan:
        from otel_agenttape.store.lake import manifest as mf

        self.cat = mf.load_catalog(self.lake)
        spans = [f["key"] for f in self.cat.table_files("spans")]
        events = [f["key"] for f in self.cat.table_files("span_events")]
        logs = [f["key"] for f in self.cat.table_files("log_records")]
        return _plan_files(self.lake, spans, events, where, params, also, result, logs)

    def apply(self, p: Plan, record: pa.Table) -> dict[str, Any]:
        from otel_agenttape.store.lake import manifest as mf
        from otel_agenttape.store.lake.files import size_and_hash, write_or_skip
        from otel_agenttape.store.lake.maintain import commit_snapshot, new_snapshot

        cat = self.cat
        gen = cat.generation + 1
        files = dict(cat.files)
        removed: list[dict[str, Any]] = []
        for table in _TABLES:
            for k, f in enumerate(cat.table_files(table)):
                with self.lake.open_input(f["key"]) as fh:
                    t = _replace_attributes(pq.read_table(fh), table, p)
                if t is None:
                    continue
                folder = f["key"].rsplit("/", 1)[0]
                key = f"{folder}/erased-{gen:010d}-{k:04d}.parquet"
                with self.lake.staged(key) as tmp:
                    _write_parquet(t, tmp)
                    size, digest = size_and_hash(tmp)
                rec = {**f, "key": key, "bytes": size, "sha256": digest}  # the same rows, times and date
                files.pop(f["key"])
                files[key] = rec
                removed.append(f)
        day = record.column("date")[0].as_py().isoformat()
        rec = write_or_skip(self.lake, f"spans/date={day}/erasure-{gen:010d}.parquet", "spans", [record])
        if rec is not None:
            rec["date"] = day
            files[rec["key"]] = rec
        snap, delete = new_snapshot(cat, files, removed, list((cat.snapshot or {}).get("retention", [])),
                                     time.time(), 0.0)
        deleted = commit_snapshot(self.lake, snap, delete)
        return {"files_rewritten": len(removed), "files_deleted": deleted, "generation": snap["generation"],
                "manifest": mf.snapshot_key(snap["generation"])}


class IcebergCopy(Copy):
    """An Iceberg lake (``iceberg+...``): the changed files rewritten in one overwrite snapshot per table,
    a batch of rows at a time (a file is never read whole), the replaced files deleted and the older
    snapshots expired at once (``iceberg_maintain.erase_files``)."""

    kind = "iceberg"

    def __init__(self, path: str, batch_rows: int = pqlake.ROW_GROUP_ROWS) -> None:
        super().__init__(path)
        self.batch_rows = batch_rows  # rows read and written at a time

    def plan(self, where: str, params: Sequence[Any], also: Sequence[tuple[str, str]], result: EraseResult) -> Plan:
        import pyarrow.dataset as ds

        from otel_agenttape.store.lake import iceberg_catalog as ic
        from otel_agenttape.store.lake.iceberg_maintain import erase_datasets
        from otel_agenttape.store.lake.iceberg_read import object_key

        self.datasets = erase_datasets(self.path)
        if "spans" not in self.datasets or not self.datasets["spans"][2]:
            return Plan()
        con = duckdb.connect(":memory:")
        try:
            for table in _TABLES:
                if table in self.datasets and self.datasets[table][2]:
                    _, fs, files = self.datasets[table]
                    con.register(table, ds.dataset([object_key(fs, f.file_path) for f in files], filesystem=fs.fs,
                                                   format="parquet", schema=ic.arrow_schema(table)))
                elif table == "span_events":
                    con.execute("CREATE VIEW span_events AS SELECT '' AS trace_id, '' AS span_id, 0 AS event_index, "
                                "'{}' AS attributes WHERE false")
            return plan(con, where, params, result, also, logs="log_records" in self.datasets
                        and bool(self.datasets["log_records"][2]))
        finally:
            con.close()

    def apply(self, p: Plan, record: pa.Table) -> dict[str, Any]:
        from otel_agenttape.store.lake.iceberg_maintain import erase_files

        return erase_files(self.datasets, lambda table, t: _replace_attributes(t, table, p), record,
                           touches=lambda table, keys: _touches(keys, table, p), batch_rows=self.batch_rows)


# --- OTLP request logs (WAL, outbox) ---------------------------------------------------------------


def _edit_kvs(kvs: Any, new: dict[str, Any]) -> None:
    """Make a span's or event's ``KeyValue`` list match its erased typed attributes: values left out of
    ``new`` are removed, the salts and erased maps set; every other value is kept as it was."""
    from opentelemetry.proto.common.v1.common_pb2 import KeyValue

    kept = []
    for kv in kvs:
        if kv.key not in new:
            continue
        if kv.key in _EDITED:
            kv.value.string_value = new[kv.key]["s"]
        kept.append(kv)
    have = {kv.key for kv in kept}
    for key in _EDITED:
        if key in new and key not in have:
            kv = KeyValue(key=key)
            kv.value.string_value = new[key]["s"]
            kept.append(kv)
    copies = [KeyValue.FromString(kv.SerializeToString()) for kv in kept]  # detached from the list cleared next
    del kvs[:]
    kvs.extend(copies)


def erase_request(payload: bytes, p: Plan) -> bytes | None:
    """A serialized ``ExportTraceServiceRequest`` with the planned spans erased, or None if it holds none."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    req = ExportTraceServiceRequest.FromString(payload)
    changed = False
    for rs in req.resource_spans:
        for ss in rs.scope_spans:
            for span in ss.spans:
                key = (span.trace_id.hex(), span.span_id.hex())
                new = p.spans.get(key)
                if new is not None:
                    _edit_kvs(span.attributes, new)
                    changed = True
                for i, ev in enumerate(span.events):
                    new_ev = p.events.get((*key, i))
                    if new_ev is not None:
                        _edit_kvs(ev.attributes, new_ev)
                        changed = True
    return req.SerializeToString() if changed else None


def erase_logs_request(payload: bytes, p: Plan) -> bytes | None:
    """A serialized ``ExportLogsServiceRequest`` with the planned log records erased (matched by their
    ``log_id``, as the store keys them), or None if it holds none."""
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

    from otel_agenttape.store import rows

    if not p.logs:
        return None
    req = ExportLogsServiceRequest.FromString(payload)
    ids = iter(rows.request_log_ids(req))
    changed = False
    for rl in req.resource_logs:
        for sl in rl.scope_logs:
            for rec in sl.log_records:
                new = p.logs.get(next(ids))
                if new is None:
                    continue
                body, attrs = new
                if body is None:  # erasure only ever removes a body (re-encoding one would change its log_id)
                    rec.ClearField("body")
                _edit_kvs(rec.attributes, attrs)
                changed = True
    return req.SerializeToString() if changed else None


def _plan_requests(payloads: Iterable[bytes], where: str, params: Sequence[Any], also: Sequence[tuple[str, str]],
                   result: EraseResult, log_payloads: Iterable[bytes] = ()) -> Plan:
    """Plan over the spans (and the log records of ``log_payloads``) that OTLP request bodies hold."""
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

    from otel_agenttape.store import rows

    payloads = list(payloads)
    if not payloads:
        return Plan()
    tables = rows.traces_to_tables(payloads)
    logs = [ExportLogsServiceRequest.FromString(b) for b in log_payloads]
    con = duckdb.connect(":memory:")
    try:
        con.register("spans", tables.spans)
        con.register("span_events", tables.span_events)
        if logs:
            log_table = rows.logs_to_tables(logs).log_records
            con.execute("CREATE TABLE log_records AS SELECT * FROM log_table")
        return plan(con, where, params, result, also, logs=bool(logs))
    finally:
        con.close()


def _replace_file(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.erasing.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


class WalCopy(Copy):
    """A receiver's write-ahead log folder (``DB.otlpwal`` by default); ``only``: these segments of it (a
    running receiver's closed segments)."""

    kind = "wal"

    def __init__(self, path: str, only: Sequence[Path] | None = None) -> None:
        super().__init__(path)
        self.only = None if only is None else [Path(s) for s in only]

    def _segments(self) -> list[Path]:
        if self.only is not None:
            return [s for s in self.only if s.exists()]
        return walfile.segments(self.path)

    def plan(self, where: str, params: Sequence[Any], also: Sequence[tuple[str, str]], result: EraseResult) -> Plan:
        records = [(kind, pl) for seg in self._segments() for kind, pl in walfile.read_segment(seg)]
        return _plan_requests((pl for kind, pl in records if kind == walfile.KIND_TRACES), where, params, also,
                              result, (pl for kind, pl in records if kind == walfile.KIND_LOGS))

    def rewrite_segment(self, seg: Path, p: Plan) -> bool:
        """Write ``seg`` again with the planned spans erased in its requests; False if it holds none."""
        out: list[bytes] = []
        changed = False
        for kind, payload in walfile.read_segment(seg):
            new = (erase_request(payload, p) if kind == walfile.KIND_TRACES else
                   erase_logs_request(payload, p) if kind == walfile.KIND_LOGS else None)
            if new is not None:
                payload, changed = new, True
            out += [walfile.record_header(kind, payload), payload]
        if changed:
            _replace_file(seg, b"".join(out))
        return changed

    def apply(self, p: Plan, record: pa.Table) -> dict[str, Any]:
        return {"segments_rewritten": sum(1 for seg in self._segments() if self.rewrite_segment(seg, p))}


class OutboxCopy(Copy):
    """An agent's outbox folder (``OUTBOX/lane-*``); every lane is held locked from plan to apply."""

    kind = "outbox"

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self._locks: list[int] = []

    def plan(self, where: str, params: Sequence[Any], also: Sequence[tuple[str, str]], result: EraseResult) -> Plan:
        self.lanes = outboxfile.lanes(self.path) + outboxfile.lanes(Path(self.path) / outboxfile.LOGS_FOLDER)
        for lane in self.lanes:
            fd = outboxfile.try_lock(lane)
            if fd is None:
                raise StoreError(f"outbox lane {lane} is held by a running process: stop it (or let it deliver "
                                 "its spans), then erase")
            self._locks.append(fd)
        records = [r for lane in self.lanes for _, seg in outboxfile.segments(lane)
                   for r in outboxfile.scan_segment(seg, 0).records]
        return _plan_requests((r.payload for r in records if r.kind == outboxfile.KIND_TRACES), where, params,
                              also, result, (r.payload for r in records if r.kind == outboxfile.KIND_LOGS))

    def apply(self, p: Plan, record: pa.Table) -> dict[str, Any]:
        rewritten = 0
        for lane in self.lanes:
            ack_seg, ack_off = outboxfile.read_ack(lane)
            for number, seg in outboxfile.segments(lane):
                scan = outboxfile.scan_segment(seg, number)
                parts = [outboxfile.SEGMENT_MAGIC]
                moved: dict[int, int] = {}
                pos = len(outboxfile.SEGMENT_MAGIC)
                changed = False
                for r in scan.records:
                    moved[r.offset] = pos
                    payload = r.payload
                    new = (erase_request(payload, p) if r.kind == outboxfile.KIND_TRACES else
                           erase_logs_request(payload, p) if r.kind == outboxfile.KIND_LOGS else None)
                    if new is not None:
                        payload, changed = new, True
                    rec = outboxfile.encode_record(r.kind, r.items, payload)
                    parts.append(rec)
                    pos += len(rec)
                moved[scan.good_end] = pos
                if not changed:
                    continue
                _replace_file(seg, b"".join(parts))
                rewritten += 1
                if number == ack_seg and ack_off in moved:
                    outboxfile.write_ack(lane, ack_seg, moved[ack_off])
        return {"segments_rewritten": rewritten}

    def close(self) -> None:
        for fd in self._locks:
            os.close(fd)
        self._locks = []


def copies_for(parquet: Iterable[str] = (), lakes: Iterable[str] = (), wal: Iterable[str] = (),
               outbox: Iterable[str] = ()) -> list[Copy]:
    """The copies an erasure also reaches, checked to exist (a typo must not pass as "nothing to erase")."""
    out: list[Copy] = []
    for path in parquet:
        if not os.path.isdir(path):
            raise StoreError(f"no Parquet export at {path}")
        out.append(ParquetCopy(path))
    for uri in lakes:
        out.append(IcebergCopy(uri) if str(uri).startswith("iceberg+") else LakeCopy(uri))
    for path in wal:
        if not os.path.isdir(path):
            raise StoreError(f"no write-ahead log at {path}")
        out.append(WalCopy(path))
    for path in outbox:
        if not os.path.isdir(path):
            raise StoreError(f"no outbox at {path}")
        out.append(OutboxCopy(path))
    return out
