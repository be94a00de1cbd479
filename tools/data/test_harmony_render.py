#!/usr/bin/env python3
"""Checks harmony_render.py against the upstream Harmony vectors in shared/testdata/harmony/.

Runs every render case whose features the Python renderer covers (system/developer/user/assistant/tool
messages of the shapes the generator makes); exits non-zero on a mismatch.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harmony_render import render_developer, render_system, render_user  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
VECTORS = os.path.join(ROOT, "shared", "testdata", "harmony")
if not os.path.isdir(VECTORS):
    VECTORS = os.path.join(ROOT, "..", "shared", "testdata", "harmony")


def render_case(case):
    messages = case["conversation"]["messages"]
    has_functions = any(m["role"] == "developer" and m["content"][0].get("tools", {}).get("functions")
                        for m in messages)
    out = ""
    for message in messages:
        content = message["content"]
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        item = content[0]
        if message["role"] == "system":
            if set(item.get("tools") or {}) - {"functions"}:
                return None
            effort = item.get("reasoning_effort")
            channels = item.get("channel_config", {}).get("valid_channels")
            if channels != ["analysis", "commentary", "final"] or effort is None:
                return None
            out += render_system(item.get("model_identity"), item.get("knowledge_cutoff"),
                                 item.get("conversation_start_date"), effort.lower(), has_functions)
        elif message["role"] == "developer":
            tools = (item.get("tools") or {}).get("functions", {}).get("tools")
            # the generator never emits oneOf/nullable/title/examples schemas (the kitchensink tool)
            tools = tools and [t for t in tools if t["name"] != "kitchensink"]
            out += render_developer(item.get("instructions"), tools)
        elif message["role"] == "user":
            out += render_user(item["text"])
        else:
            return None
    return out + "<|start|>" + case["next_role"]


def main():
    cases = json.load(open(os.path.join(VECTORS, "cases.json")))
    checked = 0
    for case in cases:
        if case["kind"] != "render_completion":
            continue
        rendered = render_case(case)
        if rendered is None:
            continue
        expected = open(os.path.join(VECTORS, case["expected_file"])).read().rstrip()
        if "kitchensink" in expected:
            start = expected.index("// A function with various complex schemas.")
            expected = expected[:start] + expected[expected.index("} // namespace functions"):]
        if rendered != expected:
            print("MISMATCH", case["id"])
            print(repr(rendered))
            print(repr(expected))
            sys.exit(1)
        checked += 1
    print(f"{checked} render cases match")
    if checked < 9:
        sys.exit("too few cases were checked")


if __name__ == "__main__":
    main()
