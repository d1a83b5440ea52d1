"""An OpenAI app with no telemetry code, for the zero-code tests (run under ``opentelemetry-instrument``).

    python zero_code_openai_app.py OPENAI_BASE_URL [--hold] [--city CITY]

It asks for the weather, runs the ``get_weather`` tool the model asks for and sends the result back:
two chat completions, each its own trace (no span of the app's own). ``--hold`` then prints ``held``
and sleeps until killed.
"""

from __future__ import annotations

import argparse
import json
import time

import openai

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("base_url")
    p.add_argument("--hold", action="store_true")
    p.add_argument("--city", default="Paris")
    args = p.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key="test", max_retries=0)
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": f"Weather in {args.city}?"}]
    first = client.chat.completions.create(model="gpt-test", messages=messages, tools=TOOLS)
    call = first.choices[0].message.tool_calls[0]
    messages.append({"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": call.function.name,
                                                          "arguments": call.function.arguments}}]})
    result = {"city": json.loads(call.function.arguments)["city"], "temp": 57}
    messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})
    answer = client.chat.completions.create(model="gpt-test", messages=messages, tools=TOOLS)
    print(answer.choices[0].message.content, flush=True)
    if args.hold:
        print("held", flush=True)
        while True:
            time.sleep(1)


if __name__ == "__main__":
    main()
