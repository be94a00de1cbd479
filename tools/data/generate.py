#!/usr/bin/env python3
"""Synthetic Harmony conversations for training beam-nano. Pure Python 3, no dependencies.

  python3 tools/data/generate.py --out DIR --train 200000 --heldout 1000 [--seed 1] [--workers N]

writes DIR/train.jsonl and DIR/heldout.jsonl. One JSON object a line:
  segments  [[text, trainable], ...]    the rendered conversation (see harmony_render.py)
  kind      the task family (arith, convert, qa_table, qa_fact, chat, date, tool, tool_unneeded, no_tool)
  turns     one entry per model turn: {"prompt": the text before it (ends with <|start|>assistant),
            "check": what a correct answer satisfies}; checks are
              {"type": "tool_call", "tool": NAME, "parameters": JSON schema, "args": expected arguments}
              {"type": "final_number", "answer": "632"}
              {"type": "final_contains", "strings": [...]}   (every string appears in the final message)
The train and held-out sets come from different seeds (and held-out arithmetic operands are drawn from a
disjoint set: operand pairs whose hash is 0 mod 10 are held-out only).
"""
import argparse
import json
import multiprocessing
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
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
                "You are a travel assistant.", "Give direct answers.", "Be friendly."]
PLACES = ["ones", "tens", "hundreds", "thousands", "ten thousands", "hundred thousands"]

REAL_CITIES = ["Paris", "London", "Tokyo", "Berlin", "Madrid", "Rome", "Cairo", "Sydney", "Toronto", "Chicago",
               "Boston", "Seattle", "Denver", "Dublin", "Oslo", "Lisbon", "Vienna", "Prague", "Warsaw", "Athens",
               "Istanbul", "Mumbai", "Delhi", "Seoul", "Beijing", "Shanghai", "Bangkok", "Singapore", "Lima",
               "Santiago", "Bogota", "Nairobi", "Lagos", "Dubai", "Moscow", "Helsinki", "Stockholm", "Zurich",
               "Geneva", "Amsterdam", "Brussels", "Miami", "Austin", "Phoenix", "Atlanta", "Houston",
               "San Francisco", "New York", "Los Angeles", "Mexico City", "Buenos Aires", "Rio de Janeiro",
               "Hong Kong", "Cape Town", "Tel Aviv", "Kyoto", "Osaka", "Munich", "Hamburg", "Milan", "Naples",
               "Barcelona", "Valencia", "Porto", "Krakow", "Budapest", "Edinburgh", "Glasgow", "Manchester",
               "Vancouver", "Montreal", "Ottawa", "Calgary", "Melbourne", "Perth", "Auckland", "Reykjavik"]
SYLLABLES = ["ka", "lo", "mi", "ra", "ven", "dor", "tal", "is", "bre", "nor", "sa", "quin", "zel", "ar", "mo",
             "thu", "pel", "ga", "rin", "ost", "vi", "lan", "dra", "ke", "sol", "mar", "ith", "ul", "bo", "fen"]
TIMEZONES = {"Tokyo": "Asia/Tokyo", "Paris": "Europe/Paris", "London": "Europe/London", "Berlin": "Europe/Berlin",
             "New York": "America/New_York", "Chicago": "America/Chicago", "Denver": "America/Denver",
             "Los Angeles": "America/Los_Angeles", "Sydney": "Australia/Sydney", "Madrid": "Europe/Madrid",
             "Rome": "Europe/Rome", "Moscow": "Europe/Moscow", "Dubai": "Asia/Dubai", "Mumbai": "Asia/Kolkata",
             "Singapore": "Asia/Singapore", "Seoul": "Asia/Seoul", "Beijing": "Asia/Shanghai",
             "Cairo": "Africa/Cairo", "Toronto": "America/Toronto", "Sao Paulo": "America/Sao_Paulo",
             "Mexico City": "America/Mexico_City", "Istanbul": "Europe/Istanbul", "Bangkok": "Asia/Bangkok",
             "Auckland": "Pacific/Auckland", "Lisbon": "Europe/Lisbon", "Vienna": "Europe/Vienna"}
CAPITALS = {"France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid", "Japan": "Tokyo",
            "China": "Beijing", "India": "New Delhi", "Russia": "Moscow", "Canada": "Ottawa", "Brazil": "Brasilia",
            "Australia": "Canberra", "Egypt": "Cairo", "Kenya": "Nairobi", "Mexico": "Mexico City",
            "Argentina": "Buenos Aires", "Norway": "Oslo", "Sweden": "Stockholm", "Finland": "Helsinki",
            "Poland": "Warsaw", "Greece": "Athens", "Portugal": "Lisbon", "Ireland": "Dublin", "Austria": "Vienna",
            "Turkey": "Ankara", "South Korea": "Seoul", "Thailand": "Bangkok", "Peru": "Lima", "Chile": "Santiago",
            "Colombia": "Bogota", "the United Kingdom": "London", "the United States": "Washington, D.C.",
            "Switzerland": "Bern", "the Netherlands": "Amsterdam", "Belgium": "Brussels", "Hungary": "Budapest",
            "Iceland": "Reykjavik", "New Zealand": "Wellington", "Nigeria": "Abuja", "Vietnam": "Hanoi"}
