"""Tool families for beam-nano v2's data: what a declared function can look like, how users ask for it,
what it returns and how an answer quotes it. Pure Python 3.

A family is drawn into a concrete tool (a name, a description, parameter names and types, nesting, all
varied per conversation), a question (a template whose {slots} are the parameters' values), the call's
arguments, a result (fields under varied keys, nested or flat, with distractor fields) and a final answer
quoting the result's values exactly. TRAIN families are the only ones training ever sees; OOD families and
every family's held-out templates (every fourth, `heldout_template`) are kept for the out-of-distribution set.
"""
import json
import random
import re

REAL_CITIES = ["Paris", "London", "Tokyo", "Berlin", "Madrid", "Rome", "Cairo", "Sydney", "Toronto", "Chicago",
               "Boston", "Seattle", "Denver", "Dublin", "Oslo", "Lisbon", "Vienna", "Prague", "Warsaw", "Athens",
               "Istanbul", "Mumbai", "Delhi", "Seoul", "Beijing", "Shanghai", "Bangkok", "Singapore", "Lima",
               "Santiago", "Bogota", "Nairobi", "Lagos", "Dubai", "Moscow", "Helsinki", "Stockholm", "Zurich",
               "Geneva", "Amsterdam", "Brussels", "Miami", "Austin", "Phoenix", "Atlanta", "Houston",
               "San Francisco", "New York", "Los Angeles", "Mexico City", "Buenos Aires", "Rio de Janeiro",
               "Hong Kong", "Cape Town", "Tel Aviv", "Kyoto", "Osaka", "Munich", "Hamburg", "Milan", "Naples",
               "Barcelona", "Valencia", "Porto", "Krakow", "Budapest", "Edinburgh", "Glasgow", "Manchester",
               "Vancouver", "Montreal", "Ottawa", "Calgary", "Melbourne", "Perth", "Auckland", "Reykjavik",
               "Hanoi", "Manila", "Jakarta", "Karachi", "Lahore", "Casablanca", "Tunis", "Accra", "Doha"]
# place names as their own languages write them
NATIVE_CITIES = ["München", "Köln", "Zürich", "São Paulo", "Kraków", "Wien", "Praha", "Firenze", "Sevilla",
                 "Göteborg", "Bogotá", "Montréal", "Québec", "Málaga", "Düsseldorf", "Genève", "Lisboa", "Roma",
                 "Milano", "Napoli", "Venezia", "Warszawa", "Bruxelles", "Den Haag", "København", "Ciudad de México",
                 "Córdoba", "Reykjavík", "Malmö", "Århus", "Łódź", "Gdańsk", "Brașov", "Thessaloniki", "Nürnberg",
                 "Besançon", "Saint-Étienne", "Torino", "Antwerpen", "Lyon", "Marseille", "Bordeaux", "Porto Alegre"]
SYLLABLES = ["ka", "lo", "mi", "ra", "ven", "dor", "tal", "is", "bre", "nor", "sa", "quin", "zel", "ar", "mo",
             "thu", "pel", "ga", "rin", "ost", "vi", "lan", "dra", "ke", "sol", "mar", "ith", "ul", "bo", "fen"]
TIMEZONES = {"Tokyo": "Asia/Tokyo", "Paris": "Europe/Paris", "London": "Europe/London", "Berlin": "Europe/Berlin",
             "New York": "America/New_York", "Chicago": "America/Chicago", "Denver": "America/Denver",
             "Los Angeles": "America/Los_Angeles", "Sydney": "Australia/Sydney", "Madrid": "Europe/Madrid",
             "Rome": "Europe/Rome", "Moscow": "Europe/Moscow", "Dubai": "Asia/Dubai", "Mumbai": "Asia/Kolkata",
             "Singapore": "Asia/Singapore", "Seoul": "Asia/Seoul", "Beijing": "Asia/Shanghai",
             "Cairo": "Africa/Cairo", "Toronto": "America/Toronto", "Sao Paulo": "America/Sao_Paulo",
             "Mexico City": "America/Mexico_City", "Istanbul": "Europe/Istanbul", "Bangkok": "Asia/Bangkok",
             "Auckland": "Pacific/Auckland", "Lisbon": "Europe/Lisbon", "Vienna": "Europe/Vienna",
             "Oslo": "Europe/Oslo", "Athens": "Europe/Athens", "Nairobi": "Africa/Nairobi", "Lima": "America/Lima",
             "Jakarta": "Asia/Jakarta", "Manila": "Asia/Manila", "Helsinki": "Europe/Helsinki"}
CONDITIONS = ["sunny", "cloudy", "partly cloudy", "rainy", "light rain", "snowy", "windy", "foggy", "clear",
              "overcast", "stormy", "drizzle", "thunderstorms", "hazy", "heavy rain", "sleet", "mostly sunny"]
CURRENCIES = ["USD", "EUR", "GBP", "JPY", "CHF", "CAD", "AUD", "CNY", "INR", "SEK", "NOK", "MXN", "BRL", "KRW",
              "PLN", "ZAR"]
TICKERS = ["AAPL", "MSFT", "GOOGL", "AMZN", "TSLA", "NVDA", "META", "NFLX", "INTC", "IBM", "ORCL", "AMD", "SAP",
           "SONY", "BABA", "UBER", "SHOP", "ADBE"]
PEOPLE = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy", "maria", "li", "sam",
          "nina", "omar", "yuki", "pablo", "ingrid", "raj", "chen"]
DOMAINS = ["example.com", "mail.com", "acme.org", "work.net", "school.edu", "corp.io"]
TOPICS = ["the history of the bicycle", "how volcanoes form", "electric cars", "banana bread recipes",
          "the rules of chess", "solar panels", "Marie Curie", "visiting Japan", "growing tomatoes", "jazz history",
          "the Apollo 11 mission", "quantum computing", "deep sea fish", "the Roman empire", "learning Spanish",
          "marathon training", "black holes", "coffee brewing", "medieval castles", "machine learning"]
WORDS = ["meeting", "lunch", "report", "project", "trip", "party", "budget", "review", "standup", "dentist",
         "dinner", "invoice", "planning", "workout", "interview", "call with Sam", "yoga", "demo"]
LANGUAGES = ["Spanish", "French", "German", "Italian", "Japanese", "Portuguese", "Dutch", "Polish", "Korean"]
MOVIES = ["The Last Harbor", "Night Train", "Blue Orbit", "Paper Kings", "The Quiet Field", "Iron Garden",
          "Starfall", "Hidden Tides", "The Long Road", "Echo Valley"]
TEAMS = ["Lions", "Rovers", "Falcons", "United", "Comets", "Tigers", "Wanderers", "Sharks", "Rangers", "Eagles"]
DICT_WORDS = ["serendipity", "ephemeral", "ubiquitous", "laconic", "quixotic", "mellifluous", "gregarious",
              "pragmatic", "resilient", "candid"]


def fictional(rng):
    return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()


def city(rng):
    roll = rng.random()
    if roll < 0.55:
        return rng.choice(REAL_CITIES)
    if roll < 0.8:
        return rng.choice(NATIVE_CITIES)
    return fictional(rng)


def date(rng):
    return f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def clock(rng):
    return f"{rng.randint(0, 23):02d}:{rng.choice([0, 5, 10, 15, 20, 30, 40, 45, 50, rng.randint(0, 59)]):02d}"


