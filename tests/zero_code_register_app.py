"""The OpenAI app of ``zero_code_openai_app.py`` configured in code instead: one ``register()`` call
before it runs (run with plain ``python``, no ``opentelemetry-instrument``).

    python zero_code_register_app.py OPENAI_BASE_URL [--city CITY]

Prints ``same tape`` when a second ``register()`` returns the first one's Tape.
"""

from __future__ import annotations

import otel_agenttape

tape = otel_agenttape.register(service_name="inline")  # the receiver from OTEL_EXPORTER_OTLP_ENDPOINT
if otel_agenttape.register() is tape and isinstance(tape, otel_agenttape.Tape):
    print("same tape", flush=True)

from zero_code_openai_app import main  # noqa: E402  # the app itself, after the one line

main()