CONDITIONS = ["sunny", "cloudy", "partly cloudy", "rainy", "light rain", "snowy", "windy", "foggy", "clear",
              "overcast", "stormy", "drizzle", "thunderstorms", "hazy"]
CURRENCIES = ["USD", "EUR", "GBP", "JPY", "CHF", "CAD", "AUD", "CNY", "INR", "SEK", "NOK", "MXN"]
TICKERS = {"Apple": "AAPL", "Microsoft": "MSFT", "Google": "GOOGL", "Amazon": "AMZN", "Tesla": "TSLA",
           "Nvidia": "NVDA", "Meta": "META", "Netflix": "NFLX", "Intel": "INTC", "IBM": "IBM"}
NAMES = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy", "mallory", "oscar",
         "peggy", "trent", "victor", "walter", "maria", "li", "sam", "nina"]
DOMAINS = ["example.com", "mail.com", "acme.org", "work.net", "school.edu"]
TOPICS = ["the history of the bicycle", "how volcanoes form", "the tallest mountains in Europe",
          "recipes for banana bread", "the rules of chess", "how solar panels work", "the life of Marie Curie",
          "the best time to visit Japan", "how to grow tomatoes", "the speed of sound", "ancient Roman roads",
          "electric cars", "the Great Barrier Reef", "jazz music history", "how vaccines work",
          "the deepest lakes in the world", "quantum computing basics", "the Apollo 11 mission"]
WORDS = ["meeting", "lunch", "report", "project", "trip", "party", "budget", "review", "schedule", "update",
         "dinner", "invoice", "plan", "notes", "tickets", "order"]


def fictional_name(rng, capitalize=True):
    name = "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3)))
    return name.capitalize() if capitalize else name


def pick_city(rng):
    return rng.choice(REAL_CITIES) if rng.random() < 0.6 else fictional_name(rng)


# ---------------------------------------------------------------- step-by-step arithmetic (analysis text)

def digits_low_first(n):
    return [int(c) for c in reversed(str(n))]


def add_steps(a, b):
    da, db = digits_low_first(a), digits_low_first(b)
    steps, carry = [], 0
    for i in range(max(len(da), len(db))):
        x = da[i] if i < len(da) else 0
        y = db[i] if i < len(db) else 0
        total = x + y + carry
        step = f"{PLACES[i]}: {x} + {y}" + (f" + {carry}" if carry else "") + f" = {total}"
        if total >= 10:
            step += f", write {total % 10} carry 1"
            carry = 1
        else:
            carry = 0
        steps.append(step)
    if carry:
        steps.append(f"the last carry 1 goes in front")
    return "; ".join(steps) + f". So {a} + {b} = {a + b}."


def sub_steps(a, b):
    """a >= b >= 0."""
    da, db = digits_low_first(a), digits_low_first(b)
    steps, borrow = [], 0
    for i in range(len(da)):
        x = da[i]
        y = db[i] if i < len(db) else 0
        step = f"{PLACES[i]}: {x}" + (f" - {borrow}" if borrow else "") + f" - {y}"
        top = x - borrow
        if top < y:
            step += f" needs a borrow, {top + 10} - {y} = {top + 10 - y}"
            borrow = 1
        else:
            step += f" = {top - y}"
            borrow = 0
        steps.append(step)
    return "; ".join(steps) + f". So {a} - {b} = {a - b}."


def mul_digit_steps(a, d):
    da = digits_low_first(a)
    steps, carry = [], 0
    for i, x in enumerate(da):
        product = x * d + carry
        step = f"{PLACES[i]}: {x} * {d}" + (f" + {carry}" if carry else "") + f" = {product}"
        if product >= 10 and i < len(da) - 1:
            step += f", write {product % 10} carry {product // 10}"
            carry = product // 10
        else:
            carry = 0
        steps.append(step)
    return "; ".join(steps) + f". So {a} * {d} = {a * d}."


def mul_steps(a, b):
    """a * b with b < 100, as partial products by b's digits, then their sum."""
    if b < 10:
        return mul_digit_steps(a, b)
    tens, ones = divmod(b, 10)
    if tens * 10 == b:
        return (f"{b} = {tens} * 10. " + mul_digit_steps(a, tens)
                + f" Times 10: {a * tens}0. So {a} * {b} = {a * b}.")
    text = f"Split {b} into {tens * 10} + {ones}. First {a} * {ones}: " + mul_digit_steps(a, ones)
    text += f" Then {a} * {tens}: " + mul_digit_steps(a, tens) + f" Times 10: {a * tens}0."
    text += f" Now add {a * ones} + {a * tens * 10}: " + add_steps(a * ones, a * tens * 10)
    return text + f" So {a} * {b} = {a * b}."


def heldout_pair(a, b, op):
    return (a * 7919 + b * 104729 + ord(op)) % 10 == 0