def money(rng):
    return rng.choice([rng.randint(1, 5000), rng.randint(1, 99) * 10, round(rng.uniform(1, 999), 2)])


def price(rng):
    return round(rng.uniform(5, 950), 2)


def code(rng, letters, digits):
    return "".join(rng.choice("ABCDEFGHJKLMNPRSTUVWXYZ") for _ in range(letters)) + "".join(
        rng.choice("0123456789") for _ in range(digits))


class Param:
    """role: the slot name in question templates. kind: string, integer, number, boolean, enum, array, object.
    keys: parameter names to draw from. gen(rng) -> value (the question shows `phrase(value)`).
    sub: the object's members (their roles are slots too); flat_p: chance the object is spread flat."""

    def __init__(self, role, kind, keys, descs=(None,), gen=None, required=True, options=None, sub=None,
                 phrase=None, value_of=None, alt=None, flat_p=0.4):
        self.role, self.kind, self.keys, self.descs, self.gen = role, kind, keys, list(descs), gen
        self.required, self.options, self.sub, self.phrase, self.value_of = required, options, sub, phrase, value_of
        self.alt, self.flat_p = alt, flat_p


class Family:
    synthetic = False   # made up by synthetic_family() for one conversation

    def __init__(self, name, names, descs, params, questions, result, answers, need, follow=None):
        """result(rng, values) -> [(field, value, key pool)]; the first `main` fields (those in answers'
        slots) are what an answer must quote. need: what the user lacks when no tool fits (no tool name).
        follow: the role a follow-up question changes ("And in Rome?")."""
        self.name, self.names, self.descs, self.params = name, names, descs, params
        self.questions, self.result, self.answers, self.need, self.follow = questions, result, answers, need, follow


def P(*args, **kwargs):
    return Param(*args, **kwargs)


CITY_KEYS = ["city", "location", "place", "city_name", "town", "where", "loc", "locality"]


def unit_param():
    return P("unit", "enum", ["unit", "units", "temp_unit", "scale", "temperature_unit"],
             [None, "Temperature unit", "Units for the temperature"], required=False, options=["celsius", "fahrenheit"])


