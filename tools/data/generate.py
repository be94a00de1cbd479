#!/usr/bin/env python3
"""Synthetic Harmony conversations for training beam-nano (v2). Pure Python 3, no dependencies.

  python3 tools/data/generate.py --out DIR --train 300000 --heldout 1000 --ood 1000 [--seed 1] [--workers N]

writes DIR/train.jsonl, DIR/heldout.jsonl (in distribution: new draws of the training templates and tool
families) and DIR/ood.jsonl (out of distribution: tool families and question templates training never
sees, see tool_families.py). One JSON object a line:
  segments  [[text, trainable], ...]    the rendered conversation (see harmony_render.py)
  kind      the task family (arith, convert, qa_table, qa_fact, chat, tool, tool_followup, tool_unneeded,
            arith_with_tools, no_tool)
  turns     one entry per model turn: {"prompt": the text before it (ends with <|start|>assistant),
            "check": what a correct answer satisfies}; checks are
              {"type": "tool_call", "tool": NAME, "parameters": JSON schema, "args": expected arguments}
              {"type": "final_number", "answer": "632"[, "remainder": "3"]}
              {"type": "final_contains", "strings": [...]}   (every string appears in the final message)
            and every check lists "declared": the tool names the prompt declares, and "tools": their names and
            parameters (a constrained eval's tools); a tool request's checks add "family" (the requested tool's
            family) and "unseen_family" (true for the OOD families training never sees).
Held-out arithmetic operands are disjoint from training's (operand pairs whose hash is 0 mod 10).
"""
import argparse
import json
import multiprocessing
import os
import random
import re
import sys
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import arith  # noqa: E402
import tool_families as tf  # noqa: E402
from harmony_render import (Conversation, render_developer, render_past_call, render_past_final,  # noqa: E402
                            render_system, render_tool_result, render_user)

BEAM_IDENTITY = "You are Beam, a large language model trained by Reflection AI."
BEAM_CUTOFF = "2026-06"
OTHER_IDENTITIES = ["You are ChatGPT, a large language model trained by OpenAI.", "You are a helpful assistant.",
                    "You are Beam, a helpful assistant.", "You are Nova, a friendly assistant made by Acme Labs.",
                    "You are a concise and accurate assistant."]
INSTRUCTIONS = ["You are a concise assistant.", "Answer briefly.", "Always be polite.", "Be helpful and accurate.",
                "Keep answers short and clear.", "You help users with everyday questions.",
                "Respond in plain English.", "Use the tools when they help.", "Answer the user's questions.",
                "You are a travel assistant.", "Give direct answers.", "Be friendly.",
                "You are an assistant for a small company.", "Only call a tool when you need live data."]
CAPITALS = {"France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid", "Japan": "Tokyo",
            "China": "Beijing", "India": "New Delhi", "Russia": "Moscow", "Canada": "Ottawa", "Brazil": "Brasilia",
            "Australia": "Canberra", "Egypt": "Cairo", "Kenya": "Nairobi", "Mexico": "Mexico City",
            "Argentina": "Buenos Aires", "Norway": "Oslo", "Sweden": "Stockholm", "Finland": "Helsinki",
            "Poland": "Warsaw", "Greece": "Athens", "Portugal": "Lisbon", "Ireland": "Dublin", "Austria": "Vienna",
            "Turkey": "Ankara", "South Korea": "Seoul", "Thailand": "Bangkok", "Peru": "Lima", "Chile": "Santiago",
            "Colombia": "Bogota", "the United Kingdom": "London", "the United States": "Washington, D.C.",
            "Switzerland": "Bern", "the Netherlands": "Amsterdam", "Belgium": "Brussels", "Hungary": "Budapest",
            "Iceland": "Reykjavik", "New Zealand": "Wellington", "Nigeria": "Abuja", "Vietnam": "Hanoi"}
CALLABLE = [f.name for f in tf.TRAIN]


def j(value):
    return json.dumps(value, ensure_ascii=False)


# ---------------------------------------------------------------- how users write

