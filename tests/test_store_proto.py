"""tape.proto compiles, and its Run/Node/Step fields are exactly the runs/nodes/steps view columns."""

from __future__ import annotations

import importlib
import os
import sys

import pytest

from otel_agenttape.store import samples
from otel_agenttape.store.writer import Store

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROTO = os.path.join(ROOT, "proto", "agenttape", "v1", "tape.proto")


@pytest.fixture(scope="module")
def tape_pb2(tmp_path_factory):
    protoc = pytest.importorskip("grpc_tools.protoc")
    import grpc_tools

    out = tmp_path_factory.mktemp("pb")
    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    rc = protoc.main(["protoc", f"-I{os.path.join(ROOT, 'proto')}", f"-I{include}", f"--python_out={out}",
                      PROTO])
    assert rc == 0, "protoc failed on tape.proto"
    sys.path.insert(0, str(out))
    try:
        yield importlib.import_module("agenttape.v1.tape_pb2")
    finally:
        sys.path.remove(str(out))


_INT = {"int64", "int32", "uint32"}


def _check(message, table):
    fields = {f.name: f for f in message.DESCRIPTOR.fields}
    assert list(fields) == table.column_names
    import pyarrow as pa

    for name, col in zip(table.column_names, table.columns):
        f = fields[name]
        t = col.type
        if pa.types.is_boolean(t):
            assert f.type == f.TYPE_BOOL, name
        elif pa.types.is_list(t):
            assert f.is_repeated and f.type == f.TYPE_STRING, name
        elif pa.types.is_integer(t):
            assert f.type in (f.TYPE_INT64, f.TYPE_INT32), name
        elif pa.types.is_floating(t):
            assert f.type == f.TYPE_DOUBLE, name
        elif pa.types.is_timestamp(t):
            assert f.message_type is not None and f.message_type.full_name == "google.protobuf.Timestamp", name
        else:
            assert f.type == f.TYPE_STRING, name


def test_messages_mirror_views(tape_pb2):
    store = Store(None)
    store.write_traces(samples.genai_requests(n_runs=1))
    r = store.reader()
    _check(tape_pb2.Run, r.query("SELECT * FROM runs"))
    _check(tape_pb2.Node, r.query("SELECT * FROM nodes"))
    _check(tape_pb2.Step, r.query("SELECT * FROM steps"))
    # a view row fills its message
    row = r.query("SELECT * FROM nodes WHERE node_type = 'model' LIMIT 1").to_pylist()[0]
    node = tape_pb2.Node(**{k: v for k, v in row.items() if v is not None})
    assert tape_pb2.Node.FromString(node.SerializeToString()).node_id == row["node_id"]
    store.close()
