"""A child agent in its own process: joins the coordinator's run from a W3C trace-context carrier.

Usage: python tape_child.py RECEIVER_URL CARRIER_JSON RUN_ID [crash]
"""

from __future__ import annotations

import json
import os
import sys

from tape_agents import ScriptedModel, ScriptedTools, recorder, weather_agent


class _Url:
    def __init__(self, url: str) -> None:
        self.url = url


def main() -> int:
    url, carrier, run_id = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    tape = recorder(_Url(url))
    if sys.argv[4:] == ["crash"]:  # dies after one tool node: its run span never ends
        with tape.run("remote-specialist", run_id=run_id, parent=carrier) as run:
            with run.tool_call("lookup", {"city": "Lima"}, call_id="c1") as tool:
                tool.result({"temp_c": 19})
            tape.force_flush()
            os._exit(1)
    try:
        weather_agent(tape, ScriptedModel(), ScriptedTools(), "Weather in Lima?", parent=carrier,
                      agent="remote-specialist", run_id=run_id)
        tape.force_flush()
    finally:
        tape.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