def typo(rng, word):
    if len(word) < 4 or not word.isalpha():
        return word
    i = rng.randint(1, len(word) - 2)
    roll = rng.random()
    if roll < 0.4:
        return word[:i] + word[i + 1] + word[i] + word[i + 2:]
    if roll < 0.7:
        return word[:i] + word[i + 1:]
    return word[:i] + word[i] + word[i:]


def noisy(rng, template):
    """Casing, punctuation, typos and fillers on a template's own words (slots stay intact: their values
    are what the call must copy)."""
    if rng.random() < 0.6:
        return template
    parts = re.split(r"(\{[a-z_]+\})", template)
    out = []
    for part in parts:
        if part.startswith("{"):
            out.append(part)
            continue
        words = part.split(" ")
        words = [typo(rng, w) if rng.random() < 0.12 else w for w in words]
        out.append(" ".join(words))
    text = "".join(out)
    if rng.random() < 0.3:
        text = text.lower()
    if rng.random() < 0.3:
        text = text.rstrip("?.!")
    if rng.random() < 0.15:
        text = text.replace("'", "")
    if rng.random() < 0.2:
        text = rng.choice(["hey, ", "Hi! ", "quick question: ", "Please, ", "ok so ", "Hello. "]) + text
    if rng.random() < 0.15:
        text += rng.choice([" thanks", " pls", " Thank you!", " :)", " asap"])
    return text


def fill(template, phrases):
    return re.sub(r"\{([a-z_]+)\}", lambda m: phrases[m.group(1)], template)




# ---------------------------------------------------------------- the conversation frame

class Frame:
    """System + developer settings of one conversation, drawn at random."""

    def __init__(self, rng, tools=None, instructions=None, force_no_instructions=False):
        self.identity = BEAM_IDENTITY if rng.random() < 0.75 else rng.choice(OTHER_IDENTITIES)
        self.cutoff = BEAM_CUTOFF if rng.random() < 0.75 else rng.choice(["2024-06", "2025-01", "2023-10", None])
        self.date = (f"{rng.randint(2024, 2027)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
                     if rng.random() < 0.8 else None)
        self.effort = rng.choices(["low", "medium", "high"], [0.3, 0.45, 0.25])[0]
        if instructions is None and not force_no_instructions and rng.random() < 0.4:
            instructions = rng.choice(INSTRUCTIONS)
        self.instructions = instructions
        self.tools = tools or []

    def declared(self):
        return [t["name"] for t in self.tools]

    def declared_tools(self):
        """Name and parameters of each declared tool: what a constrained eval holds the model's calls to."""
        return [{"name": t["name"], "parameters": t.get("parameters")} for t in self.tools]

    def start(self, rng, history=True):
        conv = Conversation()
        conv.prompt(render_system(self.identity, self.cutoff, self.date, self.effort, bool(self.tools)))
        conv.prompt(render_developer(self.instructions, self.tools))
        if history and rng.random() < 0.15:
            question, answer = small_talk_exchange(rng, self)
            conv.prompt(render_user(question) + render_past_final(answer))
        return conv


def identity_answer(frame):
    ident = frame.identity
    if ident.startswith("You are "):
        return "I am " + ident[len("You are "):]
    return "I am an AI assistant."


def small_talk_exchange(rng, frame):
    """A short earlier turn for multi-turn prompts (its analysis is dropped, as the renderer does)."""
    choice = rng.randint(0, 3)
    if choice == 0:
        return rng.choice(["Hi!", "Hello", "Hey there", "Good morning!"]), rng.choice(
            ["Hello! How can I help you today?", "Hi! What can I do for you?", "Hello! How can I help?"])
    if choice == 1:
        country = rng.choice(list(CAPITALS))
        return f"What is the capital of {country}?", f"The capital of {country} is {CAPITALS[country]}."
    if choice == 2:
        a, b = rng.randint(1, 50), rng.randint(1, 50)
        return f"What is {a} + {b}?", f"{a} + {b} = {a + b}."
    return "Who are you?", identity_answer(frame)


def single_turn(rng, frame, question, analysis, final, check, history=True):
    conv = frame.start(rng, history)
    conv.prompt(render_user(question))
    prompt = conv.text() + "<|start|>assistant"
    conv.assistant_turn([("analysis", analysis), ("final", final)])
    check["declared"] = frame.declared()
    check["tools"] = frame.declared_tools()
    return conv, [{"prompt": prompt, "check": check}]


