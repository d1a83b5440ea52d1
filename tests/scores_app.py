"""A web app's agent process for tests/test_scores.py: records three runs through a receiver, scoring them
while they run (code checks on the run and on a model call) and once after one ended.

    python scores_app.py ENDPOINT

With a LoggerProvider of its own (as ``register()`` sets one up), so each score given while its span is
open also leaves as an OTel log record parented to that span. Prints one JSON line: each run's ref and
its model call's span id.
"""

from __future__ import annotations

import json
import sys

from opentelemetry import _logs
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor

import otel_agenttape


def main() -> None:
    endpoint = sys.argv[1]
    logs = LoggerProvider()
    logs.add_log_record_processor(SimpleLogRecordProcessor(OTLPLogExporter(endpoint=f"{endpoint}/v1/logs")))
    _logs.set_logger_provider(logs)
    tape = otel_agenttape.setup(endpoint, service_name="webapp")
    out = {}
    for run_id, quality in (("good", 0.9), ("meh", 0.5), ("plain", None)):
        with tape.run(agent="helper", run_id=run_id) as run:
            question = f"how do I reset my password? ({run_id})"
            with run.model_call("gpt-test", [{"role": "user", "content": question}]) as call:
                call.finish(text=f"Open settings, then security ({run_id}).", response_id=f"resp-{run_id}")
                if quality is not None:
                    assert call.score("fluency", 0.8, source="code")
            run.set_output(f"Open settings, then security ({run_id}).")
            if quality is not None:
                assert run.score("quality", quality, explanation="rubric check", source="rubric@2")
                assert run.score("helpfulness", quality)
        if run_id == "good":  # after the run ended: a score tape of its own, from this process
            assert run.score("latency_ok", label="yes")
        assert not run.score("", 1.0)  # given wrongly: counted, never raised into the agent
        out[run_id] = {"ref": f"{run_id}@{run.span.get_span_context().trace_id:032x}",
                       "model_span": f"{call.span.get_span_context().span_id:016x}"}
    tape.shutdown()
    logs.shutdown()
    out["scores_invalid"] = tape.stats()["scores_invalid"]
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