def draw_operands(rng, op, split):
    while True:
        if op == "+":
            a, b = rng.randint(0, 999), rng.randint(0, 999)
            if rng.random() < 0.3:
                a, b = rng.randint(0, 99), rng.randint(0, 99)
        elif op == "-":
            a, b = rng.randint(0, 999), rng.randint(0, 999)
            if rng.random() < 0.3:
                a, b = rng.randint(0, 99), rng.randint(0, 99)
        elif rng.random() < 0.6:
            a, b = rng.randint(2, 999), rng.randint(2, 9)
        else:
            a, b = rng.randint(11, 99), rng.randint(11, 99)
        if heldout_pair(a, b, op) == (split == "heldout"):
            return a, b


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
    return "Who are you?", identity_answer(frame) + ""


def analysis_intro(rng, frame, medium, high):
    if frame.effort == "low":
        return ""
    if frame.effort == "medium":
        return medium + " "
    return high + " "


# ---------------------------------------------------------------- task families

def task_arith(rng, split, frame=None):
    op = rng.choices(["+", "-", "*"], [0.4, 0.3, 0.3])[0]
    a, b = draw_operands(rng, op, split)
    frame = frame or Frame(rng)
    word = {"+": "plus", "-": "minus", "*": "times"}[op]
    if op == "+":
        question = rng.choice([f"What is {a} + {b}?", f"Compute {a} + {b}.", f"Add {a} and {b}.",
                               f"What is {a} plus {b}?", f"Calculate {a}+{b}", f"{a} + {b} = ?",
                               f"What's the sum of {a} and {b}?", f"How much is {a} + {b}?",
                               f"I have {a} apples and buy {b} more. How many apples do I have now?",
                               f"A library has {a} books and receives {b} new ones. How many books are there?"])
        expression, result = f"{a} + {b}", a + b
        steps = add_steps(a, b)
    elif op == "-":
        question = rng.choice([f"What is {a} - {b}?", f"Compute {a} - {b}.", f"Subtract {b} from {a}.",
                               f"What is {a} minus {b}?", f"Calculate {a}-{b}", f"{a} - {b} = ?",
                               f"How much is {a} - {b}?", f"What's the difference {a} - {b}?"])
        expression, result = f"{a} - {b}", a - b
        steps = sub_steps(a, b) if a >= b else (f"{b} is larger than {a}, so compute {b} - {a} and make it "
                                                f"negative. " + sub_steps(b, a) + f" So {a} - {b} = {a - b}.")
    else:
        question = rng.choice([f"What is {a} * {b}?", f"Compute {a} * {b}.", f"Multiply {a} by {b}.",
                               f"What is {a} times {b}?", f"Calculate {a}*{b}", f"{a} x {b} = ?",
                               f"What's the product of {a} and {b}?", f"How much is {a} * {b}?",
                               f"A box holds {b} eggs. How many eggs are in {a} boxes?"])
        expression, result = f"{a} * {b}", a * b
        steps = mul_steps(a, b)
    analysis = analysis_intro(rng, frame, f"The user wants {a} {word} {b}. Work it out column by column.",
                              f"The user asks for {expression}. I will compute it carefully, column by column, "
                              f"and then state the result.")
    analysis += steps
    if frame.effort == "high":
        analysis += f" The answer is {result}."
    final = rng.choice([f"{expression} = {result}.", f"The answer is {result}.", f"{expression} = {result}",
                        f"It is {result}.", f"The result is {result}."])
    if "apples" in question:
        final = f"You have {result} apples now."
    elif "books" in question:
        final = f"There are {result} books."
    elif "eggs" in question:
        final = f"There are {result} eggs."
    conv = frame.start(rng)
    conv.prompt(render_user(question))
    prompt = conv.text()
    conv.assistant_turn([("analysis", analysis), ("final", final)])
    return conv, [{"prompt": prompt + "<|start|>assistant", "check": {"type": "final_number",
                                                                      "answer": str(result)}}]


CONVERSIONS = [("kilometers", "meters", 1000), ("meters", "centimeters", 100), ("hours", "minutes", 60),
               ("minutes", "seconds", 60), ("days", "hours", 24), ("weeks", "days", 7), ("feet", "inches", 12),
               ("yards", "feet", 3), ("kilograms", "grams", 1000), ("liters", "milliliters", 1000),
               ("dozens", "items", 12), ("centimeters", "millimeters", 10), ("years", "months", 12)]