# ---------------------------------------------------------------- arithmetic

ARITH_QUESTIONS = {
    "+": ["What is {a} + {b}?", "Compute {a} + {b}.", "Add {a} and {b}.", "What is {a} plus {b}?",
          "Calculate {a}+{b}", "{a} + {b} = ?", "What's the sum of {a} and {b}?", "How much is {a} + {b}?",
          "I have {a} apples and buy {b} more. How many apples do I have now?", "{a}+{b}",
          "what's {a} plus {b}", "Sum {a} and {b}.", "If you add {b} to {a}, what do you get?",
          "A library has {a} books and receives {b} new ones. How many books are there?",
          "Total of {a} and {b}?", "Please add {a} to {b}."],
    "-": ["What is {a} - {b}?", "Compute {a} - {b}.", "Subtract {b} from {a}.", "What is {a} minus {b}?",
          "Calculate {a}-{b}", "{a} - {b} = ?", "How much is {a} - {b}?", "What's {a} take away {b}?",
          "What's the difference {a} - {b}?", "{a}-{b}", "I had {a} dollars and spent {b}. How much is left?",
          "How much is {b} less than {a}?", "what is {a} minus {b}", "Take {b} away from {a}.",
          "Calculate {a} minus {b} please.", "{a} minus {b}?"],
    "*": ["What is {a} * {b}?", "Compute {a} * {b}.", "Multiply {a} by {b}.", "What is {a} times {b}?",
          "Calculate {a}*{b}", "{a} x {b} = ?", "What's the product of {a} and {b}?", "How much is {a} * {b}?",
          "A box holds {b} eggs. How many eggs are in {a} boxes?", "{a}*{b}", "what's {a} times {b}",
          "What do you get when you multiply {a} and {b}?", "Multiply {a} and {b}.", "{a} times {b}?",
          "What is {a} multiplied by {b}?", "Compute the product {a} x {b}."],
    "/": ["What is {a} / {b}?", "Compute {a} / {b}.", "Divide {a} by {b}.", "What is {a} divided by {b}?",
          "Calculate {a}/{b}", "{a} / {b} = ?", "How many times does {b} go into {a}?", "How much is {a} / {b}?",
          "Share {a} sweets among {b} kids equally. How many does each get?", "{a}/{b}",
          "what's {a} divided by {b}", "What is {a} over {b}?", "Split {a} into {b} equal parts.",
          "{a} divided by {b}?", "What's the quotient of {a} and {b}?", "Please divide {a} by {b}."],
}
OP_WORDS = {"+": "plus", "-": "minus", "*": "times", "/": "divided by"}


def heldout_pair(a, b, op):
    return (a * 7919 + b * 104729 + ord(op)) % 10 == 0


def magnitude(rng, digits_weights=(0.15, 0.3, 0.3, 0.25)):
    digits = rng.choices([1, 2, 3, 4], digits_weights)[0]
    return rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10 ** digits - 1)


def draw_operands(rng, op, split):
    while True:
        if op in "+-":
            a, b = magnitude(rng), magnitude(rng)
            if rng.random() < 0.15:
                a, b = rng.randint(0, 10), rng.randint(0, 10)
            if rng.random() < 0.15:
                if rng.random() < 0.5:
                    a = -a
                else:
                    b = -b
        elif op == "*":
            a = magnitude(rng)
            b = rng.choices([rng.randint(0, 12), rng.randint(2, 9), rng.randint(10, 99), rng.randint(100, 999)],
                            [0.2, 0.3, 0.4, 0.1])[0]
            if rng.random() < 0.5:
                a, b = b, a
            if rng.random() < 0.1:
                a = -a
        else:
            b = rng.choices([rng.randint(1, 9), rng.randint(10, 99)], [0.6, 0.4])[0]
            if rng.random() < 0.25:
                a = b * rng.randint(0, 10 if rng.random() < 0.5 else 999)
            else:
                a = magnitude(rng, (0.05, 0.3, 0.35, 0.3))
            if rng.random() < 0.07:
                a = -(a - a % b)
        if heldout_pair(a, b, op) == (split != "train"):
            return a, b