TRAIN = [
    Family("weather", ["get_weather", "get_current_weather", "weather_now", "lookup_weather", "fetch_weather",
                       "current_conditions", "weather", "check_weather", "getWeather", "weather_lookup"],
           ["Get the current weather for a city.", "Gets the current weather in the provided location.",
            "Look up current weather conditions.", "Returns the weather right now in a given place.",
            "Current temperature and conditions for a location.", "Weather report for a city."],
           [P("city", "string", CITY_KEYS, [None, "The city name, e.g. Paris", "City and country, e.g. Paris, France",
                                            "Name of the location"], city), unit_param()],
           ["What's the weather in {city}?", "How is the weather in {city} right now?", "Is it raining in {city}?",
            "weather in {city} in {unit}", "What's the temperature in {city} in {unit}?",
            "Tell me the current weather in {city}.", "I'm heading to {city} today. What's the weather there?",
            "Can you check the weather in {city} for me?", "how hot is it in {city}",
            "Do I need an umbrella in {city} today?", "Current conditions in {city} please, in {unit}.",
            "What's it like outside in {city}?", "Is it cold in {city} right now?", "{city} weather?",
            "Give me the weather for {city}.", "What is the weather like in {city} at the moment?"],
           lambda rng, v: [("temperature", rng.randint(-15, 38), ["temperature", "temp", "temp_c", "degrees",
                                                                  "current_temp", "t"]),
                           ("conditions", rng.choice(CONDITIONS), ["conditions", "condition", "sky", "summary",
                                                                   "description", "weather", "status"]),
                           ("humidity", rng.randint(10, 99), ["humidity", "humidity_pct", "rh"]),
                           ("wind", rng.randint(0, 70), ["wind_kph", "wind", "wind_speed"])],
           ["It is {temperature} degrees and {conditions} in {city}.", "{city}: {conditions}, {temperature} degrees.",
            "The weather in {city} is {conditions} with a temperature of {temperature} degrees.",
            "Right now {city} has {conditions} weather at {temperature} degrees."],
           "live weather data", follow="city"),
    Family("forecast", ["get_forecast", "weather_forecast", "forecast", "daily_forecast", "getForecast"],
           ["Get the weather forecast for the next days.", "Multi-day forecast for a city.",
            "Returns the forecast (highs and lows) for a location."],
           [P("city", "string", CITY_KEYS, [None, "City to forecast"], city),
            P("days", "integer", ["days", "num_days", "horizon", "day_count"], [None, "Number of days, 1-7"],
              lambda rng: rng.randint(1, 7), required=False)],
           ["What's the forecast for {city}?", "Forecast for {city} for the next {days} days?",
            "Will it rain in {city} this week?", "Give me a {days} day forecast for {city}.",
            "What will the weather be like in {city} tomorrow?", "{city} forecast, {days} days please",
            "How will the weather be in {city} over the next {days} days?", "Weather outlook for {city}?"],
           lambda rng, v: [("high", rng.randint(-5, 40), ["high", "max_temp", "temp_max", "hi"]),
                           ("low", rng.randint(-20, 25), ["low", "min_temp", "temp_min", "lo"]),
                           ("summary", rng.choice(CONDITIONS), ["summary", "conditions", "outlook", "sky"])],
           ["The forecast for {city}: {summary}, high {high}, low {low}.",
            "Expect {summary} in {city} with a high of {high} and a low of {low}."],
           "weather forecasts", follow="city"),
    Family("time", ["get_time", "get_current_time", "current_time", "get_local_time", "time_now", "world_clock",
                    "getTime", "clock"],
           ["Get the current time in a timezone.", "Returns the current local time.", "Current time lookup.",
            "Tells the local time at a place."],
           [P("place", "string", CITY_KEYS, [None, "City name"], lambda rng: rng.choice(list(TIMEZONES)),
              alt=P("place", "string", ["timezone", "tz", "time_zone", "zone", "iana_timezone"],
                    ["IANA timezone name, e.g. Europe/Paris", "Timezone such as America/New_York", None],
                    value_of=lambda c: TIMEZONES[c]))],
           ["What time is it in {place}?", "What's the current time in {place}?", "Tell me the local time in {place}.",
            "time in {place} now?", "Is it late in {place} right now?", "What's the clock saying in {place}?",
            "Do you know what time it is in {place}?", "current local time {place}",
            "I need to call someone in {place}. What time is it there?", "Whats the time in {place}"],
           lambda rng, v: [("time", clock(rng), ["time", "local_time", "current_time", "now", "clock"]),
                           ("date", date(rng), ["date", "local_date", "day"])],
           ["It is {time} in {place}.", "The current time in {place} is {time}.", "Right now it is {time} in {place}."],
           "a clock or live time data", follow="place"),
    Family("currency", ["convert_currency", "currency_convert", "exchange", "fx_convert", "convertMoney",
                        "exchange_rate"],
           ["Convert money between currencies.", "Currency conversion at today's rate.",
            "Converts an amount from one currency to another."],
           [P("amount", "number", ["amount", "value", "sum", "qty"], [None, "Amount of money"], money),
            P("source", "string", ["from_currency", "from", "source", "base", "src"], [None, "Currency code, e.g. USD"],
              lambda rng: rng.choice(CURRENCIES)),
            P("target", "string", ["to_currency", "to", "target", "quote", "dest"], [None, "Currency code, e.g. EUR"],
              lambda rng: rng.choice(CURRENCIES))],
           ["How much is {amount} {source} in {target}?", "Convert {amount} {source} to {target}.",
            "What is {amount} {source} worth in {target} today?", "{amount} {source} to {target}?",
            "I have {amount} {source}. How many {target} is that?", "Exchange {amount} {source} into {target} please.",
            "what do {amount} {source} come to in {target}", "Change {amount} {source} to {target} for me."],
           lambda rng, v: [("converted", round(float(v["amount"]) * rng.uniform(0.1, 9), 2),
                            ["converted_amount", "result", "converted", "amount_out", "value"]),
                           ("rate", round(rng.uniform(0.1, 9), 4), ["rate", "exchange_rate", "fx_rate"])],
           ["{amount} {source} is about {converted} {target}.", "That comes to {converted} {target}.",
            "{amount} {source} = {converted} {target} at today's rate."],
           "live exchange rates"),
    Family("stock", ["get_stock_price", "stock_quote", "get_quote", "ticker_price", "getStockPrice", "market_price"],
           ["Get the latest stock price.", "Look up a stock quote by ticker.", "Latest trading price of a share."],
           [P("symbol", "string", ["symbol", "ticker", "stock", "code"], [None, "Ticker symbol, e.g. AAPL"],
              lambda rng: rng.choice(TICKERS))],
           ["What is the stock price of {symbol}?", "How much is {symbol} trading at?", "Get me a quote for {symbol}.",
            "{symbol} share price?", "How is {symbol} doing today?", "price of {symbol} stock",
            "What's {symbol} at right now?", "Check the {symbol} quote."],
           lambda rng, v: [("price", price(rng), ["price", "last", "last_price", "quote", "value"]),
                           ("change", round(rng.uniform(-9, 9), 2), ["change", "change_pct", "delta"]),
                           ("currency", "USD", ["currency", "ccy"])],
           ["{symbol} is trading at {price}.", "The latest price of {symbol} is {price}.",
            "{symbol}: {price} right now."],
           "live market data", follow="symbol"),
    Family("search", ["search_web", "web_search", "search", "internet_search", "find_pages", "searchWeb", "lookup"],
           ["Search the web.", "Searches the internet for pages about a topic.", "Web search returning top results."],
           [P("query", "string", ["query", "q", "search_query", "terms", "text"], [None, "The search query"],
              lambda rng: rng.choice(TOPICS)),
            P("count", "integer", ["max_results", "limit", "num_results", "count", "top_k"], [None, "How many results"],
              lambda rng: rng.randint(1, 10), required=False)],
           ["Search the web for {query}.", "Can you look up {query} online?", "Find me some pages about {query}.",
            "Search for {query} and give me {count} results.", "google {query}", "Look up {query} for me.",
            "I want to read about {query}. Search please.", "Find {count} articles on {query}."],
           lambda rng, v: [("title", str(v["query"])[0].upper() + str(v["query"])[1:] + " - " +
                            rng.choice(["Overview", "Guide", "Wikipedia", "Basics", "FAQ"]), ["title", "name", "heading"]),
                           ("url", "https://" + rng.choice(["example.org", "wiki.net", "info.com"]) + "/" +
                            str(rng.randint(100, 999)), ["url", "link", "href"])],
           ["I found \"{title}\" at {url}.", "Top result: {title} ({url}).", "Here is a page: {title}, {url}."],
           "web search"),
    Family("calendar_add", ["create_event", "add_event", "schedule_event", "calendar_add", "new_meeting",
                            "createEvent", "book_meeting"],
           ["Create a calendar event.", "Adds an event to the user's calendar.", "Schedule a meeting."],
           [P("title", "string", ["title", "name", "summary", "subject"], [None, "Event title"],
              lambda rng: rng.choice(WORDS).capitalize()),
            P("start", "object", ["start", "when", "time_slot", "starts"], [None, "When the event starts"],
              sub=[P("date", "string", ["date", "day", "on"], [None, "Date, YYYY-MM-DD"], date),
                   P("time", "string", ["time", "at", "hour", "start_time"], [None, "Time, HH:MM"], clock,
                     required=False)]),
            P("attendees", "array", ["attendees", "guests", "invitees", "participants"], [None, "Email addresses"],
              lambda rng: [f"{rng.choice(PEOPLE)}@{rng.choice(DOMAINS)}" for _ in range(rng.randint(1, 2))],
              required=False),
            P("duration", "integer", ["duration_minutes", "duration", "length_min", "minutes"], [None, "Length in minutes"],
              lambda rng: rng.choice([15, 30, 45, 60, 90, 120]), required=False)],
           ["Schedule {title} on {date} at {time}.", "Add {title} to my calendar on {date}.",
            "Create an event called {title} for {date} at {time} with {attendees}.",
            "Put a {duration} minute {title} on {date} at {time}.", "book {title} {date} {time}",
            "Set up {title} on {date} and invite {attendees}.", "New calendar event: {title}, {date}.",
            "Can you schedule a {duration} minute {title} on {date}?"],
           lambda rng, v: [("event_id", code(rng, 3, 4), ["event_id", "id", "eventId", "ref"]),
                           ("status", rng.choice(["created", "confirmed", "scheduled"]), ["status", "state", "result"])],
           ["Done: {title} is {status} on {date} (id {event_id}).", "Your event {title} on {date} was {status}, "
            "id {event_id}."],
           "access to your calendar"),
    Family("calendar_list", ["list_events", "get_events", "calendar_list", "agenda", "my_schedule", "listEvents"],
           ["List calendar events for a day.", "Shows the user's agenda.", "Returns events on a date."],
           [P("date", "string", ["date", "day", "on_date"], [None, "Date, YYYY-MM-DD"], date),
            P("calendar", "enum", ["calendar", "which", "cal"], [None, "Which calendar"], required=False,
              options=["work", "personal", "family"])],
           ["What's on my calendar on {date}?", "Do I have anything on {date}?", "Show my {calendar} events for {date}.",
            "What meetings do I have on {date}?", "agenda {date}", "List my {calendar} calendar for {date}.",
            "Am I busy on {date}?", "What is scheduled for {date} in my {calendar} calendar?"],
           lambda rng, v: [("title", rng.choice(WORDS).capitalize(), ["title", "name", "summary", "event"]),
                           ("time", clock(rng), ["time", "start", "at", "starts_at"])],
           ["On {date} you have {title} at {time}.", "You have one event on {date}: {title} at {time}."],
           "access to your calendar"),
    Family("email", ["send_email", "email", "send_mail", "compose_email", "sendEmail", "mail_send"],
           ["Send an email.", "Sends an email message to a recipient.", "Email someone."],
           [P("to", "string", ["to", "recipient", "address", "email_to"], [None, "Recipient address"],
              lambda rng: f"{rng.choice(PEOPLE)}@{rng.choice(DOMAINS)}"),
            P("subject", "string", ["subject", "title", "topic"], [None, "Subject line"],
              lambda rng: rng.choice(WORDS).capitalize()),
            P("body", "string", ["body", "text", "message", "content"], [None, "Message text"],
              lambda rng: rng.choice(["See you tomorrow.", "Thanks for your help.", "The report is ready.",
                                      f"Running {rng.randint(5, 30)} minutes late.", "Can we move it to Friday?"]))],
           ["Send an email to {to} with subject {subject} saying: {body}", "Email {to}. Subject: {subject}. Body: {body}",
            "Write to {to}, subject {subject}, message: {body}", "mail {to} subject {subject} text {body}",
            "Please email {to} about {subject}: {body}", "Shoot {to} an email titled {subject}: {body}"],
           lambda rng, v: [("message_id", code(rng, 2, 6), ["message_id", "id", "msg_id"]),
                           ("status", rng.choice(["sent", "queued", "delivered"]), ["status", "state"])],
           ["Your email to {to} was {status} (id {message_id}).", "Done: the message to {to} is {status}, "
            "id {message_id}."],
           "email access"),
    Family("timer", ["set_timer", "start_timer", "timer", "countdown", "setTimer", "create_timer"],
           ["Start a countdown timer.", "Sets a timer.", "Creates a timer that rings after some minutes."],
           [P("minutes", "integer", ["minutes", "duration", "mins", "length"], [None, "Duration in minutes"],
              lambda rng: rng.randint(1, 120)),
            P("label", "string", ["label", "name", "title", "tag"], [None, "Optional name for the timer"],
              lambda rng: rng.choice(["tea", "pasta", "laundry", "workout", "break", "oven", "eggs"]), required=False)],
           ["Set a timer for {minutes} minutes.", "Start a {minutes} minute timer for {label}.",
            "timer {minutes} min", "Remind me in {minutes} minutes with a timer called {label}.",
            "Can you start a countdown of {minutes} minutes?", "Set a {label} timer for {minutes} minutes.",
            "I need a {minutes} minute timer please.", "{minutes} minutes timer for the {label}"],
           lambda rng, v: [("timer_id", code(rng, 1, 3), ["timer_id", "id", "handle"]),
                           ("ends_at", clock(rng), ["ends_at", "rings_at", "end_time", "done_at"])],
           ["Your {minutes} minute timer is running; it ends at {ends_at}.", "Timer {timer_id} set: it rings at "
            "{ends_at}."],
           "a timer"),
    Family("translate", ["translate", "translate_text", "translator", "translateText", "to_language"],
           ["Translate text into another language.", "Machine translation.", "Translates a phrase."],
           [P("text", "string", ["text", "source_text", "phrase", "input", "q"], [None, "Text to translate"],
              lambda rng: rng.choice(["good morning", "where is the station", "thank you very much", "the bill please",
                                      "I love this city", "see you soon", "how much does it cost"])),
            P("language", "string", ["target_language", "to", "language", "target", "lang"], [None, "Target language"],
              lambda rng: rng.choice(LANGUAGES))],
           ["Translate \"{text}\" into {language}.", "How do you say {text} in {language}?",
            "Translate {text} to {language} please.", "What is \"{text}\" in {language}?",
            "{language} for \"{text}\"?", "Can you put \"{text}\" into {language}?"],
           lambda rng, v: [("translation", " ".join(fictional(rng).lower() for _ in range(rng.randint(1, 3))),
                            ["translation", "translated_text", "result", "output", "text"])],
           ["In {language}: \"{translation}\".", "\"{text}\" in {language} is \"{translation}\"."],
           "translation"),
    Family("flight", ["flight_status", "get_flight_status", "track_flight", "flightInfo", "check_flight"],
           ["Get the status of a flight.", "Live flight status by flight number.", "Tracks a flight."],
           [P("flight", "string", ["flight_number", "flight", "flight_no", "number", "code"],
              [None, "Flight number, e.g. LH 454"], lambda rng: code(rng, 2, 0) + " " + str(rng.randint(10, 9999)))],
           ["What's the status of flight {flight}?", "Is {flight} on time?", "Track flight {flight}.",
            "When does {flight} leave?", "status {flight}", "Check flight {flight} for me.",
            "Has flight {flight} departed yet?", "Which gate is {flight} at?"],
           lambda rng, v: [("status", rng.choice(["on time", "delayed", "boarding", "departed", "cancelled"]),
                            ["status", "state", "flight_status"]),
                           ("gate", code(rng, 1, 2), ["gate", "departure_gate"]),
                           ("departure", clock(rng), ["departure", "departs", "scheduled_departure", "etd"])],
           ["Flight {flight} is {status}, gate {gate}, departure {departure}.",
            "{flight}: {status}; it leaves at {departure} from gate {gate}."],
           "live flight data", follow="flight"),
    Family("units", ["convert_units", "unit_convert", "convert", "unit_converter", "convertUnits"],
           ["Convert a quantity between units.", "Unit conversion (length, mass, volume, temperature).",
            "Converts values from one unit to another."],
           [P("value", "number", ["value", "amount", "quantity", "number", "x"], [None, "The quantity"],
              lambda rng: rng.choice([rng.randint(1, 500), round(rng.uniform(0.5, 100), 1)])),
            P("from_unit", "string", ["from_unit", "from", "source_unit", "unit_in"], [None, "Unit to convert from"],
              lambda rng: rng.choice(["miles", "km", "pounds", "kg", "feet", "meters", "gallons", "liters", "ounces",
                                      "grams", "inches", "cm"])),
            P("to_unit", "string", ["to_unit", "to", "target_unit", "unit_out"], [None, "Unit to convert to"],
              lambda rng: rng.choice(["km", "miles", "kg", "pounds", "meters", "feet", "liters", "gallons", "grams",
                                      "ounces", "cm", "inches"]))],
           ["Convert {value} {from_unit} to {to_unit} with the converter.", "Use the unit tool: {value} {from_unit} in "
            "{to_unit}?", "Please run a conversion of {value} {from_unit} into {to_unit}.",
            "unit convert {value} {from_unit} -> {to_unit}", "With the converter, how many {to_unit} is {value} "
            "{from_unit}?", "Convert {value} {from_unit} into {to_unit} using the tool."],
           lambda rng, v: [("result", round(rng.uniform(0.1, 900), 3), ["result", "value", "converted", "output"])],
           ["{value} {from_unit} is {result} {to_unit}.", "That is {result} {to_unit}."],
           "a unit converter"),
    Family("news", ["get_news", "news_headlines", "latest_news", "top_stories", "getNews", "news"],
           ["Latest news headlines on a topic.", "Fetches current headlines.", "Top stories for a subject."],
           [P("topic", "string", ["topic", "query", "subject", "category"], [None, "News topic"],
              lambda rng: rng.choice(["technology", "sports", "climate", "elections", "space", "markets", "health"])),
            P("limit", "integer", ["limit", "count", "max_items", "n"], [None, "Number of headlines"],
              lambda rng: rng.randint(1, 5), required=False)],
           ["What's the latest news on {topic}?", "Any {topic} headlines today?", "Give me {limit} {topic} stories.",
            "news about {topic}", "What happened in {topic} today?", "Top {limit} headlines about {topic} please."],
           lambda rng, v: [("headline", fictional(rng) + " " + rng.choice(["wins award", "announces plan",
                                                                            "breaks record", "opens new site",
                                                                            "reports growth"]),
                            ["headline", "title", "top_story", "text"]),
                           ("source", rng.choice(["Daily Star", "Global Wire", "Metro News", "The Ledger"]),
                            ["source", "outlet", "publisher"])],
           ["Top {topic} story: \"{headline}\" ({source}).", "{source} reports: {headline}."],
           "live news"),
    Family("reminder", ["create_reminder", "remind_me", "add_reminder", "set_reminder", "newReminder"],
           ["Create a reminder.", "Sets a reminder at a date and time.", "Reminds the user of something."],
           [P("text", "string", ["text", "message", "what", "note", "title"], [None, "What to remember"],
              lambda rng: rng.choice(["call mom", "buy milk", "pay rent", "water the plants", "submit the report",
                                      "book tickets", "take medicine"])),
            P("when", "object", ["when", "at", "due", "schedule"], [None, "When to remind"],
              sub=[P("date", "string", ["date", "day"], [None, "YYYY-MM-DD"], date),
                   P("time", "string", ["time", "hour", "at"], [None, "HH:MM"], clock)])],
           ["Remind me to {text} on {date} at {time}.", "Set a reminder: {text}, {date} {time}.",
            "Don't let me forget to {text} on {date} at {time}.", "reminder {text} {date} {time}",
            "Create a reminder for {date} at {time} to {text}.", "Please remind me at {time} on {date} to {text}."],
           lambda rng, v: [("reminder_id", code(rng, 2, 3), ["reminder_id", "id", "ref"]),
                           ("status", rng.choice(["set", "saved", "scheduled"]), ["status", "state"])],
           ["Reminder {status}: {text} on {date} at {time} (id {reminder_id}).",
            "OK, I will remind you to {text} at {time} on {date}; reminder {reminder_id} is {status}."],
           "reminders"),
    Family("package", ["track_package", "package_status", "get_shipment", "trackParcel", "where_is_my_order"],
           ["Track a package by tracking number.", "Shipment status lookup.", "Where a parcel is now."],
           [P("tracking", "string", ["tracking_number", "tracking_id", "number", "parcel_id", "code"],
              [None, "Tracking number"], lambda rng: code(rng, 2, 9)),
            P("carrier", "enum", ["carrier", "service", "courier"], [None, "Shipping company"], required=False,
              options=["ups", "fedex", "dhl", "usps"])],
           ["Where is my package {tracking}?", "Track {tracking} with {carrier}.", "Status of parcel {tracking}?",
            "Has {tracking} been delivered?", "track {tracking}", "Can you check shipment {tracking} on {carrier}?"],
           lambda rng, v: [("status", rng.choice(["in transit", "delivered", "out for delivery", "at depot"]),
                            ["status", "state", "shipment_status"]),
                           ("location", city(rng), ["location", "last_seen", "where", "city"])],
           ["Package {tracking} is {status}, last seen in {location}.", "{tracking}: {status} ({location})."],
           "package tracking"),
    Family("restaurant", ["find_restaurants", "search_restaurants", "restaurant_search", "places_food",
                          "findRestaurant"],
           ["Find restaurants in a city.", "Searches for places to eat.", "Restaurant finder by city and cuisine."],
           [P("city", "string", CITY_KEYS, [None, "City"], city),
            P("cuisine", "string", ["cuisine", "food", "type", "kind"], [None, "Type of food"],
              lambda rng: rng.choice(["italian", "sushi", "thai", "vegan", "mexican", "indian", "pizza"]),
              required=False),
            P("price", "enum", ["price", "budget", "price_level"], [None, "Price range"], required=False,
              options=["cheap", "moderate", "expensive"])],
           ["Find a {cuisine} restaurant in {city}.", "Where can I eat in {city}?", "Any {price} {cuisine} places "
            "in {city}?", "restaurants {city} {cuisine}", "Recommend a {price} place to eat in {city}.",
            "I'm hungry in {city}. Find me {cuisine} food."],
           lambda rng, v: [("name", fictional(rng) + " " + rng.choice(["Kitchen", "Bistro", "House", "Grill", "Cafe"]),
                            ["name", "restaurant", "title", "place"]),
                           ("rating", round(rng.uniform(3.0, 5.0), 1), ["rating", "stars", "score"])],
           ["Try {name} in {city}, rated {rating}.", "{name} ({rating} stars) is a good pick in {city}."],
           "restaurant listings", follow="city"),
    Family("calculator", ["calculator", "calculate", "evaluate_expression", "math", "calc", "compute"],
           ["Evaluate a math expression.", "A simple calculator.", "Computes the value of an arithmetic expression."],
           [P("expression", "string", ["expression", "expr", "input", "formula"],
              [None, "The expression, e.g. 2 * (3 + 4)"],
              lambda rng: f"{rng.randint(10, 99999)} {rng.choice('+-*/')} {rng.randint(2, 9999)}")],
           ["Use the calculator to compute {expression}.", "Calculate {expression} with the calculator tool.",
            "What is {expression}? Please use the calculator.", "Can you evaluate {expression} using the tool?",
            "calculator: {expression}", "Run {expression} through the calculator."],
           lambda rng, v: [("result", _evaluate(v["expression"]), ["result", "value", "answer", "output"])],
           ["{expression} = {result}.", "The result is {result}.", "The calculator says {result}."],
           "a calculator"),
]


