"""``TapeServer``: the OTLP receiver in one object (store, WAL, writer, HTTP and gRPC listeners).

Used by ``agenttape serve`` (foreground) and ``agenttape demo`` (in a thread of the same process).
While it runs it owns the DuckDB file; readers find it through ``<db>.serve.json`` and query it
over ``POST /api/query``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson

from otel_agenttape import read_memory
from otel_agenttape.receiver.convert import ConvertPool, default_workers
from otel_agenttape.receiver.quiet import DEFAULT_RELEASE_AFTER
from otel_agenttape.receiver.grpc import GrpcReceiver
from otel_agenttape.receiver.http import HttpContext, HttpReceiver
from otel_agenttape.receiver.limits import DEFAULT_MAX_BODY, Limits
from otel_agenttape.receiver.metrics import Metrics
from otel_agenttape.receiver.memory import MemoryBudget
from otel_agenttape.receiver.pipeline import IngestPipeline
from otel_agenttape.receiver.service import ExportService
from otel_agenttape.receiver.wal import WriteAheadLog
from otel_agenttape.store.reader import discovery_path
from otel_agenttape.store.sql import DEFAULT_QUERY_TIMEOUT

DEFAULT_MAX_QUERIES = 4  # queries running at once; more wait up to _QUERY_SLOT_WAIT, then get 503
_QUERY_SLOT_WAIT = 5.0
# A reader's first query waits at most this long for what was acknowledged before it to be stored
# (a write of the queue takes well under a second; past this the query answers with what is stored).
SETTLE_S = 5.0

log = logging.getLogger(__name__)


def read_discovery(db: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The discovery record of a live server holding ``db``, or None (missing, stale or unreadable)."""
    path = discovery_path(db)
    try:
        info = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    pid = info.get("pid")
    if not isinstance(pid, int):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return info


def default_receiver_id() -> str:
    """The host name, in the characters a lake's file names allow."""
    import re
    import socket

    return re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname()).strip(".-_") or "receiver"


def _open_store(db: str | None, budget: MemoryBudget) -> Any:
    from otel_agenttape.store.writer import Store

    return Store(db, memory_limit=f"{max(1, budget.store >> 20)}MiB")


