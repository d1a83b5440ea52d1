"""The SDK internals the compiled modules read (codec/sdk_layout.py): the probe holds for the SDK
installed here, and an SDK whose properties no longer return those fields turns every fast read off."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import Status

from otel_agenttape.codec import sdk_layout


def test_the_installed_sdk_keeps_the_fields_the_compiled_modules_read():
    layout = sdk_layout.probe()
    assert layout is not None and layout == sdk_layout.LAYOUT
    assert layout.readable_span is ReadableSpan and layout.status is Status


@pytest.mark.parametrize("owner, name, value", [
    (ReadableSpan, "name", property(lambda self: "another " + self._name)),
    (ReadableSpan, "events", property(lambda self: ())),
    (ReadableSpan, "dropped_links", property(lambda self: 0)),
    (Status, "description", property(lambda self: None)),
])
def test_an_sdk_whose_properties_differ_is_read_through_them(monkeypatch, owner, name, value):
    monkeypatch.setattr(owner, name, value)
    assert sdk_layout.probe() is None