def shown(rng, n):
    """Numbers as users type them: sometimes with thousands separators."""
    if abs(n) >= 1000 and rng.random() < 0.15:
        return f"{n:,}"
    return str(n)


def task_arith(rng, split, frame=None):
    op = rng.choices(["+", "-", "*", "/"], [0.25, 0.25, 0.25, 0.25])[0]
    a, b = draw_operands(rng, op, split)
    frame = frame or Frame(rng)
    template = rng.choice(tf.templates(ARITH_QUESTIONS[op], split))
    story = ("apples", "books", "eggs", "sweets", "dollars", "parts")
    while (a < 0 or b < 0) and any(word in template for word in story):
        template = rng.choice(tf.templates(ARITH_QUESTIONS[op], split))
    question = fill(noisy(rng, template), {"a": shown(rng, a), "b": shown(rng, b) if b >= 0 else f"({b})"})
    steps, result, remainder = arith.solve(op, a, b)
    expression = f"{a} {op} {b}" if b >= 0 else f"{a} {op} ({b})"
    intro = {"low": "", "medium": f"{expression}: ",
             "high": f"The user wants {a} {OP_WORDS[op]} {b}. Column by column: "}[frame.effort]
    analysis = intro + steps + "."
    if remainder:
        final = rng.choice([f"{expression} = {result} remainder {remainder}.",
                            f"{result} with a remainder of {remainder}.",
                            f"It is {result} remainder {remainder}."])
        check = {"type": "final_number", "answer": str(result), "remainder": str(remainder), "op": op}
    else:
        final = rng.choice([f"{expression} = {result}.", f"The answer is {result}.", f"It is {result}.",
                            f"The result is {result}.", f"{expression} = {result}"])
        check = {"type": "final_number", "answer": str(result), "op": op}
    if "apples" in template:
        final = f"You have {result} apples now."
    elif "eggs" in template:
        final = f"There are {result} eggs."
    elif "books" in template:
        final = f"There are {result} books."
    return single_turn(rng, frame, question, analysis, final, check)


CONVERSIONS = [("kilometers", "meters", 1000), ("meters", "centimeters", 100), ("hours", "minutes", 60),
               ("minutes", "seconds", 60), ("days", "hours", 24), ("weeks", "days", 7), ("feet", "inches", 12),
               ("yards", "feet", 3), ("kilograms", "grams", 1000), ("liters", "milliliters", 1000),
               ("dozens", "items", 12), ("centimeters", "millimeters", 10), ("years", "months", 12)]
CONVERT_QUESTIONS = ["Convert {v} {s} to {t}.", "How many {t} are in {v} {s}?", "What is {v} {s} in {t}?",
                     "{v} {s} is how many {t}?", "Please convert {v} {s} into {t}.", "{v} {s} in {t}?",
                     "How many {t} make {v} {s}?", "Express {v} {s} in {t}."]


def task_convert(rng, split, frame=None):
    source, target, factor = rng.choice(CONVERSIONS)
    while True:
        value = rng.randint(2, 99) if factor >= 10 else rng.randint(2, 999)
        if heldout_pair(value, factor, "c") == (split != "train"):
            break
    frame = frame or Frame(rng)
    question = fill(noisy(rng, rng.choice(tf.templates(CONVERT_QUESTIONS, split))),
                    {"v": str(value), "s": source, "t": target})
    result = value * factor
    steps, _, _ = arith.solve("*", value, factor)
    one = source[:-1] if source.endswith("s") else source
    analysis = f"One {one} is {factor} {target}, so {value}*{factor}: {steps}."
    final = rng.choice([f"{value} {source} is {result} {target}.", f"That is {result} {target}.",
                        f"{value} {source} = {result} {target}."])
    return single_turn(rng, frame, question, analysis, final, {"type": "final_number", "answer": str(result)})


# ---------------------------------------------------------------- facts and chat

