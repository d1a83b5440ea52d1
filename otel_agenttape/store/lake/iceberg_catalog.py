"""The lake as Apache Iceberg tables: which catalog a ``--lake`` URL names, and the tables' layout.

A lake URL names an Iceberg catalog and a namespace (after ``#``, default ``agenttape``):

- ``iceberg+sql:///path/catalog.db#ns``: a SQLite catalog file (the embedded default); its warehouse is
  the folder ``warehouse`` beside it unless ``?warehouse=DIR|s3://BUCKET/PREFIX`` says otherwise;
- ``iceberg+postgresql://user:pass@host:5432/db?warehouse=s3://bucket/prefix#ns``: the catalog in a
  PostgreSQL database (many hosts; read through SQLAlchemy and psycopg 3);
- ``iceberg+rest://host:8181/path#ns`` (plain HTTP), ``iceberg+http://...`` or ``iceberg+https://...``: an
  Iceberg REST catalog; ``warehouse`` and the other query parameters are passed on as catalog properties.

An S3 warehouse uses the standard AWS variables, as the folder/S3 lake does (``fs.py``).

Each table holds the columns of the store's table in Iceberg's types (no unsigned integers: ``uint32`` is
``long``, the run index's 64-bit hashes are ``long`` with the same bits; JSON is ``string``); dated tables
are partitioned by ``day(date)`` and ``bucket(8, trace_id)``, and sorted as the lake sorts them
(``parquet.SORT_KEYS``), so min/max statistics bound a time window and a trace id.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlparse, urlunparse

import pyarrow as pa

from otel_agenttape.store import parquet as pqlake
from otel_agenttape.store import rows
from otel_agenttape.store.lake.files import RUN_TRACES, RUN_TRACES_SCHEMA
from otel_agenttape.store.lake.fs import LakeError

SCHEMES = ("iceberg+sql", "iceberg+sqlite", "iceberg+postgresql", "iceberg+postgres", "iceberg+rest",
           "iceberg+http", "iceberg+https")
DEFAULT_NAMESPACE = "agenttape"
TRACE_BUCKETS = 8
TABLES = ("spans", "span_events", "span_links", "log_records", "resources", RUN_TRACES)
SORT = {**pqlake.SORT_KEYS, RUN_TRACES: ["run_id", "trace_id", "parent_run_id"]}
FIELD_ID = b"PARQUET:field_id"


def is_iceberg_uri(source: str) -> bool:
    """A lake URL that names an Iceberg catalog (``iceberg+sql:``, ``iceberg+postgresql:``, ``iceberg+rest:``...)."""
    return isinstance(source, str) and source.split(":", 1)[0].lower() in SCHEMES


@dataclass
class LakeUrl:
    """What a lake URL says: the catalog's kind and properties, the namespace and the warehouse."""

    url: str
    kind: str  # "sql" or "rest"
    properties: dict[str, str]
    namespace: str
    warehouse: str | None
    sqlite_path: str | None = None
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.namespace


def _aws_properties() -> dict[str, str]:
    env = os.environ
    out: dict[str, str] = {}
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    if endpoint:
        out["s3.endpoint"] = endpoint
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if region:
        out["s3.region"] = region
    if env.get("AWS_ACCESS_KEY_ID"):
        out["s3.access-key-id"] = env["AWS_ACCESS_KEY_ID"]
        out["s3.secret-access-key"] = env.get("AWS_SECRET_ACCESS_KEY", "")
        if env.get("AWS_SESSION_TOKEN"):
            out["s3.session-token"] = env["AWS_SESSION_TOKEN"]
    return out


def _warehouse_location(where: str) -> str:
    if where.startswith("s3://"):
        return where.rstrip("/")
    if where.startswith("file://"):
        where = where[len("file://"):]
    return "file://" + os.path.abspath(where)