def _evaluate(expression):
    a, op, b = expression.split()
    a, b = int(a), int(b)
    return {"+": a + b, "-": a - b, "*": a * b, "/": round(a / b, 4)}[op]


OOD = [
    Family("hotel", ["search_hotels", "find_hotel", "hotel_search", "book_hotel", "findLodging"],
           ["Search hotels in a city.", "Finds hotel rooms for given dates.", "Hotel availability."],
           [P("city", "string", CITY_KEYS, [None, "Destination city"], city),
            P("check_in", "string", ["check_in", "checkin", "arrival", "from_date"], [None, "YYYY-MM-DD"], date),
            P("nights", "integer", ["nights", "num_nights", "stay_length"], [None, "Number of nights"],
              lambda rng: rng.randint(1, 14)),
            P("guests", "integer", ["guests", "adults", "people"], [None, "Number of guests"],
              lambda rng: rng.randint(1, 6), required=False)],
           ["Find me a hotel in {city} from {check_in} for {nights} nights.", "I need a room in {city}, arriving "
            "{check_in}, {nights} nights, {guests} guests.", "hotel {city} {check_in} {nights} nights",
            "Any hotels in {city} for {nights} nights starting {check_in}?"],
           lambda rng, v: [("hotel", fictional(rng) + " " + rng.choice(["Hotel", "Inn", "Suites", "Lodge"]),
                            ["hotel", "name", "property"]),
                           ("price", price(rng), ["price_per_night", "price", "nightly_rate", "rate"])],
           ["{hotel} in {city} has a room at {price} per night.", "Found {hotel}: {price} a night."],
           "hotel bookings", follow="city"),
    Family("air_quality", ["get_air_quality", "air_quality", "aqi_lookup", "pollution_level", "getAQI"],
           ["Air quality index for a city.", "Current pollution levels.", "Returns the AQI of a place."],
           [P("city", "string", CITY_KEYS, [None, "City name"], city),
            P("pollutant", "enum", ["pollutant", "metric", "kind"], [None, "Which pollutant"], required=False,
              options=["pm25", "pm10", "ozone", "no2"])],
           ["How is the air quality in {city}?", "What's the AQI in {city} right now?", "Is the air clean in {city}?",
            "{pollutant} levels in {city}?", "air quality {city}", "Check {pollutant} pollution in {city}."],
           lambda rng, v: [("aqi", rng.randint(5, 300), ["aqi", "index", "air_quality_index", "value"]),
                           ("category", rng.choice(["good", "moderate", "unhealthy", "very unhealthy"]),
                            ["category", "level", "label", "rating"])],
           ["The air quality index in {city} is {aqi} ({category}).", "{city}: AQI {aqi}, {category}."],
           "air quality data", follow="city"),
    Family("showtimes", ["get_showtimes", "movie_times", "cinema_schedule", "find_screenings", "showTimes"],
           ["Movie showtimes in a city.", "When a film is playing nearby.", "Cinema listings for a movie."],
           [P("movie", "string", ["movie", "film", "title"], [None, "Movie title"], lambda rng: rng.choice(MOVIES)),
            P("city", "string", CITY_KEYS, [None, "City"], city),
            P("date", "string", ["date", "day", "when"], [None, "YYYY-MM-DD"], date, required=False)],
           ["When is {movie} playing in {city}?", "Showtimes for {movie} in {city} on {date}?",
            "Where can I watch {movie} in {city}?", "{movie} {city} times", "Find screenings of {movie} in {city}."],
           lambda rng, v: [("cinema", fictional(rng) + " " + rng.choice(["Cinema", "Theater", "Pictures"]),
                            ["cinema", "theater", "venue"]),
                           ("time", clock(rng), ["time", "showtime", "starts", "start_time"])],
           ["{movie} plays at {cinema} at {time}.", "You can see {movie} at {time} at {cinema}."],
           "cinema listings"),
    Family("sports", ["get_score", "match_result", "sports_scores", "latest_game", "teamScore"],
           ["Latest match result for a team.", "Sports scores.", "Gets the score of a team's last game."],
           [P("team", "string", ["team", "club", "team_name", "side"], [None, "Team name"], lambda rng: (
               rng.choice(["North", "South", "East", "West", "City", "Harbor"]) + " " + rng.choice(TEAMS))),
            P("league", "enum", ["league", "competition", "sport"], [None, "League"], required=False,
              options=["football", "basketball", "hockey", "baseball"])],
           ["How did the {team} do last night?", "What was the score of the {team} game?", "Did the {team} win?",
            "{team} {league} score", "Latest {league} result for the {team}?"],
           lambda rng, v: [("score", f"{rng.randint(0, 9)}-{rng.randint(0, 9)}", ["score", "result", "final_score"]),
                           ("opponent", rng.choice(["North", "South", "Bay", "Valley"]) + " " + rng.choice(TEAMS),
                            ["opponent", "vs", "against", "rival"])],
           ["The {team} played {opponent}; the score was {score}.", "{team} vs {opponent}: {score}."],
           "live sports results", follow="team"),
    Family("dictionary", ["define_word", "dictionary", "lookup_definition", "word_meaning", "define"],
           ["Dictionary definitions.", "Looks up what a word means.", "Returns a word's definition."],
           [P("word", "string", ["word", "term", "entry", "query"], [None, "The word"],
              lambda rng: rng.choice(DICT_WORDS)),
            P("language", "enum", ["language", "lang", "dictionary"], [None, "Dictionary language"], required=False,
              options=["en", "es", "fr", "de"])],
           ["What does {word} mean?", "Define {word}.", "Look up the definition of {word} in the {language} "
            "dictionary.", "meaning of {word}", "Can you give me the definition of \"{word}\"?"],
           lambda rng, v: [("definition", rng.choice(["lasting a very short time", "found everywhere",
                                                      "using few words", "very friendly", "sweet sounding",
                                                      "able to recover quickly", "honest and direct"]),
                            ["definition", "meaning", "gloss", "sense"]),
                           ("part_of_speech", rng.choice(["adjective", "noun"]), ["part_of_speech", "pos", "type"])],
           ["{word} ({part_of_speech}): {definition}.", "\"{word}\" means {definition}."],
           "a dictionary"),
    Family("ride", ["estimate_ride", "ride_quote", "taxi_price", "get_ride_estimate", "rideEstimate"],
           ["Price and pickup time of a ride.", "Taxi fare estimate between two places.", "Ride-hailing quote."],
           [P("pickup", "string", ["pickup", "from", "origin", "start"], [None, "Pickup address"],
              lambda rng: f"{rng.randint(1, 999)} {fictional(rng)} Street"),
            P("dropoff", "string", ["dropoff", "to", "destination", "end"], [None, "Destination"],
              lambda rng: rng.choice(["the airport", "Central Station", "City Hall", "the harbor"])),
            P("service", "enum", ["service", "tier", "ride_type"], [None, "Ride class"], required=False,
              options=["economy", "comfort", "premium"])],
           ["How much is a ride from {pickup} to {dropoff}?", "Get me a {service} ride quote from {pickup} to "
            "{dropoff}.", "taxi {pickup} to {dropoff} price", "What would a {service} car from {pickup} to {dropoff} "
            "cost?"],
           lambda rng, v: [("price", price(rng), ["price", "fare", "estimate", "cost"]),
                           ("eta", rng.randint(2, 30), ["eta_minutes", "eta", "pickup_in", "wait"])],
           ["A ride from {pickup} to {dropoff} costs {price}; pickup in {eta} minutes.",
            "Fare {price}, the car arrives in {eta} minutes."],
           "ride booking"),
]