def task_qa_table(rng, split, frame=None):
    rows, used = [], set()
    while len(rows) < rng.randint(3, 5):
        country, capital = tf.fictional(rng), tf.fictional(rng)
        if country in used or capital in used:
            continue
        used.update([country, capital])
        rows.append((country, capital, f"{rng.randint(1, 99)}.{rng.randint(0, 9)} million"))
    table = "\n".join(f"- {c}: capital {k}, population {p}" for c, k, p in rows)
    country, capital, population = rng.choice(rows)
    kind = rng.randint(0, 2)
    if kind == 0:
        question, answer = f"What is the capital of {country}?", capital
        final, analysis = f"The capital of {country} is {capital}.", f"Row {country}: capital {capital}."
    elif kind == 1:
        question, answer = f"What is the population of {country}?", population
        final, analysis = (f"{country} has a population of {population}.",
                           f"Row {country}: population {population}.")
    else:
        question, answer = f"Which country has the capital {capital}?", country
        final, analysis = f"{capital} is the capital of {country}.", f"Capital {capital} is in row {country}."
    in_developer = rng.random() < 0.3
    frame = Frame(rng, instructions=("Use these facts about fictional countries:\n" + table) if in_developer
                  else None)
    user = question if in_developer else rng.choice(["Here are some facts:\n", "Data:\n",
                                                     "Facts about some fictional countries:\n"]) + table + "\n\n" + question
    return single_turn(rng, frame, user, analysis, final, {"type": "final_contains", "strings": [answer]},
                       history=False)


FACT_QUESTIONS = ["What is the capital of {c}?", "What's the capital city of {c}?", "Name the capital of {c}.",
                  "Which city is the capital of {c}?", "capital of {c}?", "Tell me the capital of {c}.",
                  "What city is {c}'s capital?", "Do you know the capital of {c}?"]


def task_qa_fact(rng, split, frame=None):
    country = rng.choice(list(CAPITALS))
    capital = CAPITALS[country]
    frame = frame or Frame(rng)
    question = fill(noisy(rng, rng.choice(tf.templates(FACT_QUESTIONS, split))), {"c": country})
    analysis = ("No tool is needed. " if frame.tools else "") + f"The capital of {country} is {capital}."
    final = (f"The capital of {country} is {capital}." if rng.random() < 0.5
             else f"{capital} is the capital of {country}.")
    return single_turn(rng, frame, question, analysis, final, {"type": "final_contains", "strings": [capital]})


CHAT = {
    "identity": ["Who are you?", "What is your name?", "Introduce yourself.", "Who made you?", "What are you?",
                 "Tell me about yourself.", "Are you a bot?", "whats your name"],
    "greeting": ["Hi", "Hello!", "Hey", "Good morning", "Hello there", "hi!", "Good evening", "yo"],
    "date": ["What is today's date?", "What day is it today?", "What's the date today?", "today's date?",
             "Which date is it?", "Do you know the date?", "What's today?", "date please"],
    "thanks": ["Thanks!", "Thank you.", "Thanks a lot", "Great, thanks.", "thx", "Cheers!", "Perfect, thank you!",
               "ty"],
}


def task_chat(rng, split, frame=None):
    frame = frame or Frame(rng)
    kind = rng.choice(list(CHAT))
    question = rng.choice(tf.templates(CHAT[kind], split))
    strings = []
    if kind == "identity":
        analysis, final = "The user asks who I am.", identity_answer(frame)
    elif kind == "greeting":
        analysis, final = "A greeting.", rng.choice(["Hello! How can I help you today?", "Hi! What can I do for you?"])
    elif kind == "date":
        if frame.date:
            analysis, final, strings = (f"The system message gives the date {frame.date}.", f"Today is {frame.date}.",
                                        [frame.date])
        else:
            analysis, final = "No current date is given.", "I don't know today's date; I have no access to a clock."
    else:
        analysis, final = "The user thanks me.", rng.choice(["You're welcome!", "Happy to help!"])
    if frame.tools:
        analysis = "No tool is needed. " + analysis
    return single_turn(rng, frame, question, analysis, final, {"type": "final_contains", "strings": strings})


# ---------------------------------------------------------------- tools

def families_for(split):
    return tf.TRAIN if split != "ood" else tf.TRAIN + tf.OOD


