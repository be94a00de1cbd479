#!/usr/bin/python3
"""Writes the seed corpora of tests/fuzz/corpus/<target>/ (seed-*; regression inputs of fixed findings are named
regression-* and written by hand). Small valid inputs of each format, from beamline's own example checkpoint where
there is one, so the fuzzer starts inside the formats rather than at random bytes."""
import json
import pathlib
import struct

here = pathlib.Path(__file__).resolve().parent
root = here.parent.parent
corpus = here / "corpus"


def write(target, name, data):
    path = corpus / target / f"seed-{name}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())


def safetensors(tensors, metadata=None):
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)  # data aligned to 8 bytes, as the writers do
    return struct.pack("<Q", len(text)) + text + data


write("safetensors_header", "one-f32", safetensors({"w": ("F32", [2], struct.pack("<2f", 1.0, -2.0))}))
write("safetensors_header", "mixed", safetensors(
    {"a.weight": ("BF16", [2, 2], bytes(8)), "b.bias": ("F32", [3], bytes(12)), "c": ("U8", [0], b""),
     "d.scale": ("F8_E4M3", [4], bytes(4))}, {"format": "pt"}))
write("safetensors_header", "empty", safetensors({}))

config = (root / "models/beam-nano/config.json").read_text()
write("model_config", "beam-nano", config)
minimal = json.loads(config)
for key in ("layer_types", "residual_scale", "bos_token_id", "pad_token_id"):
    minimal.pop(key)
minimal["eos_token_id"] = 4089
write("model_config", "defaults", json.dumps(minimal))
minimal["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128], "ignored_layers": ["lm_head"]}
write("model_config", "fp8", json.dumps(minimal))

# tokenizer.json: beam-nano's, cut to its byte alphabet, its first merges and their results (a valid, small file).
tokenizer = json.loads((root / "models/beam-nano/tokenizer.json").read_text())
vocab = tokenizer["model"]["vocab"]
keep = {token: id for token, id in vocab.items() if id < 256}
merges = []
for left, right in tokenizer["model"]["merges"][:40]:
    if left in keep and right in keep and left + right in vocab:
        merges.append([left, right])
        keep[left + right] = vocab[left + right]
small_ids = sorted(keep.values())
renumber = {old: new for new, old in enumerate(small_ids)}
tokenizer["model"]["vocab"] = {token: renumber[id] for token, id in keep.items()}
tokenizer["model"]["merges"] = merges
for number, added in enumerate(tokenizer["added_tokens"]):
    added["id"] = len(small_ids) + number
write("tokenizer_json", "beam-nano-small", json.dumps(tokenizer, ensure_ascii=False))
tokenizer["model"]["merges"] = [" ".join(pair) for pair in merges]  # the older "a b" form of merges
write("tokenizer_json", "merges-as-strings", json.dumps(tokenizer, ensure_ascii=False))
# The same without the long split regex (compiling it dominates a load): the fuzzer gets more executions from it.
tokenizer["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"String": " "}, "behavior": "Isolated", "invert": False},
    {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]}
tokenizer["model"]["merges"] = merges[:8]
tokenizer["model"]["vocab"] = {token: id for token, id in tokenizer["model"]["vocab"].items()
                               if id < 256 or any(token == left + right for left, right in merges[:8])}
write("tokenizer_json", "literal-split", json.dumps(tokenizer, ensure_ascii=False))

# Harmony token streams (fuzz_harmony_parser's encoding: first byte = options, 0xFF k = special token k).
special = {name: bytes([0xFF, k]) for k, name in enumerate(
    ["startoftext", "endoftext", "return", "constrain", "channel", "start", "end", "message", "call"])}
S = lambda name: special[name]
streams = {
    "analysis-final": S("start") + b"assistant" + S("channel") + b"analysis" + S("message") + b"think \xc3\xa9" +
    S("end") + S("start") + b"assistant" + S("channel") + b"final" + S("message") + b"Hi \xe6\x97\xa5!" + S("return"),
    "tool-call": S("start") + b"assistant to=functions.get_weather" + S("channel") + b"commentary " + S("constrain") +
    b"json" + S("message") + b'{"city":"Paris"}' + S("call"),
    "tool-result": S("start") + b"functions.get_weather to=assistant" + S("channel") + b"commentary" + S("message") +
    b'{"t":20}' + S("end"),
    "unterminated": S("start") + b"assistant" + S("channel") + b"final" + S("message") + b"cut sh",
}
for name, stream in streams.items():
    for options in (0, 1, 5):  # lenient; strict; strict with channels checked
        write("harmony_parser", f"{name}-{options}", bytes([options]) + stream)
write("harmony_parser", "role-given-3", bytes([3]) + S("channel") + b"final" + S("message") + b"ok" + S("return"))

# OpenAI requests (fuzz_openai_chat_request: an even first byte reads the sampling fields as chat's).
weather = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                                                "required": ["city"]}}}
requests = {
    "simple": {"model": "beam", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 16},
    "system-sampling": {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
                        "temperature": 0.7, "top_p": 0.9, "top_k": 20, "seed": 3, "stop": ["\n"], "n": 2,
                        "logprobs": True, "top_logprobs": 2, "stream": True, "stream_options": {"include_usage": True},
                        "reasoning_effort": "high"},
    "tools": {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [weather], "tool_choice": "auto"},
    "tool-round-trip": {"messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "reasoning_content": "Call the tool.", "content": None,
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "20 C"}], "tools": [weather],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
    "response-format": {"messages": [{"role": "developer", "content": [{"type": "text", "text": "JSON only"}]},
                                     {"role": "user", "content": "A city"}],
                        "response_format": {"type": "json_schema", "json_schema": {"name": "city", "strict": True,
                                            "schema": {"type": "object", "properties": {"name": {"type": "string"}}}}}},
    "structured-outputs": {"messages": [{"role": "user", "content": "yes or no"}],
                           "structured_outputs": {"choice": ["yes", "no"]}, "max_completion_tokens": 4},
}
for name, request in requests.items():
    write("openai_chat_request", name, " " + json.dumps(request))  # a space first: chat's sampling fields
write("openai_chat_request", "completions", "!" + json.dumps({"prompt": "Once", "logprobs": 2, "max_tokens": 8}))