FAMILIES = {f.name: f for f in TRAIN + OOD}


def heldout_template(index):
    """Every fourth template of a family (and of each arithmetic/chat question list) is held out."""
    return index % 4 == 3


def templates(items, split):
    """The templates a split may draw: training and in-distribution held-out draw the kept ones, the OOD set
    the held-out ones (or all of them for an OOD family, whose templates training never sees)."""
    if split == "ood":
        chosen = [t for i, t in enumerate(items) if heldout_template(i)]
    else:
        chosen = [t for i, t in enumerate(items) if not heldout_template(i)]
    return chosen or list(items)


def family_templates(family, split):
    if family in OOD or family.synthetic:
        return list(family.questions)
    return templates(family.questions, split)


# ---------------------------------------------------------------- concrete tools

def _camel(name):
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def _style_name(rng, name):
    roll = rng.random()
    if roll < 0.12 and "_" in name:
        return _camel(name)
    if roll < 0.2:
        return rng.choice(["my_", "app_", "tool_", "acme_", "svc_"]) + name
    if roll < 0.25:
        return name + rng.choice(["_v2", "_tool", "_api"])
    return name


class Tool:
    """A family drawn into one declaration: name, description, parameters (flat or nested)."""

    def __init__(self, rng, family, camel_keys=None, drop_optional=True):
        self.family = family
        self.drop_optional = drop_optional
        self.category = family.name
        self.name = _style_name(rng, rng.choice(family.names))
        self.description = rng.choice(family.descs) if rng.random() < 0.92 else None
        camel = rng.random() < 0.15 if camel_keys is None else camel_keys
        self.slots = {}          # role -> (path of keys, Param)
        self.parameters = self._object(rng, family.params, (), camel)

    def _key(self, rng, param, camel, taken):
        for _ in range(10):
            key = rng.choice(param.keys)
            key = _camel(key) if camel else key
            if key not in taken:
                return key
        return param.role + str(len(taken))

    def _object(self, rng, params, path, camel):
        properties, required = {}, []
        for param in params:
            if self.drop_optional and not param.required and rng.random() < 0.3:
                continue  # tools differ in which optional parameters they have at all
            if param.alt is not None and rng.random() < 0.5:
                param = Param(param.role, param.alt.kind, param.alt.keys, param.alt.descs, param.gen,
                              param.required, value_of=param.alt.value_of)
            if param.kind == "object" and rng.random() < param.flat_p:
                flat = self._object(rng, param.sub, path, camel)
                for key, value in flat["properties"].items():
                    if key not in properties:
                        properties[key] = value
                required += [k for k in flat.get("required", []) if k in properties]
                continue
            key = self._key(rng, param, camel, properties)
            schema = {"type": {"enum": "string"}.get(param.kind, param.kind)}
            description = rng.choice(param.descs)
            if description:
                schema["description"] = description
            if param.kind == "enum":
                schema["enum"] = list(param.options)
                if rng.random() < 0.3:
                    schema["default"] = param.options[0]
            elif param.kind == "array":
                schema["items"] = {"type": "string"}
            elif param.kind == "object":
                inner = self._object(rng, param.sub, path + (key,), camel)
                schema.update({"properties": inner["properties"], "required": inner["required"]})
            elif param.kind == "integer" and rng.random() < 0.2 and not param.required:
                schema["default"] = param.gen(random.Random(0))
            if param.kind != "object":
                self.slots[param.role] = (path + (key,), param)
            properties[key] = schema
            if param.required:
                required.append(key)
        return {"type": "object", "properties": properties, "required": required}

    def declaration(self):
        out = {"name": self.name}
        if self.description:
            out["description"] = self.description
        out["parameters"] = self.parameters
        return out