def parse_lake_url(url: str) -> LakeUrl:
    """Parse an Iceberg lake URL (module docstring); a malformed one is a clear ``LakeError``."""
    if not is_iceberg_uri(url):
        raise LakeError(f"{url}: an Iceberg lake is iceberg+sql:///PATH.db, iceberg+postgresql://... or iceberg+rest://...")
    scheme, rest = url.split(":", 1)
    scheme = scheme.lower()
    body, _, frag = rest.partition("#")
    namespace = unquote(frag) or DEFAULT_NAMESPACE
    if not namespace.replace("_", "").isalnum():
        raise LakeError(f"{url}: the namespace after '#' must be letters, digits and '_' (got {namespace!r})")
    body, _, query = body.partition("?")
    params = dict(parse_qsl(query, keep_blank_values=True))
    warehouse = params.pop("warehouse", None)
    props = {**_aws_properties(), "py-io-impl": "pyiceberg.io.pyarrow.PyArrowFileIO"}
    props.update({k: v for k, v in params.items()})
    if scheme in ("iceberg+sql", "iceberg+sqlite"):
        path = body[2:] if body.startswith("//") else body
        if not path:
            raise LakeError(f"{url}: give the SQLite catalog file, e.g. iceberg+sql:///var/lib/agenttape/catalog.db")
        path = os.path.abspath(unquote(path))
        wh = _warehouse_location(warehouse or os.path.join(os.path.dirname(path), "warehouse"))
        props.update({"uri": f"sqlite:///{path}", "warehouse": wh, "init_catalog_tables": "true"})
        return LakeUrl(url, "sql", props, namespace, wh, sqlite_path=path)
    if scheme in ("iceberg+postgresql", "iceberg+postgres"):
        p = urlparse("postgresql:" + body)
        if not p.netloc:
            raise LakeError(f"{url}: give the database, e.g. iceberg+postgresql://user:pass@host:5432/db")
        if not warehouse:
            raise LakeError(f"{url}: a PostgreSQL catalog needs ?warehouse=s3://BUCKET/PREFIX (or a shared folder)")
        wh = _warehouse_location(warehouse)
        props.update({"uri": urlunparse(p._replace(scheme="postgresql+psycopg")), "warehouse": wh,
                      "init_catalog_tables": "true"})
        return LakeUrl(url, "sql", props, namespace, wh)
    http = "https" if scheme == "iceberg+https" else "http"
    p = urlparse(f"{http}:" + body)
    if not p.netloc:
        raise LakeError(f"{url}: give the REST catalog's address, e.g. iceberg+rest://catalog:8181")
    props["uri"] = urlunparse(p)
    if warehouse:
        props["warehouse"] = warehouse
    return LakeUrl(url, "rest", props, namespace, warehouse)


def load(url: str | LakeUrl) -> tuple[Any, LakeUrl]:
    """The pyiceberg catalog a lake URL names (created on first use for a SQL catalog)."""
    from pyiceberg.catalog import load_catalog

    parsed = url if isinstance(url, LakeUrl) else parse_lake_url(url)
    if parsed.sqlite_path:
        os.makedirs(os.path.dirname(parsed.sqlite_path), exist_ok=True)
    wh = parsed.warehouse or ""
    if wh.startswith("file://"):
        os.makedirs(wh[len("file://"):], exist_ok=True)
    try:
        cat = load_catalog(f"agenttape_{parsed.namespace}", **{"type": parsed.kind, **parsed.properties})
    except Exception as exc:  # noqa: BLE001 - pyiceberg and SQLAlchemy raise their own errors
        raise LakeError(f"cannot open the Iceberg catalog {_redact(parsed.url)}: {exc}") from exc
    return cat, parsed


def _redact(url: str) -> str:
    p = urlparse(url)
    if p.password:
        return url.replace(f":{p.password}@", ":***@")
    return url


# -- table layout ---------------------------------------------------------------------------------------
def _iceberg_type(t: pa.DataType) -> pa.DataType:
    if isinstance(t, pa.BaseExtensionType):
        return pa.string()
    if t in (pa.int8(), pa.int16(), pa.uint8(), pa.uint16()):
        return pa.int32()
    if t in (pa.uint32(), pa.uint64()):
        return pa.int64()
    return t