def task_convert(rng, split):
    source, target, factor = rng.choice(CONVERSIONS)
    while True:
        value = rng.randint(2, 99) if factor >= 10 else rng.randint(2, 999)
        if heldout_pair(value, factor, "c") == (split == "heldout"):
            break
    frame = Frame(rng)
    question = rng.choice([f"Convert {value} {source} to {target}.", f"How many {target} are in {value} {source}?",
                           f"What is {value} {source} in {target}?", f"{value} {source} is how many {target}?",
                           f"Please convert {value} {source} into {target}."])
    result = value * factor
    analysis = analysis_intro(rng, frame, f"Convert {value} {source} to {target}.",
                              f"The user wants {value} {source} expressed in {target}. I need the factor, then "
                              f"a multiplication.")
    analysis += f"One {source[:-1] if source.endswith('s') else source} is {factor} {target}, so compute {value} * {factor}. "
    if factor in (10, 100, 1000):
        analysis += f"Multiplying by {factor} appends {len(str(factor)) - 1} zeros: {value} * {factor} = {result}."
    else:
        analysis += mul_steps(value, factor)
    final = rng.choice([f"{value} {source} is {result} {target}.", f"That is {result} {target}.",
                        f"{value} {source} = {result} {target}."])
    conv = frame.start(rng)
    conv.prompt(render_user(question))
    prompt = conv.text()
    conv.assistant_turn([("analysis", analysis), ("final", final)])
    return conv, [{"prompt": prompt + "<|start|>assistant", "check": {"type": "final_number", "answer": str(result)}}]


def task_qa_table(rng, split):
    rows = []
    used = set()
    while len(rows) < rng.randint(3, 5):
        country, capital = fictional_name(rng), fictional_name(rng)
        if country in used or capital in used:
            continue
        used.update([country, capital])
        population = f"{rng.randint(1, 99)}.{rng.randint(0, 9)} million"
        rows.append((country, capital, population))
    table = "\n".join(f"- {c}: capital {k}, population {p}" for c, k, p in rows)
    country, capital, population = rng.choice(rows)
    kind = rng.randint(0, 2)
    if kind == 0:
        question, answer = f"What is the capital of {country}?", capital
        final = f"The capital of {country} is {capital}."
        analysis = f"The table says {country} has capital {capital}."
    elif kind == 1:
        question, answer = f"What is the population of {country}?", population
        final = f"{country} has a population of {population}."
        analysis = f"The table lists {country} with population {population}."
    else:
        question, answer = f"Which country has the capital {capital}?", country
        final = f"{capital} is the capital of {country}."
        analysis = f"Looking for capital {capital} in the table: it belongs to {country}."
    in_developer = rng.random() < 0.3
    frame = Frame(rng, instructions=("Use these facts about fictional countries:\n" + table) if in_developer
                  else None)
    user = question if in_developer else rng.choice(["Here are some facts:\n", "Data:\n",
                                                     "Facts about some fictional countries:\n"]) + table + "\n\n" + question
    conv = frame.start(rng, history=False)
    conv.prompt(render_user(user))
    prompt = conv.text()
    conv.assistant_turn([("analysis", analysis_intro(rng, frame, "Answer from the given facts.",
                                                     "The user gave a small table of facts; I just need to look "
                                                     "up the right row.") + analysis), ("final", final)])
    return conv, [{"prompt": prompt + "<|start|>assistant", "check": {"type": "final_contains",
                                                                      "strings": [answer]}}]


def task_qa_fact(rng, split):
    country = rng.choice(list(CAPITALS))
    capital = CAPITALS[country]
    frame = Frame(rng)
    question = rng.choice([f"What is the capital of {country}?", f"What's the capital city of {country}?",
                           f"Name the capital of {country}.", f"Which city is the capital of {country}?"])
    analysis = analysis_intro(rng, frame, "A geography question.", "A simple geography fact question.")
    analysis += f"The capital of {country} is {capital}."
    conv = frame.start(rng)
    conv.prompt(render_user(question))
    prompt = conv.text()
    final = (f"The capital of {country} is {capital}." if rng.random() < 0.5
             else f"{capital} is the capital of {country}.")
    conv.assistant_turn([("analysis", analysis), ("final", final)])
    return conv, [{"prompt": prompt + "<|start|>assistant", "check": {"type": "final_contains",
                                                                      "strings": [capital]}}]


def task_chat(rng, split):
    frame = Frame(rng)
    kind = rng.randint(0, 3)
    if kind == 0:
        question = rng.choice(["Who are you?", "What is your name?", "Introduce yourself.", "Who made you?",
                               "What are you?"])
        answer = identity_answer(frame)
        analysis, final, strings = "The user asks who I am.", answer, []
    elif kind == 1:
        question = rng.choice(["Hi", "Hello!", "Hey", "Good morning", "Hello there", "hi!"])
        analysis, final, strings = "A greeting.", rng.choice(["Hello! How can I help you today?",
                                                             "Hi! What can I do for you?"]), []
    elif kind == 2:
        question = rng.choice(["What is today's date?", "What day is it today?", "What's the date today?"])
        if frame.date:
            analysis, final, strings = (f"The current date in the system message is {frame.date}.",
                                        f"Today is {frame.date}.", [frame.date])
        else:
            analysis, final, strings = ("No current date is given.",
                                        "I don't know today's date; I have no access to a clock.", [])
    else:
        question = rng.choice(["Thanks!", "Thank you.", "Thanks a lot", "Great, thanks."])
        analysis, final, strings = "The user thanks me.", rng.choice(["You're welcome!", "Happy to help!"]), []
    conv = frame.start(rng)
    conv.prompt(render_user(question))
    prompt = conv.text()
    conv.assistant_turn([("analysis", analysis), ("final", final)])
    return conv, [{"prompt": prompt + "<|start|>assistant", "check": {"type": "final_contains", "strings": strings}}]


