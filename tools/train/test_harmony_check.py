#!/usr/bin/env python3
"""Self-test of harmony_check.py on generated data: every reference completion must score valid and
correct, and corrupted ones (wrong tool, bad JSON, wrong number, missing stop token, stray header) must not.

  python3 tools/train/test_harmony_check.py      (generates 600 train, held-out and OOD conversations in memory)
"""
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "data"))
import generate  # noqa: E402
from harmony_check import score  # noqa: E402


def reference_completions(example):
    """(check, completion) for each turn: the trainable segment that follows the turn's prompt."""
    out = []
    for turn in example["turns"]:
        text = ""
        for index, (segment, trainable) in enumerate(example["segments"]):
            text += segment
            if text == turn["prompt"]:
                following, is_model = example["segments"][index + 1]
                assert is_model, "a prompt must be followed by model output"
                out.append((turn["check"], following, turn["prompt"]))
                break
        else:
            raise AssertionError("turn prompt is not a segment prefix")
    return out


def main():
    rng = random.Random(12345)
    checked = 0
    for index in range(600):
        example = json.loads(json.dumps(generate.make_example(rng, ("heldout", "ood", "train")[index % 3])))
        for check, completion, prompt in reference_completions(example):
            result = score(completion, check, prompt)
            assert result["valid"] and result["ok"], (result, completion)
            assert result["undeclared"] == [], (result, completion)
            assert score(completion.replace("<|message|>", "<|message|>see lookup_secret_tool: ", 1), check,
                         prompt)["undeclared"] == ["lookup_secret_tool"]
            if check["type"] == "tool_call":
                assert result["args_exact"]
                assert not score(completion.replace("to=functions." + check["tool"], "to=functions.nope"),
                                 check)["ok"]
                assert not score(completion.replace("<|message|>{", "<|message|>{{"), check)["ok"]
                assert not score(completion.replace("<|call|>", ""), check)["valid"]
            elif check["type"] == "final_number":
                head, _, final = completion.rpartition("<|message|>")
                wrong = head + "<|message|>" + final.replace(check.get("remainder", check["answer"]),
                                                             str(int(check.get("remainder", check["answer"])) + 1))
                assert not score(wrong, check)["ok"]
            assert not score("<|channel|>final" + completion, check)["valid"]
            assert not score(completion.replace("<|return|>", "<|end|>").replace("<|call|>", "<|end|>"),
                             check)["valid"]
            checked += 1
    print(f"{checked} reference completions score valid and correct; corruptions are caught")


if __name__ == "__main__":
    main()