def store_schema(table: str) -> pa.Schema:
    return RUN_TRACES_SCHEMA if table == RUN_TRACES else rows.SCHEMAS[table]


def arrow_schema(table: str) -> pa.Schema:
    """The data files' schema: the store's columns in Iceberg types, each with its Iceberg field id."""
    return pa.schema([pa.field(f.name, _iceberg_type(f.type), nullable=True, metadata={FIELD_ID: str(i)})
                      for i, f in enumerate(store_schema(table), start=1)])


def conform(table: str, t: pa.Table) -> pa.Table:
    """Rows from the store (or an old lake file) in the data files' schema (missing columns are null)."""
    sch = arrow_schema(table)
    cols = []
    for f in sch:
        if f.name not in t.column_names:
            cols.append(pa.nulls(t.num_rows, f.type))
            continue
        col = t.column(f.name)
        if isinstance(col.type, pa.BaseExtensionType):
            col = pa.chunked_array([c.storage for c in col.chunks], col.type.storage_type)
        if col.type != f.type:
            col = col.cast(f.type, safe=col.type != pa.uint64())  # a hash keeps its 64 bits
        cols.append(col)
    return pa.Table.from_arrays(cols, schema=sch)


def iceberg_schema(table: str) -> Any:
    from pyiceberg.io.pyarrow import pyarrow_to_schema

    return pyarrow_to_schema(arrow_schema(table))


def partition_spec(table: str, schema: Any) -> Any:
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import BucketTransform, DayTransform

    if table not in pqlake.PARTITIONED:
        return PartitionSpec()
    return PartitionSpec(
        PartitionField(source_id=schema.find_field("date").field_id, field_id=1000, transform=DayTransform(),
                       name="date_day"),
        PartitionField(source_id=schema.find_field("trace_id").field_id, field_id=1001,
                       transform=BucketTransform(TRACE_BUCKETS), name="trace_id_bucket"),
    )


def sort_order(table: str, schema: Any) -> Any:
    from pyiceberg.table.sorting import SortField, SortOrder
    from pyiceberg.transforms import IdentityTransform

    return SortOrder(*[SortField(source_id=schema.find_field(c).field_id, transform=IdentityTransform())
                       for c in SORT[table]])


TABLE_PROPERTIES = {
    "write.format.default": "parquet",
    "write.parquet.compression-codec": "zstd",
    "write.parquet.compression-level": str(pqlake.ZSTD_LEVEL_STREAM),
    "write.parquet.page-size-bytes": str(pqlake.DATA_PAGE_BYTES),
    "write.metadata.previous-versions-max": "50",
    "write.metadata.delete-after-commit.enabled": "true",
    "agenttape.format": "agenttape.iceberg/1",
}


def ensure_tables(cat: Any, namespace: str) -> dict[str, Any]:
    """Create the namespace and any missing table (another receiver may create it at the same time)."""
    from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchTableError, TableAlreadyExistsError

    try:
        cat.create_namespace_if_not_exists(namespace)
    except NamespaceAlreadyExistsError:
        pass
    out: dict[str, Any] = {}
    for table in TABLES:
        ident = f"{namespace}.{table}"
        try:
            out[table] = cat.load_table(ident)
            continue
        except NoSuchTableError:
            pass
        sch = iceberg_schema(table)
        try:
            out[table] = cat.create_table(ident, schema=sch, partition_spec=partition_spec(table, sch),
                                          sort_order=sort_order(table, sch), properties=TABLE_PROPERTIES)
        except (TableAlreadyExistsError, Exception) as exc:  # noqa: BLE001 - a concurrent create
            try:
                out[table] = cat.load_table(ident)
            except NoSuchTableError:
                raise LakeError(f"cannot create the Iceberg table {ident}: {exc}") from exc
    return out


def load_tables(cat: Any, namespace: str) -> dict[str, Any]:
    """The tables that exist (a reader never creates one)."""
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    out: dict[str, Any] = {}
    for table in TABLES:
        try:
            out[table] = cat.load_table(f"{namespace}.{table}")
        except (NoSuchTableError, NoSuchNamespaceError):
            continue
    return out
