#!/usr/bin/env python3
"""A small hand-written probe set in the held-out format (what eval_torch.py / eval_engine.py read), written
as a new user would try beam-nano (issue 24): two plainly declared tools (weather, time), questions no
generator template produced, tool results whose keys differ from the training data's, arithmetic over the
four operations, and questions that need no tool. Pure Python 3.

  python3 tools/train/new_user_probes.py --out probes.jsonl                 # for eval_torch.py / eval_engine.py
  python3 tools/train/new_user_probes.py --server http://127.0.0.1:8000     # through `beamline serve`
"""
import argparse
import json
import os
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data"))
from harmony_check import score, summarize  # noqa: E402
from generate import BEAM_CUTOFF, BEAM_IDENTITY  # noqa: E402
from harmony_render import (render_developer, render_past_call, render_system, render_tool_result,  # noqa: E402
                            render_user)

WEATHER = {"name": "get_weather", "description": "Get the current weather in a given location",
           "parameters": {"type": "object", "properties": {
               "location": {"type": "string", "description": "City name"},
               "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["location"]}}
TIME = {"name": "get_current_time", "description": "Get the current time in a given timezone",
        "parameters": {"type": "object", "properties": {
            "timezone": {"type": "string", "description": "IANA timezone, e.g. Europe/Paris"}},
            "required": ["timezone"]}}
TOOLS = [WEATHER, TIME]

TOOL_QUESTIONS = [
    ("what's the weather like in Lisbon?", "get_weather", {"location": "Lisbon"}),
    ("Is it sunny in Kyoto right now?", "get_weather", {"location": "Kyoto"}),
    ("What time is it in Tokyo?", "get_current_time", {"timezone": "Asia/Tokyo"}),
    ("Tell me the time in Europe/Berlin", "get_current_time", {"timezone": "Europe/Berlin"}),
    ("how warm is it in Reykjavík", "get_weather", {"location": "Reykjavík"}),
    ("I'm flying to Madrid tonight, what's the weather there?", "get_weather", {"location": "Madrid"}),
    ("current time in New York please", "get_current_time", {"timezone": "America/New_York"}),
    ("Weather for Zürich in fahrenheit", "get_weather", {"location": "Zürich", "unit": "fahrenheit"}),
    ("Could you tell me what time it is in Sydney?", "get_current_time", {"timezone": "Australia/Sydney"}),
    ("Is it raining in Seattle?", "get_weather", {"location": "Seattle"}),
]
TOOL_RESULTS = [
    ("What's the weather in Paris?", "get_weather", {"location": "Paris"},
     {"temperature": 17, "unit": "celsius", "conditions": "light rain"}, ["17", "light rain"]),
    ("weather in Oslo?", "get_weather", {"location": "Oslo"}, {"temp_c": -3, "sky": "snow showers"},
     ["-3", "snow showers"]),
    ("How is the weather in Rome?", "get_weather", {"location": "Rome"},
     {"current": {"temperature": 24.5, "conditions": "clear sky"}, "units": "metric"}, ["24.5", "clear sky"]),
    ("What time is it in Tokyo?", "get_current_time", {"timezone": "Asia/Tokyo"},
     {"timezone": "Asia/Tokyo", "local_time": "21:42"}, ["21:42"]),
    ("Time in London?", "get_current_time", {"timezone": "Europe/London"}, {"time": "08:15", "dst": False},
     ["08:15"]),
]
ARITHMETIC = [("What is 144 divided by 12?", "12", None, "/"), ("What's 7 times 8?", "56", None, "*"),
              ("Compute 4821 - 3967", "854", None, "-"), ("23 * 47 = ?", "1081", None, "*"),
              ("What is 1000 / 7?", "142", "6", "/"), ("How much is 3456 + 789?", "4245", None, "+"),
              ("What is 12 times 34?", "408", None, "*"), ("Calculate 9000 - 4567", "4433", None, "-"),
              ("What's 96 divided by 4?", "24", None, "/"), ("What is -45 + 120?", "75", None, "+")]
NO_TOOL = [("What is the capital of Spain?", ["Madrid"]), ("Hi!", []), ("Who are you?", [])]


def frame():
    return (render_system(BEAM_IDENTITY, BEAM_CUTOFF, "2026-12-02", "medium", True)
            + render_developer(None, TOOLS))


def probe(kind, messages, check):
    """One probe: the OpenAI-style messages a client sends, the Harmony prompt they render to, and the check."""
    prompt = frame()
    for message in messages:
        if message["role"] == "user":
            prompt += render_user(message["content"])
        elif message["role"] == "assistant":
            call = message["tool_calls"][0]["function"]
            prompt += render_past_call(call["name"], call["arguments"])
        else:
            prompt += render_tool_result(message["name"], message["content"])
    check["declared"] = [t["name"] for t in TOOLS]
    prompt += "<|start|>assistant"
    return {"kind": kind, "messages": messages, "segments": [[prompt, False]],
            "turns": [{"prompt": prompt, "check": check}]}


def probes():
    out = []
    for question, tool, args in TOOL_QUESTIONS:
        schema = next(t for t in TOOLS if t["name"] == tool)["parameters"]
        out.append(probe("tool", [{"role": "user", "content": question}],
                         {"type": "tool_call", "tool": tool, "parameters": schema, "args": args}))
    for index, (question, tool, args, result, strings) in enumerate(TOOL_RESULTS):
        call = {"id": f"call_{index}", "type": "function",
                "function": {"name": tool, "arguments": json.dumps(args, ensure_ascii=False)}}
        out.append(probe("tool_answer", [{"role": "user", "content": question},
                                         {"role": "assistant", "content": None, "tool_calls": [call]},
                                         {"role": "tool", "tool_call_id": call["id"], "name": tool,
                                          "content": json.dumps(result)}],
                         {"type": "final_contains", "strings": strings}))
    for question, answer, remainder, op in ARITHMETIC:
        check = {"type": "final_number", "answer": answer, "op": op}
        if remainder:
            check["remainder"] = remainder
        out.append(probe("arith_with_tools", [{"role": "user", "content": question}], check))
    for question, strings in NO_TOOL:
        out.append(probe("tool_unneeded", [{"role": "user", "content": question}],
                         {"type": "final_contains", "strings": strings}))
    return out


def as_completion(choice):
    """A chat completion's message written back as the Harmony completion harmony_check.py scores."""
    message = choice["message"]
    text = ""
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if reasoning:
        text += "<|channel|>analysis<|message|>" + reasoning + "<|end|><|start|>assistant"
    if message.get("tool_calls"):
        call = message["tool_calls"][0]["function"]
        return text + (" to=functions." + call["name"] + "<|channel|>commentary <|constrain|>json<|message|>"
                       + call["arguments"] + "<|call|>")
    return text + "<|channel|>final<|message|>" + (message.get("content") or "") + "<|return|>"


def run_against_server(base, model, probes_list):
    """Sends every probe through /v1/chat/completions at temperature 0 and scores the answers."""
    results = []
    for item in probes_list:
        body = {"model": model, "messages": item["messages"], "tools": [{"type": "function", "function": t}
                                                                        for t in TOOLS],
                "temperature": 0, "max_tokens": 400}
        request = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=600) as response:
            choice = json.load(response)["choices"][0]
        turn = item["turns"][0]
        completion = as_completion(choice)
        results.append({"kind": item["kind"], "check": turn["check"], "completion": completion,
                        **score(completion, turn["check"], turn["prompt"])})
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="write the probes as held-out JSONL (for eval_torch.py / eval_engine.py)")
    parser.add_argument("--server", help="or score a running `beamline serve`, e.g. http://127.0.0.1:8000")
    parser.add_argument("--model", default="beam-nano", help="model name sent to the server")
    parser.add_argument("--json", help="with --server: write per-probe results here")
    args = parser.parse_args()
    if args.out:
        with open(args.out, "w") as f:
            for item in probes():
                f.write(json.dumps(item, ensure_ascii=False) + "\n")
    if args.server:
        results = run_against_server(args.server.rstrip("/"), args.model, probes())
        summarize(results)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main()
