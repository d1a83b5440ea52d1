"""The value and wire encodings every layer uses; the lowest layer, importing nothing else of the package.

- ``typed``: OTLP typed values (the one-key JSON form the store keeps and the canonical leaf hashes), and
  live values made OTLP-safe.
- ``jsontext``: JSON text of payloads (SDK objects as plain data) and of rebuilt tape values, and JSON text
  parsed back.
- ``messages_record``: provider SDK message shapes (OpenAI, Anthropic, Gemini) as GenAI messages and parts,
  the way capture records them.
- ``messages_read``: recorded content values of any convention read back as GenAI ``Message`` values, and
  those written in the OpenAI chat shape.
- ``messages_flat``: GenAI messages from the flattened conventions (OpenInference indexed attributes,
  OpenLLMetry's legacy ``gen_ai.prompt.N.*``) and from provider response bodies.
- ``otlp_encode``: SDK spans written straight to OTLP protobuf request bytes (what the exporters send).
- ``otlp_decode``: OTLP/HTTP request bodies (protobuf or OTLP JSON, gzip/deflate) decoded into the request
  messages, and response messages encoded.
- ``otlp_files``: OTLP files (JSON, JSON lines, protobuf, gzip) decoded into requests.
- ``otlp_view``: OTLP trace requests parsed with every attribute left as raw bytes (what the store reads).
"""
