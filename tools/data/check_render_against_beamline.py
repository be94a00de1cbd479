#!/usr/bin/env python3
"""Checks that `beamline harmony render` produces exactly the text harmony_render.py gives the training data,
on random conversation frames of the generator (identities, dates, efforts, instructions, 2-4 tool
declarations, and the tool loop: analysis, call, tool result). Pure Python 3.

  python3 tools/data/check_render_against_beamline.py --beamline build/apps/beamline/beamline [--count 200]
"""
import argparse
import difflib
import json
import os
import random
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import generate  # noqa: E402
from harmony_render import (render_developer, render_past_call, render_system, render_tool_result,  # noqa: E402
                            render_user)


def case(rng):
    """(conversation in Harmony's JSON form, the Python rendering for completion by the assistant)."""
    tools = generate.tool_set(rng, rng.choice(generate.CALLABLE)) if rng.random() < 0.8 else []
    declarations = [t.declaration() for t in tools]
    frame = generate.Frame(rng, tools=declarations)
    system = {"type": "system_content", "model_identity": frame.identity, "reasoning_effort": frame.effort.capitalize(),
              "channel_config": {"valid_channels": ["analysis", "commentary", "final"], "channel_required": True}}
    if frame.cutoff:
        system["knowledge_cutoff"] = frame.cutoff
    if frame.date:
        system["conversation_start_date"] = frame.date
    messages = [{"role": "system", "content": [system]}]
    text = render_system(frame.identity, frame.cutoff, frame.date, frame.effort, bool(declarations))
    developer = render_developer(frame.instructions, declarations)
    if developer:
        item = {"type": "developer_content"}
        if frame.instructions:
            item["instructions"] = frame.instructions
        if declarations:
            item["tools"] = {"functions": {"name": "functions", "tools": declarations}}
        messages.append({"role": "developer", "content": [item]})
        text += developer
    question = "What's the weather in Paris?"
    messages.append({"role": "user", "content": [{"type": "text", "text": question}]})
    text += render_user(question)
    if tools:
        name, args, result = tools[0].name, '{"city": "Paris"}', '{"temperature": 18}'
        messages += [
            {"role": "assistant", "channel": "analysis", "content": [{"type": "text", "text": "Call the tool."}]},
            {"role": "assistant", "channel": "commentary", "recipient": "functions." + name,
             "content_type": "<|constrain|>json", "content": [{"type": "text", "text": args}]},
            {"role": "tool", "name": "functions." + name, "channel": "commentary", "recipient": "assistant",
             "content": [{"type": "text", "text": result}]}]
        text += ("<|start|>assistant<|channel|>analysis<|message|>Call the tool.<|end|>"
                 + render_past_call(name, args) + render_tool_result(name, result))
    return {"messages": messages}, text + "<|start|>assistant"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--beamline", required=True)
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    for index in range(args.count):
        conversation, expected = case(rng)
        done = subprocess.run([args.beamline, "harmony", "render", "--conversation", "-", "--next-role", "assistant"],
                              input=json.dumps(conversation), capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"beamline harmony render failed: {done.stderr.strip()}")
        rendered = done.stdout.rstrip("\n")
        if rendered != expected:
            print("\n".join(difflib.unified_diff(expected.split("\n"), rendered.split("\n"), "python", "beamline",
                                                 lineterm="")))
            sys.exit(f"case {index}: beamline's rendering differs from harmony_render.py")
    print(f"{args.count} conversations: beamline harmony render == harmony_render.py")


if __name__ == "__main__":
    main()
