"""A script that records its run under a fixed run id, as a cron job would: run twice, one run id.

Usage: python read_nightly.py RECEIVER_URL DAY [fail]
"""

from __future__ import annotations

import sys

import otel_agenttape


def main() -> int:
    url, day = sys.argv[1], int(sys.argv[2])
    fail = len(sys.argv) > 3 and sys.argv[3] == "fail"
    tape = otel_agenttape.setup(url, protocol="http/protobuf", service_name="nightly-job")
    question = f"Report for day {day}?"
    try:
        with tape.run(agent="nightly", run_id="nightly-report", session_id=f"day-{day}", input=question) as run:
            messages = [{"role": "user", "content": question}]
            with run.model_call("fake-1", messages, provider="openai") as call:
                call.finish(tool_calls=[{"id": f"call_{day}", "type": "function", "function": {
                    "name": "fetch_sales", "arguments": f'{{"day": {day}}}'}}], finish_reason="tool_calls")
            with run.tool_call("fetch_sales", {"day": day}, call_id=f"call_{day}") as tool:
                if fail:
                    raise ConnectionError("sales database unreachable")
                tool.result({"day": day, "total": 100 * day})
            messages += [{"role": "assistant", "tool_calls": [{"id": f"call_{day}", "type": "function",
                          "function": {"name": "fetch_sales", "arguments": f'{{"day": {day}}}'}}]},
                         {"role": "tool", "tool_call_id": f"call_{day}", "content": f'{{"total": {100 * day}}}'}]
            with run.model_call("fake-1", messages, provider="openai") as call:
                call.finish(text=f"Day {day}: {100 * day} sold.", finish_reason="stop")
            run.set_output(f"Day {day}: {100 * day} sold.")
    except ConnectionError:
        pass
    tape.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
