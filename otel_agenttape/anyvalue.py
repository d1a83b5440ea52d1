"""The typed attribute values under their first name: ``otel_agenttape.codec.typed`` holds them now.

Kept so that code written against ``otel_agenttape.anyvalue`` (``docs/schema.md`` named it) goes on working.
"""

from otel_agenttape.codec.typed import (  # noqa: F401
    Typed,
    as_int,
    as_text,
    attrs_from_proto,
    attrs_from_python,
    attrs_to_python,
    decode_double,
    dumps,
    encode_double,
    from_proto,
    from_python,
    loads,
    to_proto,
    to_python,
)
