"""An Iceberg REST catalog server for the tests: the REST catalog OpenAPI's namespace and table endpoints
(the ones pyiceberg's ``RestCatalog`` calls) over HTTP on 127.0.0.1, backed by pyiceberg's ``SqlCatalog``
on a SQLite file with its warehouse on a folder.

Each request body is parsed into pyiceberg's own request models (``CreateTableRequest``,
``CommitTableRequest``) and answered with its response models. A commit runs
``SqlCatalog.commit_table(table, requirements, updates)``: a requirement that no longer holds, or another
commit that won the compare-and-swap of the metadata location, is a 409 ``CommitFailedException``, which
the client refreshes and retries on, as it would against any REST catalog. Requests are served
concurrently (uvicorn's worker threads), so conflicts between receivers are real.

    python tests/iceberg_rest_server.py --catalog DIR/catalog.db --warehouse DIR/warehouse --port-file F

prints nothing; it writes its port to ``--port-file`` once it listens and serves until SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from pydantic import ValidationError
from pyiceberg.catalog.rest import (
    CreateTableRequest,
    ListNamespaceResponse,
    ListTableResponseEntry,
    ListTablesResponse,
    NamespaceResponse,
    TableResponse,
    UpdateNamespacePropertiesResponse,
)
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NamespaceAlreadyExistsError,
    NamespaceNotEmptyError,
    NoSuchNamespaceError,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.table import CommitTableRequest
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.table.update import AssertCreate
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

NAMESPACE_SEPARATOR = "\x1f"  # how pyiceberg's client joins a multi-level namespace in a path
ERRORS: dict[type[Exception], tuple[int, str]] = {
    NoSuchNamespaceError: (404, "NoSuchNamespaceException"),
    NoSuchTableError: (404, "NoSuchTableException"),
    NamespaceAlreadyExistsError: (409, "AlreadyExistsException"),
    TableAlreadyExistsError: (409, "AlreadyExistsException"),
    NamespaceNotEmptyError: (409, "NamespaceNotEmptyException"),
    CommitFailedException: (409, "CommitFailedException"),
    ValidationError: (400, "BadRequestException"),
    ValueError: (400, "BadRequestException"),
}
# the ConfigResponse's ``endpoints``, in the spec's form (this server has no prefix: /v1/namespaces...)
ENDPOINTS = [
    "GET /v1/{prefix}/namespaces", "POST /v1/{prefix}/namespaces", "GET /v1/{prefix}/namespaces/{namespace}",
    "HEAD /v1/{prefix}/namespaces/{namespace}", "DELETE /v1/{prefix}/namespaces/{namespace}",
    "POST /v1/{prefix}/namespaces/{namespace}/properties", "GET /v1/{prefix}/namespaces/{namespace}/tables",
    "POST /v1/{prefix}/namespaces/{namespace}/tables", "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "HEAD /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "POST /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "DELETE /v1/{prefix}/namespaces/{namespace}/tables/{table}", "POST /v1/{prefix}/tables/rename",
]


class _Identified:
    """What ``SqlCatalog.commit_table`` needs of the table it is given: its identifier (a table that a
    staged create is about to make has no ``Table`` yet)."""

    def __init__(self, identifier: tuple[str, ...]) -> None:
        self.identifier = identifier

    def name(self) -> tuple[str, ...]:
        return self.identifier


def _namespace(request: Request) -> tuple[str, ...]:
    return tuple(unquote(request.path_params["namespace"]).split(NAMESPACE_SEPARATOR))


def _ident(request: Request) -> tuple[str, ...]:
    return (*_namespace(request), unquote(request.path_params["table"]))


def _model(model: Any, status: int = 200) -> Response:
    return Response(model.model_dump_json(), status_code=status, media_type="application/json")


def _error(exc: Exception) -> Response:
    for kind, (status, name) in ERRORS.items():
        if isinstance(exc, kind):
            break
    else:
        status, name = 500, "ServiceFailureException"
    message = " ".join(str(exc).split()) or type(exc).__name__
    return JSONResponse({"error": {"message": message, "type": name, "code": status}}, status_code=status)


def build_app(catalog: SqlCatalog) -> Starlette:
    """The REST routes over one SQL catalog (every failure answered with the spec's ErrorModel)."""

    def handler(fn: Callable[[Request, bytes], Response]) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            body = await request.body()
            from starlette.concurrency import run_in_threadpool

            try:
                return await run_in_threadpool(fn, request, body)
            except Exception as exc:  # noqa: BLE001 - every failure becomes the spec's error body
                answer = _error(exc)
                # the server's log names each refusal (a commit conflict is a 409 CommitFailedException)
                print(f"{request.method} {request.url.path} {answer.status_code} {type(exc).__name__}: {exc}",
                      file=sys.stderr, flush=True)
                return answer

        return endpoint

    def config(request: Request, body: bytes) -> Response:
        return JSONResponse({"defaults": {}, "overrides": {}, "endpoints": ENDPOINTS})

    def list_namespaces(request: Request, body: bytes) -> Response:
        parent = request.query_params.get("parent")
        ns = tuple(parent.split(NAMESPACE_SEPARATOR)) if parent else ()
        return _model(ListNamespaceResponse(namespaces=list(catalog.list_namespaces(ns))))

    def create_namespace(request: Request, body: bytes) -> Response:
        payload = json.loads(body or b"{}")
        ns = tuple(payload["namespace"])
        props = payload.get("properties") or {}
        catalog.create_namespace(ns, props)
        return _model(NamespaceResponse(namespace=ns, properties=catalog.load_namespace_properties(ns)))

    def load_namespace(request: Request, body: bytes) -> Response:
        ns = _namespace(request)
        return _model(NamespaceResponse(namespace=ns, properties=catalog.load_namespace_properties(ns)))

    def namespace_exists(request: Request, body: bytes) -> Response:
        return Response(status_code=204 if catalog.namespace_exists(_namespace(request)) else 404)

    def drop_namespace(request: Request, body: bytes) -> Response:
        catalog.drop_namespace(_namespace(request))
        return Response(status_code=204)

    def update_namespace(request: Request, body: bytes) -> Response:
        payload = json.loads(body or b"{}")
        summary = catalog.update_namespace_properties(_namespace(request), set(payload.get("removals") or []),
                                                      payload.get("updates") or {})
        return _model(UpdateNamespacePropertiesResponse(removed=summary.removed, updated=summary.updated,
                                                        missing=summary.missing))

    def list_tables(request: Request, body: bytes) -> Response:
        ns = _namespace(request)
        if not catalog.namespace_exists(ns):
            raise NoSuchNamespaceError(f"Namespace does not exist: {'.'.join(ns)}")
        entries = [ListTableResponseEntry(namespace=ident[:-1], name=ident[-1]) for ident in catalog.list_tables(ns)]
        return _model(ListTablesResponse(identifiers=entries))

    def create_table(request: Request, body: bytes) -> Response:
        payload = json.loads(body or b"{}")
        for optional in ("location", "partition-spec", "write-order"):  # the client leaves out what is unset
            payload.setdefault(optional, None)
        req = CreateTableRequest.model_validate(payload)
        ident = (*_namespace(request), req.name)
        spec = req.partition_spec or UNPARTITIONED_PARTITION_SPEC
        order = req.write_order or UNSORTED_SORT_ORDER
        if req.stage_create:  # the metadata a later commit with assert-create makes the table from
            if catalog.table_exists(ident):
                raise TableAlreadyExistsError(f"Table already exists: {'.'.join(ident)}")
            staged = catalog._create_staged_table(ident, req.table_schema, req.location, spec, order, req.properties)
            return _model(TableResponse(metadata_location=None, metadata=staged.metadata))
        tbl = catalog.create_table(ident, req.table_schema, req.location, spec, order, req.properties)
        return _model(TableResponse(metadata_location=tbl.metadata_location, metadata=tbl.metadata))

    def load_table(request: Request, body: bytes) -> Response:
        tbl = catalog.load_table(_ident(request))
        return _model(TableResponse(metadata_location=tbl.metadata_location, metadata=tbl.metadata))

    def table_exists(request: Request, body: bytes) -> Response:
        return Response(status_code=204 if catalog.table_exists(_ident(request)) else 404)

    def commit_table(request: Request, body: bytes) -> Response:
        req = CommitTableRequest.model_validate_json(body)
        ident = _ident(request)
        creating = any(isinstance(r, AssertCreate) for r in req.requirements)
        table: Any = _Identified(ident) if creating else catalog.load_table(ident)
        return _model(catalog.commit_table(table, req.requirements, req.updates))

    def drop_table(request: Request, body: bytes) -> Response:
        ident = _ident(request)
        if request.query_params.get("purgeRequested", "false").lower() == "true":
            catalog.purge_table(ident)
        else:
            catalog.drop_table(ident)
        return Response(status_code=204)

    def rename_table(request: Request, body: bytes) -> Response:
        payload = json.loads(body or b"{}")
        src, dst = payload["source"], payload["destination"]
        catalog.rename_table((*src["namespace"], src["name"]), (*dst["namespace"], dst["name"]))
        return Response(status_code=204)

    ns, tb = "/v1/namespaces/{namespace}", "/v1/namespaces/{namespace}/tables/{table}"
    return Starlette(routes=[
        Route("/v1/config", handler(config), methods=["GET"]),
        Route("/v1/namespaces", handler(list_namespaces), methods=["GET"]),
        Route("/v1/namespaces", handler(create_namespace), methods=["POST"]),
        Route(ns, handler(load_namespace), methods=["GET"]),
        Route(ns, handler(namespace_exists), methods=["HEAD"]),
        Route(ns, handler(drop_namespace), methods=["DELETE"]),
        Route(f"{ns}/properties", handler(update_namespace), methods=["POST"]),
        Route(f"{ns}/tables", handler(list_tables), methods=["GET"]),
        Route(f"{ns}/tables", handler(create_table), methods=["POST"]),
        Route(tb, handler(load_table), methods=["GET"]),
        Route(tb, handler(table_exists), methods=["HEAD"]),
        Route(tb, handler(commit_table), methods=["POST"]),
        Route(tb, handler(drop_table), methods=["DELETE"]),
        Route("/v1/tables/rename", handler(rename_table), methods=["POST"]),
    ])


def main() -> int:
    import uvicorn

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--catalog", required=True, help="the SQLite file of the SQL catalog behind the server")
    ap.add_argument("--warehouse", required=True, help="the folder the tables' files go under")
    ap.add_argument("--port-file", required=True, help="where the listening port is written")
    args = ap.parse_args()
    os.makedirs(args.warehouse, exist_ok=True)
    catalog = SqlCatalog("rest_backend", uri=f"sqlite:///{os.path.abspath(args.catalog)}",
                         warehouse="file://" + os.path.abspath(args.warehouse), init_catalog_tables="true")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(build_app(catalog), log_level="warning", access_log=False))
    sock.listen(128)  # connections queue from here on, before uvicorn accepts them
    tmp = args.port_file + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(str(sock.getsockname()[1]))
    os.replace(tmp, args.port_file)
    server.run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