# ---------------------------------------------------------------- tools

def schema(properties, required):
    return {"type": "object", "properties": properties, "required": required}


def maybe(rng, text, p=0.7):
    return text if rng.random() < p else None


def prop(kind, description=None, **extra):
    out = {"type": kind}
    if description:
        out["description"] = description
    out.update(extra)
    return out


class Tool:
    """One declared function, its call for a request, a fake result and the answer that uses it."""

    def __init__(self, category, name, description, parameters):
        self.category, self.name, self.description, self.parameters = category, name, description, parameters

    def declaration(self):
        out = {"name": self.name, "description": self.description}
        if self.parameters is not None:
            out["parameters"] = self.parameters
        return out


def make_weather_tool(rng):
    name = rng.choice(["get_weather", "get_weather", "get_current_weather", "lookup_weather", "weather",
                       "fetch_weather", "current_weather"])
    key = rng.choice(["location", "city", "location", "city", "place", "city_name"])
    description = rng.choice(["Get the current weather for a city.", "Gets the current weather in the provided "
                              "location.", "Look up current weather conditions.", "Returns the weather right now "
                              "in a given place.", "Get the weather forecast for today."])
    properties = {key: prop("string", rng.choice([None, "The city name, e.g. Paris", "City and country, e.g. "
                                                  "Paris, France", "The city, e.g. San Francisco, CA",
                                                  "Name of the location"]))}
    tool = Tool("weather", name, description, None)
    tool.key, tool.unit_key = key, None
    if rng.random() < 0.6:
        tool.unit_key = rng.choice(["unit", "unit", "units", "format"])
        extra = {"enum": ["celsius", "fahrenheit"]}
        if rng.random() < 0.5:
            extra["default"] = "celsius"
        properties[tool.unit_key] = prop("string", rng.choice([None, None, "Temperature unit"]), **extra)
    tool.parameters = schema(properties, [key])
    return tool


def make_time_tool(rng):
    name = rng.choice(["get_time", "get_current_time", "current_time", "get_local_time"])
    key = rng.choice(["timezone", "timezone", "tz", "zone"])
    tool = Tool("time", name, rng.choice(["Get the current time in a timezone.", "Returns the current local time "
                                          "for an IANA timezone.", "Current time lookup."]),
                schema({key: prop("string", rng.choice(["IANA timezone name, e.g. Europe/Paris", None,
                                                         "Timezone such as America/New_York"]))}, [key]))
    tool.key = key
    return tool


def make_calculator_tool(rng):
    name = rng.choice(["calculator", "calculate", "evaluate_expression", "math"])
    key = rng.choice(["expression", "expression", "expr", "input"])
    tool = Tool("calculator", name, rng.choice(["Evaluate a math expression.", "A simple calculator.",
                                                "Computes the value of an arithmetic expression."]),
                schema({key: prop("string", rng.choice(["The expression, e.g. 2 * (3 + 4)", None,
                                                         "Arithmetic expression to evaluate"]))}, [key]))
    tool.key = key
    return tool


def make_currency_tool(rng):
    name = rng.choice(["convert_currency", "currency_convert", "exchange"])
    keys = rng.choice([("amount", "from_currency", "to_currency"), ("amount", "from", "to"),
                       ("value", "source", "target")])
    props = {keys[0]: prop("number", maybe(rng, "Amount of money")),
             keys[1]: prop("string", maybe(rng, "Currency code, e.g. USD")),
             keys[2]: prop("string", maybe(rng, "Currency code, e.g. EUR"))}
    tool = Tool("currency", name, rng.choice(["Convert money between currencies.", "Currency conversion at "
                                              "today's rate."]), schema(props, list(keys)))
    tool.keys = keys
    return tool


def make_stock_tool(rng):
    name = rng.choice(["get_stock_price", "stock_quote", "get_quote"])
    key = rng.choice(["symbol", "ticker"])
    tool = Tool("stock", name, rng.choice(["Get the latest stock price.", "Look up a stock quote by ticker."]),
                schema({key: prop("string", maybe(rng, "Ticker symbol, e.g. AAPL"))}, [key]))
    tool.key = key
    return tool


def make_search_tool(rng):
    name = rng.choice(["search_web", "web_search", "search"])
    key = rng.choice(["query", "q"])
    props = {key: prop("string", maybe(rng, "The search query"))}
    if rng.random() < 0.4:
        props["max_results"] = prop("integer", maybe(rng, "How many results", 0.5), default=5)
    tool = Tool("search", name, rng.choice(["Search the web.", "Searches the internet for pages about a topic."]),
                schema(props, [key]))
    tool.key = key
    return tool


