"""The lake: N receivers publish immutable Parquet files and a manifest into one folder or S3 bucket.

``LakePublisher`` (a receiver's side), ``open_sources`` (read lakes and stores as one),
``compact`` and ``retain`` (maintenance). ``docs/scale-out.md`` describes the layout.
"""

from otel_agenttape.store.lake.fs import LakeError, LakeFS, is_lake_uri, lake_fs
from otel_agenttape.store.lake.manifest import Catalog, load_catalog
from otel_agenttape.store.lake.publish import LakePublisher, ReceiverIdInUse
from otel_agenttape.store.lake.read import LakeSet, open_sources

__all__ = ["Catalog", "LakeError", "LakeFS", "LakePublisher", "LakeSet", "ReceiverIdInUse", "is_lake_uri",
           "lake_fs", "load_catalog", "open_sources"]
