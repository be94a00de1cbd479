#!/usr/bin/env python3
"""A small hand-written probe set in the held-out format (what eval_torch.py / eval_engine.py read), written
as a new user would try beam-nano (issue 24): two plainly declared tools (weather, time), questions no
generator template produced, tool results whose keys differ from the training data's, arithmetic over the
four operations, and questions that need no tool. Pure Python 3.

  python3 tools/train/new_user_probes.py --out probes.jsonl
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data"))
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


def turn(kind, prompt, check):
    check["declared"] = [t["name"] for t in TOOLS]
    return {"kind": kind, "segments": [[prompt, False]], "turns": [{"prompt": prompt, "check": check}]}


def probes():
    out = []
    for question, tool, args in TOOL_QUESTIONS:
        schema = next(t for t in TOOLS if t["name"] == tool)["parameters"]
        out.append(turn("tool", frame() + render_user(question) + "<|start|>assistant",
                        {"type": "tool_call", "tool": tool, "parameters": schema, "args": args}))
    for question, tool, args, result, strings in TOOL_RESULTS:
        prompt = (frame() + render_user(question) + render_past_call(tool, json.dumps(args, ensure_ascii=False))
                  + render_tool_result(tool, json.dumps(result)) + "<|start|>assistant")
        out.append(turn("tool_answer", prompt, {"type": "final_contains", "strings": strings}))
    for question, answer, remainder, op in ARITHMETIC:
        check = {"type": "final_number", "answer": answer, "op": op}
        if remainder:
            check["remainder"] = remainder
        out.append(turn("arith_with_tools", frame() + render_user(question) + "<|start|>assistant", check))
    for question, strings in NO_TOOL:
        out.append(turn("tool_unneeded", frame() + render_user(question) + "<|start|>assistant",
                        {"type": "final_contains", "strings": strings}))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    with open(args.out, "w") as f:
        for probe in probes():
            f.write(json.dumps(probe, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