def make_email_tool(rng):
    name = rng.choice(["send_email", "email", "send_mail"])
    tool = Tool("email", name, rng.choice(["Send an email.", "Sends an email message to a recipient."]),
                schema({"to": prop("string", maybe(rng, "Recipient address")),
                        "subject": prop("string", maybe(rng, "Subject line")),
                        "body": prop("string", maybe(rng, "Message text"))}, ["to", "subject", "body"]))
    return tool


def make_timer_tool(rng):
    name = rng.choice(["set_timer", "start_timer", "timer"])
    tool = Tool("timer", name, rng.choice(["Start a countdown timer.", "Sets a timer."]),
                schema({"minutes": prop("integer", maybe(rng, "Duration in minutes")),
                        "label": prop("string", maybe(rng, "Optional name for the timer"))}, ["minutes"]))
    return tool


def make_location_tool(rng):
    name = rng.choice(["get_location", "get_user_location"])
    return Tool("location", name, rng.choice(["Gets the location of the user.", "Returns where the user is."]), None)


TOOL_MAKERS = {"weather": make_weather_tool, "time": make_time_tool, "calculator": make_calculator_tool,
               "currency": make_currency_tool, "stock": make_stock_tool, "search": make_search_tool,
               "email": make_email_tool, "timer": make_timer_tool, "location": make_location_tool}
CALLABLE = ["weather", "weather", "weather", "time", "calculator", "currency", "stock", "search", "email",
            "timer"]


def tool_set(rng, needed):
    """2-4 tools of distinct categories including `needed` (which may be None), in random order."""
    count = rng.randint(2, 4)
    categories = [c for c in TOOL_MAKERS if c != needed]
    rng.shuffle(categories)
    chosen = ([needed] if needed else []) + categories[:count - (1 if needed else 0)]
    rng.shuffle(chosen)
    return [TOOL_MAKERS[c](rng) for c in chosen]


def j(value):
    return json.dumps(value)


def weather_call(rng, tool, frame):
    city = pick_city(rng)
    if rng.random() < 0.15 and city in REAL_CITIES:
        city += rng.choice([", France", ", USA", ", UK", ", Japan", ", Germany", ", Canada"])
    unit = None
    if tool.unit_key and rng.random() < 0.3:
        unit = rng.choice(["celsius", "fahrenheit"])
    suffix = f" in {unit}" if unit else ""
    question = rng.choice([f"What's the weather in {city}?", f"What is the weather like in {city}{suffix}?",
                           f"How is the weather in {city} right now?", f"Is it raining in {city}?",
                           f"weather in {city}{suffix}", f"Can you check the weather in {city} for me?",
                           f"What's the temperature in {city}{suffix}?", f"Tell me the current weather in {city}.",
                           f"I'm heading to {city} today. What's the weather there{suffix}?"])
    args = {tool.key: city}
    if unit:
        args[tool.unit_key] = unit
    shown_unit = unit or "celsius"
    temp = rng.randint(-15, 38) if shown_unit == "celsius" else rng.randint(5, 100)
    cond = rng.choice(CONDITIONS)
    style = rng.randint(0, 4)
    if style == 0:
        result = j({"temperature": temp, "unit": shown_unit, "conditions": cond})
    elif style == 1:
        result = j({"location": city, "temperature": temp, "condition": cond})
    elif style == 2:
        result = j({"temp": temp, "description": cond, "humidity": rng.randint(20, 95)})
    elif style == 3:
        result = j({"city": city, "weather": cond, "temperature_" + ("c" if shown_unit == "celsius" else "f"): temp,
                    "wind_kph": rng.randint(0, 60)})
    else:
        result = f"{temp} degrees, {cond}"
    degrees = f"{temp} degrees" + (f" {shown_unit}" if style in (0, 3) or unit else "")
    final = rng.choice([f"It is currently {degrees} and {cond} in {city}.",
                        f"The weather in {city} is {cond} with a temperature of {degrees}.",
                        f"Right now in {city}: {cond}, {degrees}.",
                        f"{city} has {cond} weather at {degrees} right now."])
    return question, args, result, final, [str(temp), cond]


def time_call(rng, tool, frame):
    if rng.random() < 0.7:
        city = rng.choice(list(TIMEZONES))
        zone = TIMEZONES[city]
        place = city
        question = rng.choice([f"What time is it in {city}?", f"What's the current time in {city}?",
                               f"Tell me the local time in {city}.", f"time in {city} now?"])
    else:
        zone = rng.choice(list(TIMEZONES.values()))
        place = zone
        question = rng.choice([f"What time is it in the {zone} timezone?", f"Current time in {zone}?",
                               f"What is the time in {zone} right now?"])
    hour, minute = rng.randint(0, 23), rng.randint(0, 59)
    clock = f"{hour:02d}:{minute:02d}"
    result = j({"timezone": zone, "time": clock}) if rng.random() < 0.6 else j({"local_time": clock})
    final = rng.choice([f"It is {clock} in {place}.", f"The current time in {place} is {clock}.",
                        f"Right now it is {clock} in {place}."])
    return question, {tool.key: zone}, result, final, [clock]


