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


def score(completion, check):
    """-> dict with valid (bool), ok (bool: the check passed), and details."""
    try:
        messages = parse_completion(completion)
    except ValueError as error:
        return {"valid": False, "ok": False, "error": str(error)}
    recipient, channel, content, terminator = messages[-1]
    result = {"valid": True}
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
        numbers = NUMBER.findall(content)
        result["ok"] = bool(numbers) and float(numbers[-1]) == float(check["answer"])
    elif kind == "final_contains":
        result["ok"] = all(s in content for s in check["strings"])
    else:
        raise ValueError(f"unknown check type {kind}")
    return result


def pct(part, whole):
    return f"{100.0 * part / whole:.1f}% ({part}/{whole})" if whole else "n/a"


def summarize(results):
    """Prints per-kind and overall figures of scored turns ({kind, check, completion, **score(...)})."""
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
    other = [r for r in results if r["check"]["type"] == "final_contains"]
    print(f"valid Harmony:                         {pct(sum(r['valid'] for r in results), len(results))}")
    print(f"tool call: right function + schema-valid JSON args: {pct(sum(r['ok'] for r in tool), len(tool))}")
    print(f"tool call: exactly the expected arguments:          "
          f"{pct(sum(r.get('args_exact', False) for r in tool), len(tool))}")
    print(f"arithmetic answers correct:            {pct(sum(r['ok'] for r in arith), len(arith))}")
    print(f"arithmetic + unit conversion correct:  {pct(sum(r['ok'] for r in numeric), len(numeric))}")
    print(f"other checks (facts, tool results in answers): {pct(sum(r['ok'] for r in other), len(other))}")
    for r in [r for r in results if not r["ok"]][:8]:
        print("FAIL", r["kind"], r.get("error", ""), repr(r["completion"][-300:]))
