"""``TapeServer``: the OTLP receiver in one object (store, WAL, writer, HTTP and gRPC listeners).

Used by ``agenttape serve`` (foreground) and ``agenttape demo`` (in a thread of the same process).
While it runs it owns the DuckDB file; readers find it through ``<db>.serve.json`` and query it
over ``POST /api/query``.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

import orjson

from otel_agenttape.receiver.convert import ConvertPool, default_workers
from otel_agenttape.receiver.decode import DEFAULT_MAX_BODY
from otel_agenttape.receiver.grpc import GrpcReceiver
from otel_agenttape.receiver.http import HttpContext, HttpReceiver
from otel_agenttape.receiver.metrics import Metrics
from otel_agenttape.receiver.pipeline import DEFAULT_MAX_QUEUE_BYTES, IngestPipeline
from otel_agenttape.receiver.service import ExportService
from otel_agenttape.receiver.wal import WriteAheadLog

log = logging.getLogger(__name__)


def discovery_path(db: str | os.PathLike[str]) -> Path:
    """Where a running server announces itself for a DuckDB file: ``<db>.serve.json``."""
    return Path(str(db) + ".serve.json")


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


def _open_store(db: str | None) -> Any:
    from otel_agenttape.store.writer import Store

    return Store(db)


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
        max_queue_bytes: int = DEFAULT_MAX_QUEUE_BYTES,
        store: Any = None,
        grpc_enabled: bool = True,
        ingest_workers: int | None = None,
        warm_workers: bool = False,
        span_metrics: bool = True,
        metrics_otlp_endpoint: str | None = None,
        metrics_otlp_interval: float = 15.0,
    ) -> None:
        self.db = None if db is None else str(db)
        self.host = host
        self._http_port_req = http_port
        self._grpc_port_req = grpc_port
        self.parquet_dir = None if parquet_dir is None else str(parquet_dir)
        self.token = token or None
        self.max_body = max_body
        self.max_queue_bytes = max_queue_bytes
        self.grpc_enabled = grpc_enabled
        # processes decoding and converting requests to rows (None: one per core, up to 4; 0: in-process)
        self.ingest_workers = default_workers() if ingest_workers is None else ingest_workers
        self.warm_workers = warm_workers  # start the converter processes right away (long-running servers)
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
        self._query_lock = threading.Lock()
        self._query_reader: Any = None
        self.replayed_records = 0

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> TapeServer:
        """Open the store, replay the WAL, bind the listeners; returns once ready to accept."""
        if self.store is None:
            self.store = _open_store(self.db)
        try:
            self.wal = WriteAheadLog(self.wal_dir)
            sink = None
            if self.parquet_dir:
                from otel_agenttape.store.parquet import ParquetSink

                sink = ParquetSink(self.parquet_dir)
            self.pipeline = IngestPipeline(self.store, self.wal, self.metrics, max_queue_bytes=self.max_queue_bytes,
                                           sink=sink, pool=ConvertPool(self.ingest_workers),
                                           on_stored=self.span_metrics.observe if self.span_metrics else None)
            service = ExportService(self.pipeline, self.metrics, is_ready=lambda: self._ready)
            ctx = HttpContext(
                service=service,
                metrics=self.metrics,
                token=self.token,
                max_body=self.max_body,
                is_ready=lambda: self._ready,
                render_metrics=self.render_metrics,
                run_query=self._handle_query,
            )
            # listen first: while the WAL replays, /healthz says 503 and exports get 503 + Retry-After
            self._http = HttpReceiver(self.host, self._http_port_req, ctx)
            if self.grpc_enabled:
                self._grpc = GrpcReceiver(self.host, self._grpc_port_req, service, self.metrics, self.token, self.max_body)
                self._grpc.start()
            self._http.start()
            self.replayed_records = self.pipeline.replay_wal()
            self.pipeline.start()
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
        if self.wal is not None:
            self.wal.close(applied_all=drained)
            self.wal = None
        with self._query_lock:
            if self._query_reader is not None:
                try:
                    self._query_reader.close()
                except Exception:  # noqa: BLE001 - closing a cursor of a store being closed
                    pass
                self._query_reader = None
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

    def _reader(self) -> Any:
        if self.store is None:
            raise RuntimeError("the server is not running")
        if self._query_reader is None:
            self._query_reader = self.store.reader()
        return self._query_reader

    def query(self, sql: str, params: list[Any] | None = None) -> Any:
        """Run a read-only query against the store this server holds; returns a pyarrow Table."""
        from otel_agenttape.store.sql import run_readonly_sql

        with self._query_lock:
            return run_readonly_sql(self._reader(), sql, params)

    def _handle_query(self, body: bytes) -> tuple[int, str, bytes]:
        from otel_agenttape.store.queryapi import handle_query

        with self._query_lock:
            return handle_query(self._reader(), body)

    def _internal_query(self, sql: str) -> Any:
        with self._query_lock:
            return self._reader().query(sql)

    def _gauges(self) -> dict[str, tuple[str, float]]:
        """Receiver gauges, read at each scrape from the pipeline, the WAL and the store file."""
        p, w = self.pipeline, self.wal
        return {
            "agenttape_ready": ("1 once the receiver accepts requests.", 1 if self._ready else 0),
            "agenttape_queue_bytes": ("Accepted bytes not yet in the store.", p.queued_bytes if p else 0),
            "agenttape_queue_items": ("Accepted spans and log records not yet in the store.", p.queued_items if p else 0),
            "agenttape_queue_requests": ("Accepted requests not yet in the store.", p.queued_requests if p else 0),
            "agenttape_queue_limit_bytes": ("Queue size past which requests get 429.", self.max_queue_bytes),
            "agenttape_queue_lag_seconds": ("Age of the oldest accepted request not yet in the store.",
                                            p.lag_seconds if p else 0),
            "agenttape_wal_lag_records": ("WAL records not yet applied to the store.", w.lag_records if w else 0),
            "agenttape_wal_disk_bytes": ("Bytes of WAL segments on disk.", w.disk_bytes if w else 0),
            "agenttape_wal_fsyncs": ("Group-commit flushes of the WAL since start.", w.fsyncs if w else 0),
            "agenttape_store_bytes": ("Bytes of the DuckDB store file and its WAL on disk.", self._store_bytes()),
        }

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
