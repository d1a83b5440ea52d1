"""OTLP receiver: gRPC and HTTP servers, decoding, limits, backpressure, auth, durable hand-off to the store.

``server.TapeServer`` ties it together; ``decode`` reads OTLP protobuf/JSON, ``wal`` makes accepted
requests durable before they are acknowledged, ``pipeline`` feeds the store in batches.
"""