def required_roles(tool):
    """Roles the call must carry: the parameter and every object above it are required."""
    out = set()
    for role, (path, param) in tool.slots.items():
        schema, required = tool.parameters, param.required
        for key in path:
            required = required and key in schema.get("required", [])
            schema = schema["properties"][key]
        if required:
            out.add(role)
    return out


def fitting_templates(tool, split):
    """The split's question templates this tool can answer: every required role asked, no role it lacks."""
    needed = required_roles(tool)
    return [t for t in family_templates(tool.family, split) if needed <= slots_of(t) <= set(tool.slots)]


def slots_of(template):
    return set(re.findall(r"\{([a-z_]+)\}", template))


def draw_tool(rng, family, split, camel_keys=None):
    """A tool of `family` that some template of the split can ask for."""
    tool = Tool(rng, family, camel_keys)
    return tool if fitting_templates(tool, split) else Tool(rng, family, camel_keys, drop_optional=False)


def draw_values(rng, tool):
    """role -> (phrase shown to the user, argument value)."""
    values = {}
    for role, (_, param) in tool.slots.items():
        if param.kind == "enum":
            value = rng.choice(param.options)
            phrase = value.capitalize() if rng.random() < 0.2 else value
        else:
            raw = param.gen(rng)
            value = param.value_of(raw) if param.value_of else raw
            phrase = (", ".join(raw[:-1]) + " and " + raw[-1] if len(raw) > 1 else raw[0]) if isinstance(raw, list) \
                else str(raw)
        values[role] = (phrase, value)
    return values