SYNTHETIC_SHARE = 0.35   # of training's tool requests and distractors: made-up tools (tool_families.synthetic_family)


def tool_set(rng, needed, split="train", exclude=()):
    """1-4 tools of distinct families including `needed` (a family or its name, or None), in random order.
    Outside the OOD split some distractors are synthetic families."""
    if isinstance(needed, str):
        needed = tf.FAMILIES[needed]
    count = rng.randint(1, 4) if needed else rng.randint(1, 3)
    pool = [f for f in families_for(split) if f is not needed and f.name not in exclude]
    rng.shuffle(pool)
    others = []
    for family in pool[:count - (1 if needed else 0)]:
        synthetic = split != "ood" and rng.random() < SYNTHETIC_SHARE
        others.append(tf.synthetic_family(rng) if synthetic else family)
    chosen = ([needed] if needed else []) + others
    rng.shuffle(chosen)
    camel = rng.random() < 0.15
    tools, names = [], set()
    for family in chosen:
        tool = tf.draw_tool(rng, family, split, camel)
        if tool.name not in names or family is needed:
            tools = [t for t in tools if t.name != tool.name] + [tool]
            names.add(tool.name)
    rng.shuffle(tools)
    return tools


def pick_family(rng, split):
    if split == "ood":
        return rng.choice(tf.OOD) if rng.random() < 0.6 else rng.choice(tf.TRAIN)
    if rng.random() < SYNTHETIC_SHARE:
        return tf.synthetic_family(rng)
    weights = [3 if f.name in ("weather", "time") else 1 for f in tf.TRAIN]
    return rng.choices(tf.TRAIN, weights)[0]


def call_analysis(frame, tool, args):
    shown_args = ", ".join(f"{k}={j(v)}" for k, v in args.items())
    names = ", ".join(frame.declared())
    return {"low": f"Call {tool.name}.",
            "medium": f"{tool.name} fits. Arguments: {shown_args}.",
            "high": f"Declared tools: {names}. {tool.name} answers this; call it with {shown_args}."}[frame.effort]


def answer_analysis(frame, fields, values, keys):
    quoted = ", ".join(f"{keys[field]} {values[field]}" for field in fields)
    return {"low": "Report the result.", "medium": f"The result gives {quoted}.",
            "high": f"The tool returned {quoted}. Quote these values exactly."}[frame.effort]


def origin(tool):
    """The check's record of the requested tool's family: its name, and whether training never sees it."""
    return {"family": tool.category, "unseen_family": tool.family in tf.OOD}


def tool_exchange(rng, tool, split):
    """One request for `tool` and its answer: question, call arguments, result text, final answer, the strings the
    answer must quote (mentions), the drawn values, and the quoted fields with their text and result keys."""
    family = tool.family
    template = rng.choice(tf.fitting_templates(tool, split))
    values = tf.draw_values(rng, tool)
    roles = tf.slots_of(template)
    question = fill(noisy(rng, template), {r: values[r][0] for r in roles})
    args = tf.arguments(tool, values, sorted(roles))
    raw = {r: v for r, (_, v) in values.items()}
    fields = family.result(rng, raw)
    result, field_values, keys = tf.shape_result(rng, fields)
    phrases = {r: values[r][0] for r in roles}
    answers = [a for a in family.answers if tf.slots_of(a) <= set(phrases) | set(field_values)]
    answer = rng.choice(answers)
    final = fill(answer, {**phrases, **{k: str(v) for k, v in field_values.items()}})
    mentioned = [f for f in field_values if "{" + f + "}" in answer]
    mentions = [str(field_values[f]) for f in mentioned]
    return SimpleNamespace(question=question, args=args, result=result, final=final, mentions=mentions, values=values,
                           fields=mentioned, field_text={k: str(v) for k, v in field_values.items()}, keys=keys)


