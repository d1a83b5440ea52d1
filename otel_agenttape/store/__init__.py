"""The tape store: OTLP rows in DuckDB and Parquet, the runs/nodes/steps views, and readers.

Public API (import from the submodules so ``import otel_agenttape.store`` stays light):

- ``store.writer.Store(path | None)``: ``write_traces``/``write_logs`` -> ``WriteResult``, ``reader()``
- ``store.reader.open_reader(source) -> Reader``: DuckDB file (or the server holding it), lake, Store
- ``store.sql.run_readonly_sql(reader, sql, params)``: one SELECT, no file or network access
- ``store.parquet``: ``export_parquet``, ``ParquetSink``, ``lake_dataset``
- ``store.queryapi.handle_query``: the server side of ``POST /api/query``
- ``store.rows``: OTLP requests -> Arrow tables; ``store.schema``/``store.views``: DDL and views
"""
