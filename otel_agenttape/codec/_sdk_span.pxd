# cython: language_level=3
"""Inline reads of an SDK span context that the compiled modules share (``codec/sdk_layout.py`` says
when its tuple positions hold)."""

from cpython.tuple cimport PyTuple_GET_ITEM


cdef inline tuple context_fields(object ctx, object span_context_type):
    """(trace id, span id, trace state) of ``ctx``: its tuple positions 0, 1 and 4 when it is of the
    probed ``span_context_type``, else its properties."""
    if type(ctx) is span_context_type:
        return (<object>PyTuple_GET_ITEM(ctx, 0), <object>PyTuple_GET_ITEM(ctx, 1),
                <object>PyTuple_GET_ITEM(ctx, 4))
    return (ctx.trace_id, ctx.span_id, ctx.trace_state)