def task_tool(rng, split):
    family = pick_family(rng, split)
    tools = tool_set(rng, family, split)
    tool = next(t for t in tools if t.family is family)
    frame = Frame(rng, tools=[t.declaration() for t in tools])
    exchange = tool_exchange(rng, tool, split)
    args = exchange.args
    conv = frame.start(rng)
    conv.prompt(render_user(exchange.question))
    prompt1 = conv.text() + "<|start|>assistant"
    resume = rng.random() < 0.25
    if resume:
        # the client sent the call back without its reasoning (what a Chat Completions client does)
        conv.prompt(render_past_call(tool.name, j(args)))
    else:
        conv.assistant_turn([("analysis", call_analysis(frame, tool, args)), ("commentary", j(args), tool.name)])
    conv.prompt(render_tool_result(tool.name, exchange.result))
    prompt2 = conv.text() + "<|start|>assistant"
    conv.assistant_turn([("analysis", answer_analysis(frame, exchange.fields, exchange.field_text, exchange.keys)),
                         ("final", exchange.final)])
    declared, tools = frame.declared(), frame.declared_tools()
    call_turn = {"prompt": prompt1, "check": {"type": "tool_call", "tool": tool.name, "parameters": tool.parameters,
                                              "args": args, "declared": declared, "tools": tools, **origin(tool)}}
    answer_turn = {"prompt": prompt2, "check": {"type": "final_contains", "strings": exchange.mentions,
                                                  "declared": declared, "tools": tools, **origin(tool)}}
    turns = ([] if resume else [call_turn]) + [answer_turn]
    kind = "tool"
    if family.follow and family.follow in tool.slots and rng.random() < 0.3:
        kind = "tool_followup"
        turns += followup(rng, conv, frame, tool, split, exchange.values)
    return conv, turns, kind


FOLLOWUPS = ["What about {x}?", "And {x}?", "How about {x}?", "Same for {x} please.", "and in {x}?",
             "Now {x}.", "Can you check {x} too?", "ok, and for {x}?"]


def followup(rng, conv, frame, tool, split, values):
    """A second request for the same tool that changes one value ("And in Rome?")."""
    role = tool.family.follow
    _, param = tool.slots[role]
    raw = param.gen(rng)
    new_values = dict(values)
    new_values[role] = (str(raw), param.value_of(raw) if param.value_of else raw)
    question = fill(noisy(rng, rng.choice(tf.templates(FOLLOWUPS, split))), {"x": str(raw)})
    conv.prompt(render_user(question))
    prompt1 = conv.text() + "<|start|>assistant"
    previous = [r for r in values if r in _roles_in_args(tool, conv)]
    args = tf.arguments(tool, new_values, sorted(set(previous) | {role}))
    conv.assistant_turn([("analysis", call_analysis(frame, tool, args)), ("commentary", j(args), tool.name)])
    fields = tool.family.result(rng, {r: v for r, (_, v) in new_values.items()})
    result, field_values, keys = tf.shape_result(rng, fields)
    conv.prompt(render_tool_result(tool.name, result))
    prompt2 = conv.text() + "<|start|>assistant"
    phrases = {r: new_values[r][0] for r in new_values}
    answer = rng.choice([a for a in tool.family.answers if tf.slots_of(a) <= set(phrases) | set(field_values)])
    final = fill(answer, {**phrases, **{k: str(v) for k, v in field_values.items()}})
    mentioned = [f for f in field_values if "{" + f + "}" in answer]
    conv.assistant_turn([("analysis", answer_analysis(frame, mentioned, {k: str(v) for k, v in field_values.items()},
                                                      keys)),
                         ("final", final)])
    declared, tools = frame.declared(), frame.declared_tools()
    return [{"prompt": prompt1, "check": {"type": "tool_call", "tool": tool.name, "parameters": tool.parameters,
                                          "args": args, "declared": declared, "tools": tools, **origin(tool)}},
            {"prompt": prompt2, "check": {"type": "final_contains", "strings": [str(field_values[f]) for f in mentioned],
                                          "declared": declared, "tools": tools, **origin(tool)}}]


def _roles_in_args(tool, conv):
    """Roles whose argument the first call carried (read back from the rendered call)."""
    text = conv.text()
    start = text.rfind("<|constrain|>json<|message|>")
    args = json.loads(text[start + len("<|constrain|>json<|message|>"):text.index("<|call|>", start)])
    present = set()
    for role, (path, _) in tool.slots.items():
        node = args
        for key in path:
            if not isinstance(node, dict) or key not in node:
                break
            node = node[key]
        else:
            present.add(role)
    return present