def calculator_call(rng, tool, frame):
    a, b = rng.randint(10, 9999), rng.randint(2, 999)
    op = rng.choice(["+", "-", "*", "/"])
    expression = f"{a} {op} {b}"
    value = {"+": a + b, "-": a - b, "*": a * b, "/": round(a / b, 4)}[op]
    question = rng.choice([f"Use the calculator to compute {expression}.", f"Calculate {expression} with the "
                           f"calculator tool.", f"What is {expression}? Please use the calculator.",
                           f"Can you evaluate {expression} using the tool?"])
    result = j({"result": value}) if rng.random() < 0.7 else j({"value": value})
    final = rng.choice([f"{expression} = {value}.", f"The result is {value}.", f"The calculator says {value}."])
    return question, {tool.key: expression}, result, final, [str(value)]


def currency_call(rng, tool, frame):
    amount = rng.choice([rng.randint(1, 2000), rng.randint(1, 99) * 10])
    source, target = rng.sample(CURRENCIES, 2)
    question = rng.choice([f"How much is {amount} {source} in {target}?", f"Convert {amount} {source} to {target}.",
                           f"What is {amount} {source} worth in {target} today?"])
    converted = round(amount * rng.uniform(0.2, 3.0), 2)
    result = j({"converted_amount": converted, "currency": target})
    final = rng.choice([f"{amount} {source} is about {converted} {target}.",
                        f"That comes to {converted} {target}."])
    keys = tool.keys
    return question, {keys[0]: amount, keys[1]: source, keys[2]: target}, result, final, [str(converted)]


def stock_call(rng, tool, frame):
    company = rng.choice(list(TICKERS))
    symbol = TICKERS[company]
    question = rng.choice([f"What is the stock price of {symbol}?", f"How much is {company} stock ({symbol}) "
                           f"trading at?", f"Get me a quote for {symbol}."])
    price = round(rng.uniform(10, 900), 2)
    result = j({"symbol": symbol, "price": price, "currency": "USD"})
    final = rng.choice([f"{symbol} is trading at {price} USD.", f"The latest price of {symbol} is ${price}."])
    return question, {tool.key: symbol}, result, final, [str(price)]


def search_call(rng, tool, frame):
    topic = rng.choice(TOPICS)
    question = rng.choice([f"Search the web for {topic}.", f"Can you look up {topic} online?",
                           f"Find me some pages about {topic}."])
    title = topic[0].upper() + topic[1:]
    result = j({"results": [{"title": title + " - Overview", "url": "https://example.org/" +
                             topic.replace(" ", "-")}]})
    final = f"I found a page titled \"{title} - Overview\" at https://example.org/{topic.replace(' ', '-')}."
    return question, {tool.key: topic}, result, final, [title]


def email_call(rng, tool, frame):
    to = f"{rng.choice(NAMES)}@{rng.choice(DOMAINS)}"
    subject = rng.choice(WORDS).capitalize()
    body = rng.choice([f"The {rng.choice(WORDS)} is at {rng.randint(1, 12)} pm.", "See you tomorrow.",
                       f"Please send the {rng.choice(WORDS)} by Friday.", "Thanks for your help."])
    question = rng.choice([f"Send an email to {to} with subject {subject} saying: {body}",
                           f"Email {to}. Subject: {subject}. Body: {body}"])
    result = j({"status": "sent", "id": rng.randint(1000, 9999)})
    final = f"Done: the email to {to} with subject {subject} was sent."
    return question, {"to": to, "subject": subject, "body": body}, result, final, [to]


def timer_call(rng, tool, frame):
    minutes = rng.randint(1, 90)
    label = rng.choice([None, "tea", "pasta", "laundry", "workout", "break"])
    question = (f"Set a timer for {minutes} minutes for {label}." if label
                else rng.choice([f"Set a timer for {minutes} minutes.", f"Start a {minutes} minute timer."]))
    args = {"minutes": minutes}
    if label:
        args["label"] = label
    result = j({"status": "started", "minutes": minutes})
    final = f"Your {minutes} minute timer" + (f" for {label}" if label else "") + " is running."
    return question, args, result, final, [str(minutes)]


CALLS = {"weather": weather_call, "time": time_call, "calculator": calculator_call, "currency": currency_call,
         "stock": stock_call, "search": search_call, "email": email_call, "timer": timer_call}


