"""Scores a model's completion of a held-out turn (pure Python; shared by the PyTorch-side eval and any
engine-side eval that feeds it the completion text).

A completion is the text the model produced after a prompt ending in `<|start|>assistant`, special tokens
written literally, up to and including its stop token. It is valid Harmony when it is a sequence of
messages `[<|start|>assistant]{header}<|message|>{content}{terminator}` (the first without the
`<|start|>assistant`), every header is ` to=functions.NAME<|channel|>commentary <|constrain|>json` or
`<|channel|>analysis|commentary|final`, inner messages end with `<|end|>`, and the last ends with
`<|call|>` (a tool call) or `<|return|>` (on the final channel).
"""
import json
import re

HEADER = re.compile(r"^(?: to=functions\.([A-Za-z0-9_\-]+))?<\|channel\|>(analysis|commentary|final)"
                    r"(?: <\|constrain\|>json)?$")
TERMINATORS = ("<|end|>", "<|call|>", "<|return|>")
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def parse_completion(text):
    """[(recipient or None, channel, content, terminator)], or raises ValueError naming the problem."""
    messages, pos, first = [], 0, True
    while pos < len(text):
        if not first:
            if not text.startswith("<|start|>assistant", pos):
                raise ValueError(f"expected <|start|>assistant at {pos}: {text[pos:pos + 40]!r}")
            pos += len("<|start|>assistant")
        first = False
        header_end = text.find("<|message|>", pos)
        if header_end < 0:
            raise ValueError("header without <|message|>")
        match = HEADER.match(text[pos:header_end])
        if not match:
            raise ValueError(f"bad header {text[pos:header_end]!r}")
        recipient, channel = match.group(1), match.group(2)
        body_start = header_end + len("<|message|>")
        ends = [(text.find(t, body_start), t) for t in TERMINATORS]
        ends = [(i, t) for i, t in ends if i >= 0]
        if not ends:
            raise ValueError("message without terminator")
        end, terminator = min(ends)
        content = text[body_start:end]
        if "<|" in content:
            raise ValueError(f"special token inside content: {content[:60]!r}")
        if recipient and terminator != "<|call|>":
            raise ValueError("a tool call must end with <|call|>")
        if not recipient and terminator == "<|call|>":
            raise ValueError("<|call|> without a recipient")
        if terminator == "<|return|>" and channel != "final":
            raise ValueError("<|return|> outside the final channel")
        messages.append((recipient, channel, content, terminator))
        pos = end + len(terminator)
        if terminator != "<|end|>":
            if pos != len(text):
                raise ValueError("text after the stop token")
            return messages
    raise ValueError("no stop token (<|call|> or <|return|>)")


def schema_errors(value, schema):
    """Errors of a JSON value against the subset of JSON schema tool declarations use here."""
    kind = schema.get("type")
    if "enum" in schema and value not in schema["enum"]:
        return [f"{value!r} not in {schema['enum']}"]
    if kind == "object":
        if not isinstance(value, dict):
            return ["not an object"]
        errors = [f"missing {k}" for k in schema.get("required", []) if k not in value]
        properties = schema.get("properties", {})
        for key, item in value.items():
            if key not in properties:
                errors.append(f"unknown key {key}")
            else:
                errors += [f"{key}: {e}" for e in schema_errors(item, properties[key])]
        return errors
    checks = {"string": lambda v: isinstance(v, str), "boolean": lambda v: isinstance(v, bool),
              "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
              "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
              "array": lambda v: isinstance(v, list)}
    if kind in checks and not checks[kind](value):
        return [f"{value!r} is not {kind}"]
    return []


IDENTIFIER = re.compile(r"(?<![\w.@/-])(?:functions\.)?([A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+|[a-z]+[A-Z][A-Za-z0-9]*)"
                        r"(?![\w@/-])")


def undeclared_references(messages, check, prompt):
    """Tool-like names the completion uses that the prompt never declared: a call's recipient outside
    `declared`, or an identifier (snake_case or camelCase) written in any message that appears nowhere in
    the prompt (so keys of a tool result or parameter names the prompt shows are fine)."""
    declared = set(check.get("declared", []))
    found = [r for r, _, _, _ in messages if r and r not in declared]
    if prompt is not None:
        for recipient, _, content, _ in messages:
            if recipient:
                continue
            found += [name for name in IDENTIFIER.findall(content) if name not in declared and name not in prompt]
    return found