def task_tool_unneeded(rng, split):
    """Tools are declared but the question needs none of them (no calculator or converter among them)."""
    tools = tool_set(rng, None, split, exclude=("calculator", "units"))
    frame = Frame(rng, tools=[t.declaration() for t in tools])
    maker = rng.choice([task_arith, task_arith, task_qa_fact, task_chat, task_convert])
    conv, turns = maker(rng, split, frame)
    return conv, turns, "arith_with_tools" if maker is task_arith else "tool_unneeded"


def task_no_tool(rng, split):
    """The user asks for something only a tool could give, and no declared tool gives it."""
    family = pick_family(rng, split)
    if family.name in ("calculator", "units"):
        family = tf.FAMILIES["weather"]
    related = {"weather": ("forecast",), "forecast": ("weather",), "calendar_add": ("calendar_list",),
               "calendar_list": ("calendar_add",)}.get(family.name, ())
    tools = (tool_set(rng, None, split, exclude=(family.name, "search") + related) if rng.random() < 0.7 else [])
    frame = Frame(rng, tools=[t.declaration() for t in tools])
    probe = tf.draw_tool(rng, family, split)
    template = rng.choice(tf.fitting_templates(probe, split))
    values = tf.draw_values(rng, probe)
    question = fill(noisy(rng, template), {r: values[r][0] for r in tf.slots_of(template)})
    analysis = (f"This needs {family.need}, and none of the declared tools provides it." if tools
                else f"This needs {family.need}, and I have no tools.")
    final = rng.choice([f"Sorry, I can't do that: I have no access to {family.need}.",
                        f"I'm unable to help with that here, since I don't have {family.need}."])
    return single_turn(rng, frame, question, analysis, final, {"type": "final_contains", "strings": []}) + ("no_tool",)


TASKS = [(task_tool, 0.38), (task_arith, 0.27), (task_convert, 0.03), (task_qa_table, 0.05), (task_qa_fact, 0.03),
         (task_chat, 0.05), (task_tool_unneeded, 0.13), (task_no_tool, 0.06)]


def make_example(rng, split):
    """One conversation of a split: "train", "heldout" (in distribution) or "ood"."""
    task = rng.choices([t for t, _ in TASKS], [w for _, w in TASKS])[0]
    made = task(rng, split)
    conv, turns = made[0], made[1]
    kind = made[2] if len(made) > 2 else task.__name__[len("task_"):]
    return {"kind": kind, "segments": conv.segments, "turns": turns}


def generate_chunk(job):
    split, seed, count = job
    rng = random.Random(seed)
    return [json.dumps(make_example(rng, split), ensure_ascii=False) for _ in range(count)]


def split_jobs(split, count, seed, chunk=1000):
    """The (split, seed, count) chunks a split is made of; train.py uses the same ones, so a split
    generated here equals the one a training run held out."""
    return [(split, seed * 1000003 + index, min(chunk, count - start))
            for index, start in enumerate(range(0, count, chunk))]


HELDOUT_SEED_OFFSET = 7777
OOD_SEED_OFFSET = 8888


def write_split(path, split, count, seed, workers):
    jobs = split_jobs(split, count, seed)
    with open(path, "w") as out:
        if workers > 1:
            with multiprocessing.Pool(workers) as pool:
                for lines in pool.imap(generate_chunk, jobs):
                    out.write("\n".join(lines) + "\n")
        else:
            for job in jobs:
                out.write("\n".join(generate_chunk(job)) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--train", type=int, default=300000)
    parser.add_argument("--heldout", type=int, default=1000)
    parser.add_argument("--ood", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for name, count, seed in [("train", args.train, args.seed),
                              ("heldout", args.heldout, args.seed + HELDOUT_SEED_OFFSET),
                              ("ood", args.ood, args.seed + OOD_SEED_OFFSET)]:
        if count:
            write_split(os.path.join(args.out, name + ".jsonl"), name, count, seed, args.workers)


if __name__ == "__main__":
    main()