def task_tool(rng, split):
    category = rng.choice(CALLABLE)
    tools = tool_set(rng, category)
    tool = next(t for t in tools if t.category == category)
    frame = Frame(rng, tools=[t.declaration() for t in tools])
    question, args, result, final, mentions = CALLS[category](rng, tool, frame)
    names = ", ".join(t.name for t in tools)
    analysis1 = {"low": f"Use {tool.name}.",
                 "medium": f"The user asks: {question} The {tool.name} tool fits. Call it.",
                 "high": f"The user asks: {question} Available tools: {names}. The right one is {tool.name}; "
                         f"I will call it with the arguments from the request."}[frame.effort]
    conv = frame.start(rng)
    conv.prompt(render_user(question))
    prompt1 = conv.text() + "<|start|>assistant"
    resume = rng.random() < 0.25
    if resume:
        # the client sent the call back without its reasoning (what a Chat Completions client does)
        conv.prompt(render_past_call(tool.name, j(args)))
    else:
        conv.assistant_turn([("analysis", analysis1), ("commentary", j(args), tool.name)])
    conv.prompt(render_tool_result(tool.name, result))
    prompt2 = conv.text() + "<|start|>assistant"
    analysis2 = {"low": "Report the result.",
                 "medium": f"The tool returned {result} Tell the user.",
                 "high": f"{tool.name} returned {result} I will answer the question using these values."}[frame.effort]
    conv.assistant_turn([("analysis", analysis2), ("final", final)])
    call_turn = {"prompt": prompt1, "check": {"type": "tool_call", "tool": tool.name,
                                              "parameters": tool.parameters or {}, "args": args}}
    answer_turn = {"prompt": prompt2, "check": {"type": "final_contains", "strings": mentions}}
    return conv, ([] if resume else [call_turn]) + [answer_turn]


def task_tool_unneeded(rng, split):
    """Tools are declared but the question needs none of them (no calculator among them)."""
    while True:
        tools = tool_set(rng, None)
        if all(t.category != "calculator" for t in tools):
            break
    frame = Frame(rng, tools=[t.declaration() for t in tools])
    maker = rng.choice([task_arith, task_arith, task_qa_fact_framed, task_chat_identity_framed])
    return maker(rng, split, frame)


def task_qa_fact_framed(rng, split, frame):
    country = rng.choice(list(CAPITALS))
    capital = CAPITALS[country]
    conv = frame.start(rng)
    conv.prompt(render_user(f"What is the capital of {country}?"))
    prompt = conv.text()
    conv.assistant_turn([("analysis", f"No tool is needed. The capital of {country} is {capital}."),
                         ("final", f"The capital of {country} is {capital}.")])
    return conv, [{"prompt": prompt + "<|start|>assistant", "check": {"type": "final_contains",
                                                                      "strings": [capital]}}]


def task_chat_identity_framed(rng, split, frame):
    conv = frame.start(rng)
    conv.prompt(render_user(rng.choice(["Who are you?", "Hello!", "What is your name?"])))
    prompt = conv.text()
    conv.assistant_turn([("analysis", "No tool is needed for this."), ("final", identity_answer(frame))])
    return conv, [{"prompt": prompt + "<|start|>assistant", "check": {"type": "final_contains", "strings": []}}]


def task_no_tool(rng, split):
    """The user asks for live data but no fitting tool is declared."""
    tools = tool_set(rng, None) if rng.random() < 0.5 else []
    tools = [t for t in tools if t.category != "weather"]
    frame = Frame(rng, tools=[t.declaration() for t in tools])
    city = pick_city(rng)
    conv = frame.start(rng)
    conv.prompt(render_user(f"What's the weather in {city}?"))
    prompt = conv.text()
    conv.assistant_turn([("analysis", "The user wants live weather, but I have no weather tool."),
                         ("final", f"I can't check the current weather in {city}: I have no access to live "
                                   f"weather data.")])
    return conv, [{"prompt": prompt + "<|start|>assistant", "check": {"type": "final_contains", "strings": [city]}}]


TASKS = [(task_tool, 0.36), (task_arith, 0.22), (task_convert, 0.09), (task_qa_table, 0.09), (task_qa_fact, 0.05),
         (task_chat, 0.06), (task_tool_unneeded, 0.09), (task_no_tool, 0.04)]


def make_example(rng, split):
    task = rng.choices([t for t, _ in TASKS], [w for _, w in TASKS])[0]
    conv, turns = task(rng, split)
    text = conv.text()
    if not text.isascii():
        raise ValueError("non-ASCII text generated: " + text)
    kind = task.__name__[len("task_"):]
    if kind == "tool_unneeded" and turns[0]["check"]["type"] == "final_number":
        kind = "arith_with_tools"
    return {"kind": kind, "segments": conv.segments, "turns": turns}


def generate_chunk(job):
    split, seed, count = job
    rng = random.Random(seed)
    return [json.dumps(make_example(rng, split)) for _ in range(count)]


def split_jobs(split, count, seed, chunk=1000):
    """The (split, seed, count) chunks a split is made of; train.py uses the same ones, so a split
    generated here equals the one a training run held out."""
    return [(split, seed * 1000003 + index, min(chunk, count - start))
            for index, start in enumerate(range(0, count, chunk))]


HELDOUT_SEED_OFFSET = 7777


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
    parser.add_argument("--train", type=int, default=200000)
    parser.add_argument("--heldout", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    write_split(os.path.join(args.out, "train.jsonl"), "train", args.train, args.seed, args.workers)
    write_split(os.path.join(args.out, "heldout.jsonl"), "heldout", args.heldout, args.seed + HELDOUT_SEED_OFFSET,
                args.workers)


if __name__ == "__main__":
    main()