class TapeServer:
    """OTLP receiver writing into the tape store at ``db`` (None: an in-memory store)."""

    def __init__(
        self,
        db: str | os.PathLike[str] | None,
        host: str = "127.0.0.1",
        http_port: int = 4318,
        grpc_port: int = 4317,
        parquet_dir: str | os.PathLike[str] | None = None,
        token: str | None = None,
        wal_dir: str | os.PathLike[str] | None = None,
        max_body: int = DEFAULT_MAX_BODY,
        max_queue_bytes: int | None = None,
        store: Any = None,
        grpc_enabled: bool = True,
        ingest_workers: int | None = None,
        warm_workers: bool = False,
        lake: str | os.PathLike[str] | None = None,
        receiver_id: str | None = None,
        lake_interval: float | None = None,
        lake_max_spans: int | None = None,
        query_timeout: float | None = None,
        max_queries: int = DEFAULT_MAX_QUERIES,
        limits: Limits | None = None,
        http_routes: Sequence[Any] = (),
        http_fallback: Any = None,
        span_metrics: bool = True,
        metrics_otlp_endpoint: str | None = None,
        metrics_otlp_interval: float = 15.0,
        memory_limit: MemoryBudget | int | str | None = None,
        release_after: float = DEFAULT_RELEASE_AFTER,
    ) -> None:
        self.db = None if db is None else str(db)
        self.host = host
        self._http_port_req = http_port
        self._grpc_port_req = grpc_port
        self.parquet_dir = None if parquet_dir is None else str(parquet_dir)
        self.token = token or None
        # per-request and per-connection limits (``limits.py``); ``max_body`` is the one most callers set
        self.limits = limits if limits is not None else Limits(max_body=max_body)
        self.max_body = self.limits.max_body
        self.http_routes = list(http_routes)  # more Starlette routes on the HTTP port (see receiver/http.py)
        self.http_fallback = http_fallback  # an ASGI app for every other HTTP path, instead of a 404
        # DuckDB's memory_limit, the queue, the converter spool and the kept reads: one operator figure (memory.py)
        self.memory = memory_limit if isinstance(memory_limit, MemoryBudget) else MemoryBudget.of(memory_limit)
        self.max_queue_bytes = self.memory.queue if max_queue_bytes is None else max_queue_bytes
        self.grpc_enabled = grpc_enabled
        # processes decoding and converting requests to rows (None: one per core, up to 4; 0: in-process)
        self.ingest_workers = default_workers() if ingest_workers is None else ingest_workers
        self.warm_workers = warm_workers  # start the converter processes right away (long-running servers)
        if release_after < 0:
            raise ValueError(f"release_after must be 0 (never) or more seconds, not {release_after:g}")
        # after this many quiet seconds, idle memory goes back to the system (receiver/quiet.py; 0: never)
        self.release_after = float(release_after)
        self._own_wal_tmp = False
        if wal_dir is not None:
            self.wal_dir = Path(wal_dir)
        elif self.db is not None:
            self.wal_dir = Path(self.db + ".otlpwal")
        else:
            self.wal_dir = Path(tempfile.mkdtemp(prefix="agenttape-wal-"))
            self._own_wal_tmp = True
        self.store: Any = store
        self._own_store = store is None
        self.metrics = Metrics()
        self.metrics.add_gauges(self._gauges)
        # GenAI and agent metrics derived from each stored batch (off: ``span_metrics=False``)
        self.span_metrics: Any = None
        if span_metrics:
            from otel_agenttape.receiver.genai_metrics import SpanMetrics

            self.span_metrics = SpanMetrics()
            self.metrics.add_collector(self.span_metrics)
        self.metrics_otlp_endpoint = metrics_otlp_endpoint
        self.metrics_otlp_interval = metrics_otlp_interval
        self._otlp_bridge: Any = None
        self.wal: WriteAheadLog | None = None
        self.pipeline: IngestPipeline | None = None
        self._http: HttpReceiver | None = None
        self._grpc: GrpcReceiver | None = None
        self._ready = False
        self._stopped = threading.Event()
        # seconds before a query is interrupted (0: never); each query runs on a cursor of its own
        self.query_timeout = DEFAULT_QUERY_TIMEOUT if query_timeout is None else float(query_timeout)
        self.max_queries = max(1, int(max_queries))
        self._query_slots = threading.BoundedSemaphore(self.max_queries)
        self.replayed_records = 0
        # publication into a lake (store/lake/publish.py): the DuckDB file stays the hot store
        self.lake = None if lake is None else os.fspath(lake)
        self.receiver_id = receiver_id
        self.lake_options = {k: v for k, v in (("interval", lake_interval), ("max_spans", lake_max_spans))
                             if v is not None}
        self.publisher: Any = None

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> TapeServer:
        """Open the store, replay the WAL, bind the listeners; returns once ready to accept."""
        read_memory.set_limit(self.memory.reads)  # the console's and the API's kept reads (process-wide)
        if self.store is None:
            self.store = _open_store(self.db, self.memory)
        try:
            self.wal = WriteAheadLog(self.wal_dir)
            sink = None
            if self.parquet_dir:
                from otel_agenttape.store.parquet import ParquetSink

                sink = ParquetSink(self.parquet_dir)
            pool = ConvertPool(self.ingest_workers, self.memory.spool)
            pool.restart_on_use = self.warm_workers  # kept running: back at the next request after a quiet spell
            self.pipeline = IngestPipeline(self.store, self.wal, self.metrics, max_queue_bytes=self.max_queue_bytes,
                                           sink=sink, pool=pool, release_after=self.release_after,
                                           on_stored=self.span_metrics.observe if self.span_metrics else None)
            # the lake publisher queries the store on a cursor of its own: it holds still while the
            # store gives its cached blocks back (receiver/quiet.py)
            self.pipeline.quiet.hold = lambda: self._held_still(False)
            service = ExportService(self.pipeline, self.metrics, is_ready=lambda: self._ready,
                                    max_items=self.limits.max_spans_per_request)
            ctx = HttpContext(
                service=service,
                metrics=self.metrics,
                token=self.token,
                max_body=self.max_body,
                is_ready=lambda: self._ready,
                health=self.health,
                render_metrics=self.render_metrics,
                run_query=self._handle_query,
                run_erase=self._handle_erase if self.db is not None else None,
                run_retain=self._handle_retain if self.db is not None else None,
                limits=self.limits,
            )
            # listen first: while the WAL replays, /healthz says 503 and exports get 503 + Retry-After
            self._http = HttpReceiver(self.host, self._http_port_req, ctx, self.http_routes, self.http_fallback)
            if self.grpc_enabled:
                self._grpc = GrpcReceiver(self.host, self._grpc_port_req, service, self.metrics, self.token, self.max_body,
                                          idle_timeout=self.limits.idle_timeout)
                self._grpc.start()
            self._http.start()
            self.replayed_records = self.pipeline.replay_wal()
            self.pipeline.start()
            if self.lake is not None:
                self._start_publisher()
            if self.db is not None:
                self._write_discovery()
            if self.metrics_otlp_endpoint:
                from otel_agenttape.receiver.otlp_metrics import OtlpMetricsBridge

                self._otlp_bridge = OtlpMetricsBridge(self.metrics, self.metrics_otlp_endpoint,
                                                      interval=self.metrics_otlp_interval)
                self._otlp_bridge.start()
        except BaseException:
            self._teardown(drain=False)
            raise
        self._ready = True
        if self.warm_workers and self.pipeline.pool is not None:
            threading.Thread(target=self._warm, name="agenttape-warm", daemon=True).start()
        return self

    def _start_publisher(self) -> None:
        from otel_agenttape.store.lake.publish import LakePublisher

        if self.db is None:
            raise ValueError("a receiver publishing into a lake needs a DuckDB file (--db): it is the hot store")
        receiver = self.receiver_id or default_receiver_id()
        from otel_agenttape.store.lake.iceberg_catalog import is_iceberg_uri

        if is_iceberg_uri(self.lake):
            from otel_agenttape.store.lake.iceberg_publish import IcebergPublisher

            self.publisher = IcebergPublisher(self.store, self.lake, receiver, **self.lake_options).start()
            return
        self.publisher = LakePublisher(self.store, self.lake, receiver, **self.lake_options).start()

    def _warm(self) -> None:
        pipeline = self.pipeline
        try:
            if pipeline is not None and pipeline.pool is not None:
                pipeline.pool.start()
        except Exception as exc:  # noqa: BLE001 - the pool starts on first use instead
            log.warning("could not start the row-conversion workers early: %s", exc)

    def _write_discovery(self) -> None:
        path = discovery_path(self.db or "")
        info = {"url": self.url, "pid": os.getpid(), "token": self.token}
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(orjson.dumps(info))
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)

    def _remove_discovery(self) -> None:
        if self.db is None:
            return
        path = discovery_path(self.db)
        try:
            info = orjson.loads(path.read_bytes())
            if info.get("pid") == os.getpid():
                path.unlink()
        except (OSError, orjson.JSONDecodeError):
            pass

    def stop(self, timeout: float = 30.0) -> None:
        """Stop accepting, store everything already acknowledged, close the store."""
        self._ready = False
        self._teardown(drain=True, timeout=timeout)
        self._stopped.set()

    def _teardown(self, drain: bool, timeout: float = 30.0) -> None:
        self._remove_discovery()
        if self._otlp_bridge is not None:
            self._otlp_bridge.stop()  # one last export of the final values
            self._otlp_bridge = None
        if self._http is not None:
            self._http.stop()
            self._http = None
        if self._grpc is not None:
            self._grpc.stop()
            self._grpc = None
        drained = False
        if self.pipeline is not None:
            drained = self.pipeline.close(timeout if drain else 0.1) and drain
            self.pipeline = None
        if self.publisher is not None:
            self.publisher.stop(flush=drain)  # everything stored is published before the store closes
            self.publisher = None
        if self.wal is not None:
            self.wal.close(applied_all=drained)
            self.wal = None
        if self._own_store and self.store is not None:
            try:
                self.store.close()
            finally:
                self.store = None
        if self._own_wal_tmp:
            shutil.rmtree(self.wal_dir, ignore_errors=True)

    def request_stop(self) -> None:
        """Make ``serve_forever`` return (safe to call from a signal handler)."""
        self._stopped.set()

    def serve_forever(self) -> None:
        """Block until ``stop()`` is called (from a signal handler or another thread)."""
        while not self._stopped.wait(0.5):
            pass

    def __enter__(self) -> TapeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- state --------------------------------------------------------------------------------

    @property
    def http_port(self) -> int:
        return self._http.port if self._http is not None else self._http_port_req

    @property
    def grpc_port(self) -> int:
        return self._grpc.port if self._grpc is not None else self._grpc_port_req

    @property
    def url(self) -> str:
        host = self.host if self.host not in ("0.0.0.0", "::", "") else "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.http_port}"

    @property
    def ready(self) -> bool:
        return self._ready

    def wait_idle(self, timeout: float | None = 30.0) -> bool:
        """Block until everything acknowledged so far is queryable in the store; False on timeout."""
        if self.pipeline is None:
            return True
        return self.pipeline.wait_idle(timeout)

    # -- reads --------------------------------------------------------------------------------

    def health(self) -> str | None:
        """Why the receiver cannot take data now (``/healthz`` answers 503 with it), or None."""
        if not self._ready:
            return "starting: replaying the write-ahead log" if not self._stopped.is_set() else "stopped"
        wal, pipeline = self.wal, self.pipeline
        if wal is not None and wal.error is not None:
            return f"the write-ahead log cannot write: {wal.error}"
        if pipeline is not None:
            reason = pipeline.store_error
            if reason:
                return f"the store cannot write: {reason}"
        return None

    def _reader(self) -> Any:
        if self.store is None:
            raise RuntimeError("the server is not running")
        return self.store.reader()

    def query(self, sql: str, params: list[Any] | None = None, timeout: float | None = None) -> Any:
        """Run a read-only query against the store this server holds; returns a pyarrow Table."""
        from otel_agenttape.store.sql import run_readonly_sql

        reader = self._reader()
        try:
            return run_readonly_sql(reader, sql, params, timeout=self.query_timeout if timeout is None else timeout)
        finally:
            reader.close()

    def _settle(self) -> None:
        """Before a reader's first query: wait (at most ``SETTLE_S``) until what this server acknowledged
        before is in the store, so that a command run right after an export sees it."""
        pipeline = self.pipeline
        if pipeline is not None:
            pipeline.wait_stored(SETTLE_S)

    def _handle_query(self, body: bytes) -> tuple[int, str, bytes]:
        from otel_agenttape.store.queryapi import busy, handle_query

        if not self._query_slots.acquire(timeout=_QUERY_SLOT_WAIT):
            return busy(f"{self.max_queries} queries are already running; retry later")
        try:
            reader = self._reader()
            try:
                status, ctype, out = handle_query(reader, body, self.query_timeout, settle=self._settle)
            finally:
                reader.close()
        finally:
            self._query_slots.release()
        if status == 408:
            self.metrics.inc("agenttape_queries_timed_out_total")
        elif status == 400:
            self.metrics.inc("agenttape_queries_refused_total")
        return status, ctype, out

    # -- erasure and retention: the file rewritten while requests go on being acknowledged ---------------

    def _rewritable(self) -> tuple[Any, IngestPipeline]:
        store, pipeline = self.store, self.pipeline
        if store is None or pipeline is None or not getattr(store, "path", None):
            raise ValueError("this server holds no store file to rewrite")
        return store, pipeline

    def _check_selection(self, where: str, params: list[Any]) -> None:
        from otel_agenttape.store.reader import QueryError
        from otel_agenttape.store.sql import run_readonly_sql

        reader = self._reader()
        try:
            run_readonly_sql(reader, f"SELECT count(*) FROM spans WHERE ({where})", params)
        except QueryError as exc:
            raise ValueError(f"erasure selection refused: {exc}") from None
        finally:
            reader.close()

    def own_copies(self) -> list[Any]:
        """The copies of the store this receiver writes itself, which its erasures reach: its Parquet
        export (``--parquet-dir``, once it holds spans) and its lake (``--lake``)."""
        from otel_agenttape.store.erasure_copies import copies_for

        parquet = [self.parquet_dir] if self.parquet_dir and os.path.isdir(os.path.join(self.parquet_dir, "spans")) else []
        return copies_for(parquet=parquet, lakes=[self.lake] if self.lake else [])

    @contextlib.contextmanager
    def _held_still(self, every_write: bool) -> Iterator[None]:
        """What writes from the store held still for a rewrite: the lake publisher (its cursor renewed
        after); with ``every_write`` also each write from the store to the Parquet sink (``BatchWriter.
        handoff``), the sink flushed first so its buffered rows are in the files the erasure reads."""
        pipeline, publisher = self.pipeline, self.publisher
        with contextlib.ExitStack() as stack:
            if every_write and pipeline is not None:
                stack.enter_context(pipeline.writer.handoff)
                if pipeline.sink is not None:
                    pipeline.sink.flush()
            if publisher is not None:
                stack.enter_context(publisher.suspended())
            yield

    def erase(self, where: str, params: list[Any], selector: dict[str, Any], *, reason: str, by: str,
              signing_key: str | None = None, dry_run: bool = False, settle_seconds: float = 5.0,
              wal_wait_seconds: float = 10.0) -> dict[str, Any]:
        """Erase in the store this server holds, and in the copies it owns, while it keeps accepting
        requests (``POST /api/erase``).

        ``where`` (a condition on ``spans``, as ``tape/erase.selection`` builds it) is checked through the
        read-only SQL guard first. Requests already accepted get up to ``settle_seconds`` to reach the
        store. Then writes wait (requests go on being acknowledged into the WAL, and are stored once the
        file is open again, so none is lost) while the WAL starts a new segment, the Parquet sink is
        flushed and the file, the Parquet export and the lake are rewritten (``Store.exclusive``; reads
        wait for it). The closed WAL segments are deleted once their records are stored (up to
        ``wal_wait_seconds``; the ones left then are rewritten), and the converter's kept hand-off files
        removed. A dry run plans on the live database and holds nothing."""
        from otel_agenttape.integrity.note import Signer
        from otel_agenttape.store.erasure import erase_duckdb

        store, pipeline = self._rewritable()
        self._check_selection(where, params)
        key = signing_key or os.environ.get("AGENTTAPE_SIGNING_KEY")
        signer = Signer.parse(key) if key else Signer.generate("agenttape.ephemeral")
        t0 = time.monotonic()
        settled = pipeline.wait_idle(settle_seconds)

        def run(path: str, own: list[Any], connect: Any = None) -> Any:
            return erase_duckdb(path, where, params, reason=reason, by=by, selector=selector, signer=signer,
                                dry_run=dry_run, copies=own, connect=connect)

        if dry_run:
            out = run(store.path, self.own_copies(), store.cursor).to_json()
            out.update({"settled": settled, "total_seconds": round(time.monotonic() - t0, 3)})
            return out
        wal = self.wal
        closed: list[Path] = []
        with self._held_still(every_write=True):
            paused = time.monotonic()
            rotated = wal.rotate() if wal is not None else False
            closed = wal.closed_segments() if wal is not None else []
            own = self.own_copies()
            result = store.exclusive(lambda path: run(path, own))
            paused = time.monotonic() - paused
        out = result.to_json()
        if result.erasure_id:
            out["wal"] = self._erase_closed_segments(closed, where, params, wal_wait_seconds)
            out["wal"]["rotated"] = rotated
            out["spool_files_removed"] = pipeline.pool.drop_kept_files() if pipeline.pool is not None else 0
        out.update({"writes_paused_seconds": round(paused, 3), "settled": settled,
                    "total_seconds": round(time.monotonic() - t0, 3)})
        self.metrics.inc("agenttape_erasures_total")
        return out

    def _erase_closed_segments(self, closed: list[Path], where: str, params: list[Any],
                               wait_seconds: float) -> dict[str, int]:
        """The WAL segments closed before an erasure hold the erased values until their records are all in
        the store, and are deleted then; the ones still there after ``wait_seconds`` (records not stored
        yet) are rewritten with the selection applied to their own rows, as a stopped receiver's are."""
        from otel_agenttape.store.erasure import EraseResult
        from otel_agenttape.store.erasure_copies import WalCopy

        wal = self.wal
        if wal is None or not closed:
            return {"segments_deleted": 0, "segments_rewritten": 0}
        left = wal.wait_gone(closed, wait_seconds)
        rewritten = 0
        if left:
            copy = WalCopy(str(self.wal_dir), only=left)
            p = copy.plan(where, params, (), EraseResult(None, False))
            if p:
                rewritten = wal.rewrite_closed(left, lambda seg: copy.rewrite_segment(seg, p))
        return {"segments_deleted": len(closed) - len(left), "segments_rewritten": rewritten}

    def retain(self, older_than_days: int, *, reason: str, by: str, content_only: bool = False,
               signing_key: str | None = None, dry_run: bool = False, today: Any = None,
               settle_seconds: float = 5.0) -> dict[str, Any]:
        """``agenttape retain`` on the store this server holds, while it keeps accepting requests
        (``POST /api/retain``): spans dated before UTC today minus ``older_than_days`` are dropped and the
        tape ranges recorded in ``store_retention`` (``store/retention.py``), the file rewritten with writes
        waiting as for an erasure; ``content_only`` is an erasure of their content (``erase``)."""
        from otel_agenttape.store.retention import cutoff, retain_duckdb

        days = int(older_than_days)
        if content_only:
            day = cutoff(days, today).isoformat()
            out = self.erase("date < CAST(? AS DATE)", [day], {"retain_older_than_days": days, "before": day},
                             reason=reason, by=by, signing_key=signing_key, dry_run=dry_run,
                             settle_seconds=settle_seconds)
            return {"before": day, "older_than_days": days, "content_only": True, **out}
        if not reason or not reason.strip():
            raise ValueError("retention needs a reason")
        store, pipeline = self._rewritable()
        t0 = time.monotonic()
        settled = pipeline.wait_idle(settle_seconds)
        if dry_run:
            out = retain_duckdb(store.path, days, reason=reason, by=by, signer=None, dry_run=True, today=today,
                                connect=store.cursor)
            out.update({"settled": settled, "total_seconds": round(time.monotonic() - t0, 3)})
            return out
        with self._held_still(every_write=False):
            paused = time.monotonic()
            out = store.exclusive(lambda path: retain_duckdb(path, days, reason=reason, by=by, signer=None,
                                                             today=today))
            paused = time.monotonic() - paused
        out.update({"writes_paused_seconds": round(paused, 3), "settled": settled,
                    "total_seconds": round(time.monotonic() - t0, 3)})
        self.metrics.inc("agenttape_retentions_total")
        return out

    @staticmethod
    def _json_request(body: bytes, what: str) -> dict[str, Any]:
        try:
            req = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"the body is not JSON: {exc}") from None
        if not isinstance(req, dict):
            raise ValueError(f"the body is a JSON object ({what})")
        if not str(req.get("reason") or "").strip():
            raise ValueError("a reason is required (it is written into the record)")
        return req

    def _handle_erase(self, body: bytes) -> tuple[int, str, bytes]:
        try:
            req = self._json_request(body, "where, params, selector, reason")
            if not isinstance(req.get("where"), str):
                raise ValueError("the body is a JSON object with where, params, selector, reason")
            out = self.erase(req["where"], list(req.get("params") or []), dict(req.get("selector") or {}),
                             reason=str(req["reason"]), by=str(req.get("by") or "unknown"),
                             signing_key=req.get("signing_key"), dry_run=bool(req.get("dry_run")))
        except ValueError as exc:
            return 400, "application/json", orjson.dumps({"error": str(exc)})
        return 200, "application/json", orjson.dumps(out)

    def _handle_retain(self, body: bytes) -> tuple[int, str, bytes]:
        import datetime as dt

        try:
            req = self._json_request(body, "older_than_days, reason, content_only, dry_run")
            days = req.get("older_than_days")
            if isinstance(days, bool) or not isinstance(days, int) or days < 0:
                raise ValueError("older_than_days is a whole number of days, 0 or more")
            today = dt.date.fromisoformat(req["today"]) if req.get("today") else None
            out = self.retain(days, reason=str(req["reason"]), by=str(req.get("by") or "unknown"),
                              content_only=bool(req.get("content_only")), signing_key=req.get("signing_key"),
                              dry_run=bool(req.get("dry_run")), today=today)
        except ValueError as exc:
            return 400, "application/json", orjson.dumps({"error": str(exc)})
        return 200, "application/json", orjson.dumps(out)

    def _internal_query(self, sql: str) -> Any:
        reader = self._reader()
        try:
            return reader.query(sql)
        finally:
            reader.close()

    def _gauges(self) -> dict[str, tuple[str, float]]:
        """Receiver gauges, read at each scrape from the pipeline, the WAL and the store file."""
        p, w = self.pipeline, self.wal
        gauges = {
            "agenttape_ready": ("1 once the receiver accepts requests.", 1 if self._ready else 0),
            "agenttape_writable": ("0 while the WAL or the store cannot write (disk full, I/O error).",
                                   0 if self._ready and self.health() else 1),
            "agenttape_wal_write_errors": ("Failed WAL writes since start (those requests got 503).",
                                           w.write_errors if w else 0),
            "agenttape_queue_bytes": ("Accepted bytes not yet in the store.", p.queued_bytes if p else 0),
            "agenttape_queue_items": ("Accepted spans and log records not yet in the store.", p.queued_items if p else 0),
            "agenttape_queue_requests": ("Accepted requests not yet in the store.", p.queued_requests if p else 0),
            "agenttape_queue_limit_bytes": ("Queue size past which requests get 429.", self.max_queue_bytes),
            "agenttape_memory_limit_bytes": ("The receiver's memory budget (--memory-limit).", self.memory.total),
            "agenttape_store_memory_limit_bytes": ("DuckDB's memory_limit, from the budget.", self.memory.store),
            "agenttape_spool_limit_bytes": ("Converter hand-off files kept for reuse, at most.", self.memory.spool),
            "agenttape_read_cache_limit_bytes": ("What the read model may keep between reads.", self.memory.reads),
            "agenttape_converter_processes": ("Converter processes running now (they stop after a quiet spell).",
                                              p.pool.workers if p and p.pool is not None and p.pool.running else 0),
            "agenttape_release_after_seconds": ("Quiet seconds after which idle memory is given back (0: never).",
                                                self.release_after),
            "agenttape_read_cache_bytes": ("What the read model keeps between reads now (runs' keys, "
                                           "summaries, scores).", read_memory.held()),
            "agenttape_queue_lag_seconds": ("Age of the oldest accepted request not yet in the store.",
                                            p.lag_seconds if p else 0),
            "agenttape_wal_lag_records": ("WAL records not yet applied to the store.", w.lag_records if w else 0),
            "agenttape_wal_disk_bytes": ("Bytes of WAL segments on disk.", w.disk_bytes if w else 0),
            "agenttape_wal_fsyncs": ("Group-commit flushes of the WAL since start.", w.fsyncs if w else 0),
            "agenttape_http_connections": ("Open HTTP connections.", self._http.connections if self._http else 0),
            "agenttape_store_bytes": ("Bytes of the DuckDB store file and its WAL on disk.", self._store_bytes()),
        }
        if self.publisher is not None:
            gauges.update(self.publisher.gauges())
        return gauges

    def _store_bytes(self) -> int:
        if self.db is None:
            return 0
        total = 0
        for path in (self.db, self.db + ".wal"):
            try:
                total += os.stat(path).st_size
            except OSError:
                pass
        return total

    def render_metrics(self) -> str:
        """Prometheus text for ``GET /metrics`` (the registry of this server; nothing reads the store)."""
        return self.metrics.render()