def arguments(tool, values, roles):
    """The call's JSON arguments for the roles the question mentions, nested as the schema says."""
    args = {}
    for role, (path, _) in tool.slots.items():
        if role not in roles:
            continue
        node = args
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = values[role][1]
    return args


def made_up_phrase(rng):
    """A string value no list holds ("snow showers", "Brevi lomar"): answers must copy what the result says,
    not pick the nearest value they saw in training."""
    words = [rng.choice(["light", "heavy", "mostly", "scattered", "very", "partly", "no", "late", "early", "new"])]
    words += [fictional(rng).lower() if rng.random() < 0.5 else rng.choice(
        ["showers", "sky", "breeze", "mist", "delay", "update", "gusts", "sun", "haze", "clouds", "stop", "hold"])
        for _ in range(rng.randint(1, 2))]
    return " ".join(words)


def shape_result(rng, fields):
    """Tool result JSON text from [(field, value, key pool)]: varied keys, nesting and extra fields.
    -> (text, {field: value as it appears}, {field: its key})."""
    flat, named = {}, {}
    fields = [(field, made_up_phrase(rng) if isinstance(value, str) and rng.random() < 0.2 else value, keys)
              for field, value, keys in fields]
    for field, value, keys in fields:
        key = rng.choice(keys)
        while key in flat:
            key += "_"
        flat[key] = value
        named[field] = key
    if rng.random() < 0.3:
        flat[rng.choice(["source", "provider", "api"])] = rng.choice(["openapi", "v2", "local", "cache"])
    if rng.random() < 0.2:
        flat[rng.choice(["updated", "timestamp", "as_of"])] = f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    style = rng.random()
    if style < 0.35:
        data = flat
    elif style < 0.5:
        data = {rng.choice(["data", "result", "response", "payload"]): flat}
    elif style < 0.62:
        data = {"status": "ok", rng.choice(["result", "data"]): flat}
    elif style < 0.74:
        data = {rng.choice(["results", "items", "entries"]): [flat]}
    elif style < 0.86:
        items = list(flat.items())
        cut = max(1, len(items) // 2)
        data = {rng.choice(["main", "current", "summary"]): dict(items[:cut]),
                rng.choice(["details", "extra", "meta"]): dict(items[cut:])}
    else:
        return ", ".join(f"{k}: {v}" for k, v in flat.items()), {f: v for f, v, _ in fields}, named
    return json.dumps(data, ensure_ascii=False), {f: v for f, v, _ in fields}, named


# ---------------------------------------------------------------- synthetic families
# Training also draws tools made up on the spot: a subject noun, a verb, and parameters whose names the question
# spells out ("for 3 tickets", "with genre jazz"). They teach what no fixed list can: pick the declared tool whose
# name and description share the request's words, and copy each value under the parameter it names. Their words
# avoid the OOD families' subjects (hotels, air quality, films, sports, dictionaries, rides).

SUBJECTS = ["bike rental", "parking spot", "library book", "gym class", "recipe", "podcast", "invoice",
            "train ticket", "ferry", "museum", "concert", "pharmacy", "car rental", "charging station", "tide",
            "sunrise", "pollen count", "earthquake", "bus route", "coworking desk", "tennis court", "wine",
            "plant", "pet sitter", "plumber", "course", "exam result", "gift card", "coupon", "loyalty points",
            "grocery order", "laundry pickup", "bank balance", "password reset", "support ticket", "job posting",
            "apartment listing", "mortgage rate", "tax form", "vaccine appointment", "blood donation", "boat tour",
            "ski pass", "campsite", "hiking trail", "snow report", "surf forecast", "volunteer shift", "printer",
            "smart light", "thermostat", "door lock", "playlist", "audiobook", "board game", "toy store",
            "bakery", "flower delivery", "moving truck", "storage unit", "translation agency", "bicycle repair"]
VERBS = ["find", "get", "check", "book", "lookup", "list", "reserve", "track", "search", "order", "cancel",
         "fetch", "show", "update", "rate", "compare"]
CONTEXTS = ["for the user", "by name or city", "at a given date", "from the provider", "in real time",
            "with details", "", "", ""]
COUNT_KEYS = ["tickets", "seats", "people", "bags", "rooms", "copies", "laps", "players", "items", "pages",
              "boxes", "slots", "units", "passengers", "kids", "pets", "hours", "bottles"]
FREE_KEYS = ["genre", "color", "flavor", "brand", "model", "author", "artist", "platform", "route", "department",
             "category", "size", "material", "level", "station", "region", "store", "branch", "variety", "season",
             "zone", "format", "language_code", "team_size", "cuisine_type", "line", "gate_code", "plan"]
FREE_VALUES = ["jazz", "red", "vanilla", "acme", "x200", "tolkien", "nova", "android", "blue line", "sales",
               "outdoor", "large", "oak", "advanced", "north", "east wing", "downtown", "premium", "summer", "pdf",
               "basic", "gold", "zone 3", "express", "classic", "mint", "silver", "kids", "weekend", "pro"]
LIST_KEYS = ["tags", "items", "names", "options", "filters", "keywords", "colors", "extras", "labels", "codes"]
ENUMS = [["small", "medium", "large"], ["low", "medium", "high"], ["standard", "express"],
         ["morning", "afternoon", "evening"], ["asc", "desc"], ["json", "text"], ["basic", "plus", "pro"]]
STATUS = ["available", "confirmed", "open", "closed", "pending", "sold out", "in stock", "ready", "active"]


def _snake(words):
    return "_".join(words.replace("-", " ").split())


def synthetic_family(rng):
    subject, verb = rng.choice(SUBJECTS), rng.choice(VERBS)
    snake = _snake(subject)
    names = [f"{verb}_{snake}", f"{snake}_{verb}", f"{verb}_{snake}s", f"{snake}_service", f"{snake}_lookup"]
    context = rng.choice(CONTEXTS)
    descs = [f"{verb.capitalize()} {subject}s {context}".strip() + ".",
             f"{subject.capitalize()} {rng.choice(['service', 'API', 'lookup', 'tool'])}: {verb} {subject}s.",
             f"Use this to {verb} a {subject}."]
    params, phrases = [], []
    kinds = rng.sample(["city", "date", "time", "count", "free", "code", "enum", "free2", "list", "nested"],
                       rng.randint(1, 3))
    if "nested" in kinds:
        kinds = [k for k in kinds if k not in ("city", "date")]
    for kind in kinds:
        required = rng.random() < 0.7 or not params
        if kind == "city":
            params.append(P("city", "string", CITY_KEYS, [None, "City name"], city, required=required))
            phrases.append(rng.choice(["in {city}", "near {city}", "for {city}"]))
        elif kind == "date":
            params.append(P("date", "string", ["date", "day", "on", "when"], [None, "YYYY-MM-DD"], date,
                            required=required))
            phrases.append(rng.choice(["on {date}", "for {date}"]))
        elif kind == "time":
            params.append(P("time", "string", ["time", "at", "hour"], [None, "HH:MM"], clock, required=required))
            phrases.append(rng.choice(["at {time}", "around {time}"]))
        elif kind == "count":
            key = rng.choice(COUNT_KEYS)
            params.append(P("count", "integer", [key, "num_" + key, key + "_count"], [None, f"Number of {key}"],
                            lambda r: r.randint(1, 12), required=required))
            phrases.append(rng.choice(["for {count} " + key, "{count} " + key, "with {count} " + key]))
        elif kind in ("free", "free2"):
            key = rng.choice(FREE_KEYS)
            role = "value" if kind == "free" else "detail"
            params.append(P(role, "string", [key], [None, f"The {key.replace('_', ' ')}"],
                            lambda r: r.choice(FREE_VALUES), required=required))
            phrases.append(rng.choice([f"with {key.replace('_', ' ')} {{{role}}}", f"{key.replace('_', ' ')} {{{role}}}",
                                       f"({key.replace('_', ' ')}: {{{role}}})"]))
        elif kind == "code":
            params.append(P("code", "string", ["id", "reference", "number", "code", snake + "_id"],
                            [None, f"The {subject} id"], lambda r: code(r, 2, 5), required=required))
            phrases.append(rng.choice(["number {code}", "with id {code}", "{code}", "ref {code}"]))
        elif kind == "list":
            key = rng.choice(LIST_KEYS)
            params.append(P("items", "array", [key], [None, f"List of {key}"],
                            lambda r: r.sample(FREE_VALUES, r.randint(1, 3)), required=required))
            phrases.append(rng.choice([f"with {key} {{items}}", f"{key}: {{items}}", f"for the {key} {{items}}"]))
        elif kind == "nested":
            params.append(P("where", "object", ["location", "where", "filters", "place", "target"],
                            [None, "Where and when"], required=required, flat_p=0.2,
                            sub=[P("city", "string", CITY_KEYS, [None, "City name"], city),
                                 P("date", "string", ["date", "day", "on"], [None, "YYYY-MM-DD"], date,
                                   required=rng.random() < 0.5)]))
            phrases.append(rng.choice(["in {city} on {date}", "for {city}, {date}", "on {date} in {city}"]))
        else:
            options = rng.choice(ENUMS)
            key = rng.choice(["option", "tier", "mode", "priority", "kind", "variant"])
            params.append(P("choice", "enum", [key], [None, f"The {key}"], required=required, options=options))
            phrases.append(rng.choice(["({choice})", "{choice} " + key, "as {choice}"]))
    starts = [f"Can you {verb} a {subject}", f"Please {verb} the {subject}", f"I want to {verb} a {subject}",
              f"{verb} {subject}", f"Help me {verb} a {subject}", f"Could you {verb} my {subject}",
              f"I need to {verb} a {subject}", f"{subject} {verb}"]
    questions = []
    for start in starts:
        order = list(phrases)
        rng.shuffle(order)
        questions.append(start + " " + " ".join(order) + rng.choice(["?", ".", "", " please."]))
    fields = rng.sample([("status", lambda r: r.choice(STATUS), ["status", "state", "availability"]),
                         ("price", price, ["price", "cost", "total"]),
                         ("ref", lambda r: code(r, 3, 3), ["confirmation", "ref", "booking_id", "id"]),
                         ("when", clock, ["time", "slot", "starts_at", "eta"]),
                         ("name", lambda r: fictional(r) + " " + r.choice(["Center", "Point", "Hub", "Place"]),
                          ["name", "location", "provider", "place"])], 2)

    def result(r, values):
        return [(field, gen(r), keys) for field, gen, keys in fields]

    first, second = fields[0][0], fields[1][0]
    answers = [f"The {subject}: {{{first}}}, {{{second}}}.", f"Here is what I found: {{{first}}} and {{{second}}}.",
               f"Done. {{{first}}} ({{{second}}})."]
    family = Family("synthetic:" + snake + ":" + verb, names, descs, params, questions, result, answers,
                    f"a {subject} service")
    family.synthetic = True
    return family
