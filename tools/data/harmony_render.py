"""Harmony rendering in Python, byte-identical to the renderer the engine uses (HARMONY.md and the test
vectors in shared/testdata/harmony/). Pure Python 3, no dependencies.

A rendered conversation is a list of (text, trainable) segments: `trainable` marks the text the model itself
produces (what follows a `<|start|>assistant` prompt up to and including `<|call|>` or `<|return|>`), which
is where the training loss goes. Every segment boundary is also a pre-tokenizer boundary (a special token,
or between `assistant` and ` to=`), so tokenizing segment by segment gives the same ids as tokenizing the
whole text.
"""
import json

SPECIAL_TOKENS = ["<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>", "<|channel|>",
                  "<|start|>", "<|end|>", "<|message|>", "<|call|>"]

VALID_CHANNELS_LINE = "# Valid channels: analysis, commentary, final. Channel must be included for every message."
FUNCTIONS_CHANNEL_LINE = "Calls to these tools must go to the commentary channel: 'functions'."


def render_system(identity, knowledge_cutoff, current_date, reasoning_effort, has_functions):
    lines = []
    if identity:
        lines.append(identity)
    if knowledge_cutoff:
        lines.append("Knowledge cutoff: " + knowledge_cutoff)
    if current_date:
        lines.append("Current date: " + current_date)
    text = "\n".join(lines)
    text += "\n\nReasoning: " + reasoning_effort + "\n\n" + VALID_CHANNELS_LINE
    if has_functions:
        text += "\n" + FUNCTIONS_CHANNEL_LINE
    return "<|start|>system<|message|>" + text + "<|end|>"


def _type_expression(schema, indent):
    """A property's TypeScript type, as the engine writes it (src/harmony/harmony_tools.cpp)."""
    if "enum" in schema:
        return " | ".join(json.dumps(value) for value in schema["enum"])
    kind = schema.get("type", "any")
    if kind in ("integer", "number"):
        return "number"
    if kind in ("string", "boolean"):
        return kind
    if kind == "array":
        items = schema.get("items")
        if not items:
            return "any[]"
        item = _type_expression(items, indent)
        return "(" + item + ")[]" if " | " in item and not item.startswith("{") else item + "[]"
    if kind == "object":
        if not schema.get("properties"):
            return "object"
        return "{\n" + _properties(schema, indent + "  ") + indent + "}"
    raise ValueError("unsupported schema type in tool parameters: " + json.dumps(schema))


def _properties(schema, indent):
    out = ""
    required = set(schema.get("required", []))
    for name, prop in schema["properties"].items():
        if prop.get("description"):
            out += indent + "// " + prop["description"] + "\n"
        kind = _type_expression(prop, indent)
        out += indent + name + ("" if name in required else "?") + ": " + kind + ","
        if "default" in prop:
            default = prop["default"]
            out += " // default: " + (default if isinstance(default, str) and '"' in kind else json.dumps(default))
        out += "\n"
    return out


def render_function(tool):
    """One tool of the `functions` namespace as Harmony's TypeScript declaration."""
    out = ""
    if tool.get("description"):
        out += "// " + tool["description"] + "\n"
    parameters = tool.get("parameters")
    if not parameters or not parameters.get("properties"):
        return out + "type " + tool["name"] + " = () => any;\n"
    return out + "type " + tool["name"] + " = (_: {\n" + _properties(parameters, "") + "}) => any;\n"


def render_developer(instructions, tools):
    """None when the conversation has neither instructions nor tools (no developer message then)."""
    parts = []
    if instructions:
        parts.append("# Instructions\n\n" + instructions)
    if tools:
        namespace = "namespace functions {\n\n" + "".join(render_function(t) + "\n" for t in tools)
        namespace += "} // namespace functions"
        parts.append("# Tools\n\n## functions\n\n" + namespace)
    if not parts:
        return None
    return "<|start|>developer<|message|>" + "\n\n".join(parts) + "<|end|>"


def render_user(text):
    return "<|start|>user<|message|>" + text + "<|end|>"


def render_tool_result(tool_name, content):
    return ("<|start|>functions." + tool_name + " to=assistant<|channel|>commentary<|message|>"
            + content + "<|end|>")


def render_past_final(text):
    """An earlier turn's final answer as the renderer puts it in history (its analysis auto-dropped)."""
    return "<|start|>assistant<|channel|>final<|message|>" + text + "<|end|>"


def render_past_call(tool_name, arguments):
    """A tool call given back by the client (no reasoning with it)."""
    return ("<|start|>assistant to=functions." + tool_name + "<|channel|>commentary <|constrain|>json<|message|>"
            + arguments + "<|call|>")


class Conversation:
    """Accumulates segments. Prompt text and model output alternate; `assistant_turn` opens a model turn."""

    def __init__(self):
        self.segments = []

    def prompt(self, text):
        if text:
            self.segments.append((text, False))

    def model(self, text):
        self.segments.append((text, True))

    def assistant_turn(self, messages):
        """`messages`: list of (channel, text) or (channel, text, recipient). The last one ends the turn:
        a tool call ends with <|call|>, a final answer with <|return|>."""
        self.prompt("<|start|>assistant")
        out = ""
        for index, message in enumerate(messages):
            channel, text = message[0], message[1]
            recipient = message[2] if len(message) > 2 else None
            if index > 0:
                out += "<|start|>assistant"
            if recipient:
                out += " to=functions." + recipient + "<|channel|>" + channel + " <|constrain|>json"
            else:
                out += "<|channel|>" + channel
            out += "<|message|>" + text
            last = index == len(messages) - 1
            if recipient:
                out += "<|call|>"
            elif last and channel == "final":
                out += "<|return|>"
            else:
                out += "<|end|>"
        self.model(out)

    def text(self):
        return "".join(t for t, _ in self.segments)