def score(completion, check, prompt=None):
    """-> dict with valid (bool), ok (bool: the check passed), undeclared (names of tools the completion
    refers to that the prompt does not declare; judged only where check lists "declared"), and details."""
    try:
        messages = parse_completion(completion)
    except ValueError as error:
        return {"valid": False, "ok": False, "error": str(error)}
    recipient, channel, content, terminator = messages[-1]
    result = {"valid": True}
    if "declared" in check:
        result["undeclared"] = undeclared_references(messages, check, prompt)
    kind = check["type"]
    if kind == "tool_call":
        result["right_tool"] = recipient == check["tool"]
        try:
            args = json.loads(content)
            errors = schema_errors(args, check["parameters"] or {"type": "object"})
        except json.JSONDecodeError as error:
            args, errors = None, [f"JSON: {error}"]
        result["schema_ok"] = not errors
        result["args_exact"] = args == check["args"]
        result["ok"] = result["right_tool"] and result["schema_ok"]
        if errors:
            result["error"] = "; ".join(errors)
        return result
    if terminator != "<|return|>":
        result["ok"] = False
        result["error"] = "expected a final answer, got a tool call"
        return result
    if kind == "final_number":
        numbers = [float(n) for n in NUMBER.findall(content)]
        expected = [float(check["answer"])] + ([float(check["remainder"])] if "remainder" in check else [])
        result["ok"] = numbers[-len(expected):] == expected
    elif kind == "final_contains":
        result["ok"] = all(s in content for s in check["strings"])
    else:
        raise ValueError(f"unknown check type {kind}")
    return result


def pct(part, whole):
    return f"{100.0 * part / whole:.1f}% ({part}/{whole})" if whole else "n/a"


def summarize(results):
    """Prints per-kind and headline figures of scored turns ({kind, check, completion, **score(...)});
    returns the headline figures as {name: [passed, total]}."""
    by_kind = {}
    for r in results:
        by_kind.setdefault(r["kind"], []).append(r)
    for kind in sorted(by_kind):
        rs = by_kind[kind]
        print(f"  {kind:18s} valid {pct(sum(r['valid'] for r in rs), len(rs))}  "
              f"check passed {pct(sum(r['ok'] for r in rs), len(rs))}")
    tool = [r for r in results if r["check"]["type"] == "tool_call"]
    numeric = [r for r in results if r["check"]["type"] == "final_number"]
    arith = [r for r in numeric if r["kind"] in ("arith", "arith_with_tools")]
    quoting = [r for r in results if r["check"]["type"] == "final_contains" and r["check"]["strings"]
               and r["kind"] in ("tool", "tool_followup", "tool_answer")]
    other = [r for r in results if r["check"]["type"] == "final_contains"]
    judged = [r for r in results if "declared" in r["check"]]
    figures = {
        "valid Harmony": [sum(r["valid"] for r in results), len(results)],
        "tool call: right function + schema-valid JSON args": [sum(r["ok"] for r in tool), len(tool)],
        "tool call: exactly the expected arguments": [sum(r.get("args_exact", False) for r in tool), len(tool)],
        "arithmetic answers correct": [sum(r["ok"] for r in arith), len(arith)],
    }
    for label, unseen in (("unseen family", True), ("training family", False)):
        some = [r for r in tool if r["check"].get("unseen_family") is unseen]
        if some and any(r["check"].get("unseen_family") for r in tool):
            figures[f"tool call, {label}: right function + schema-valid JSON args"] = [sum(r["ok"] for r in some),
                                                                                       len(some)]
    for op in "+-*/":
        some = [r for r in arith if r["check"].get("op") == op]
        if some:
            figures[f"arithmetic {op}"] = [sum(r["ok"] for r in some), len(some)]
    figures.update({
        "arithmetic + unit conversion correct": [sum(r["ok"] for r in numeric), len(numeric)],
        "answers after a tool result quote its values": [sum(r["ok"] for r in quoting), len(quoting)],
        "other checks (facts, tool results in answers)": [sum(r["ok"] for r in other), len(other)],
        "completions naming an undeclared tool": [sum(bool(r.get("undeclared")) for r in judged), len(judged)],
    })
    unseen_quoting = [r for r in quoting if r["check"].get("unseen_family")]
    if unseen_quoting:
        figures["answers after an unseen family's result quote its values"] = [sum(r["ok"] for r in unseen_quoting),
                                                                               len(unseen_quoting)]
    for name, (part, whole) in figures.items():
        print(f"{name + ':':52s} {pct(part, whole)}")
    for r in [r for r in results if not r["ok"]][:12]:
        print("FAIL", r["kind"], r.get("error", ""), repr(r["completion"][-300:]))
    for r in [r for r in judged if r.get("undeclared")][:5]:
        print("UNDECLARED", r["undeclared"], repr(r["completion"][-300:]))
    return figures
