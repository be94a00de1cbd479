// The varied text corpus on which beamline's o200k ids must equal js-tiktoken's. Deterministic: the
// same seed gives the same corpus on every machine.
//
// Three things are kept out on purpose, each a known difference between tiktoken's own regex engine
// (the behaviour beamline implements) and JavaScript's, not between beamline and tiktoken:
//  - U+0085 (Unicode White_Space, so `\s` in tiktoken, but not `\s` in JavaScript) and U+FEFF (the
//    reverse);
//  - an apostrophe followed by U+017F (long s): tiktoken's `(?i:'s)` matches it, js-tiktoken's
//    spelled-out `'s|'S` does not;
//  - code points first assigned in Unicode 15.1 (JavaScript's tables are newer than PCRE2's 15.0).

export function makeRandom(seed) {
  let state = BigInt(seed) & 0xffffffffffffffffn;
  return () => {
    // xorshift64*
    state ^= state >> 12n;
    state ^= (state << 25n) & 0xffffffffffffffffn;
    state ^= state >> 27n;
    return Number(((state * 0x2545f4914f6cdd1dn) & 0xffffffffffffffffn) >> 11n) / 2 ** 53;
  };
}

const pick = (random, list) => list[Math.floor(random() * list.length)];
const between = (random, low, high) => low + Math.floor(random() * (high - low + 1));

export function avoidEngineDifferences(text) {
  return text
    .replace(/[\u0085\ufeff]/g, " ")
    .replace(/'\u017f/g, "'s")
    .replace(/[\u2ffc-\u2fff\u31ef]|\ud87a[\udff0-\udfff]|\ud87b[\udc00-\ude5d]/g, "x");
}

const prose = [
  "The quick brown fox jumps over the lazy dog.",
  "It's a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife.",
  "Call me Ishmael. Some years ago\u2014never mind how long precisely\u2014having little or no money in my purse...",
  "In 2024, revenue grew 17.5% to $3,141,592.65 (vs. $2.7M in 2023); EBITDA: \u20ac1.2bn.",
  "She said: \"I'll be there at 10:30am, won't you?\" He replied, 'Sure\u2014I'd love to!'",
  "Dr. O'Neil's rock'n'roll band didn't play; THEY'LL come back, WE'RE sure, YOU'VE seen it, I'M told, he'D know.",
  "Mixed Case'S and 'T and 'Re and 'rE and 'VE and 'Ll and 'lL and 'M and 'D tails.",
  "e-mail: someone@example.com, URL: https://example.org/path/to/page?query=1&x=y#frag",
  "Na\u00efve caf\u00e9 r\u00e9sum\u00e9 \u2014 fa\u00e7ade co\u00f6perate \u00e0 la carte, Stra\u00dfe, \u00c5ngstr\u00f6m.",
];

const scripts = [
  "\u4eca\u5929\u5929\u6c14\u5f88\u597d\uff0c\u6211\u4eec\u53bb\u516c\u56ed\u6563\u6b65\u5427\u3002\u673a\u5668\u5b66\u4e60\u662f\u4eba\u5de5\u667a\u80fd\u7684\u4e00\u4e2a\u5206\u652f\u3002",
  "\u543e\u8f29\u306f\u732b\u3067\u3042\u308b\u3002\u540d\u524d\u306f\u307e\u3060\u7121\u3044\u3002\u30ab\u30bf\u30ab\u30ca\u3068\u3072\u3089\u304c\u306a\u3001\u6f22\u5b57\u3002",
  "\ud55c\uad6d\uc5b4\ub294 \uc544\ub984\ub2e4\uc6b4 \uc5b8\uc5b4\uc785\ub2c8\ub2e4. \uc548\ub155\ud558\uc138\uc694!",
  "\u0627\u0644\u0644\u063a\u0629 \u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u062c\u0645\u064a\u0644\u0629 \u062c\u062f\u0627\u064b\u060c \u0648\u064e\u0627\u0644\u0652\u0643\u0650\u062a\u064e\u0627\u0628\u064f \u0645\u064f\u0641\u0650\u064a\u062f\u064c.",
  "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd! \u05d6\u05d4\u05d5 \u05de\u05e9\u05e4\u05d8 \u05d1\u05e2\u05d1\u05e8\u05d9\u05ea.",
  "\u0939\u093f\u0928\u094d\u0926\u0940 \u092d\u093e\u0930\u0924 \u0915\u0940 \u090f\u0915 \u092a\u094d\u0930\u092e\u0941\u0916 \u092d\u093e\u0937\u093e \u0939\u0948\u0964 \u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e!",
  "\u0420\u0443\u0441\u0441\u043a\u0438\u0439 \u044f\u0437\u044b\u043a \u2014 \u043e\u0434\u0438\u043d \u0438\u0437 \u0432\u043e\u0441\u0442\u043e\u0447\u043d\u043e\u0441\u043b\u0430\u0432\u044f\u043d\u0441\u043a\u0438\u0445 \u044f\u0437\u044b\u043a\u043e\u0432. \u041f\u0420\u0418\u0412\u0415\u0422, \u041c\u0438\u0440!",
  "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac: \u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5 \u039a\u03cc\u03c3\u03bc\u03b5! \u1f08\u03c1\u03c7\u03ae.",
  "\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22\u0e40\u0e1b\u0e47\u0e19\u0e20\u0e32\u0e29\u0e32\u0e17\u0e35\u0e48\u0e2a\u0e27\u0e22\u0e07\u0e32\u0e21",
  "Ti\u1ebfng Vi\u1ec7t c\u00f3 d\u1ea5u: \u0111\u01b0\u1eddng ph\u1ed1 H\u00e0 N\u1ed9i.",
  "\u10e5\u10d0\u10e0\u10d7\u10e3\u10da\u10d8 \u10d4\u10dc\u10d0 \u0540\u0561\u0575\u0565\u0580\u0565\u0576 \u12a0\u121b\u122d\u129b",
];

const code = [
  "#include <vector>\n\nint main(int argc, char** argv) {\n    std::vector<int> xs{1, 2, 3};\n    for (auto& x : xs) x *= 2;\n    return xs.size() > 2 ? 0 : 1;\n}\n",
  "def fib(n: int) -> int:\n\t\"\"\"Return the n-th Fibonacci number.\"\"\"\n\tif n < 2:\n\t\treturn n\n\treturn fib(n - 1) + fib(n - 2)\r\n",
  "{\"name\": \"beamline\", \"version\": \"0.1.0\", \"tags\": [\"llm\", \"inference\"], \"nested\": {\"a\": null, \"b\": 1e-7}}",
  "for f in ./*.txt; do\n  grep -E '^[A-Z]{2,}$' \"$f\" | sort -u >> /tmp/out.log 2>&1 || true\ndone\n",
  "SELECT u.id, COUNT(*) AS n FROM users u JOIN orders o ON o.user_id = u.id WHERE o.total >= 100 GROUP BY u.id;",
  "const re = /\\s+(?!\\S)/gu; // regex!\nlet x = a?.b ?? c; x ||= [...ys].map((y) => y ** 2);\n",
  "<html>\n  <body class=\"main\">&nbsp;&lt;tag&gt;</body>\n</html>\n",
];

const whitespace = [" ", "  ", "\t", "\n", "\r\n", "\n\n", "   \n", " \t ", "\u3000", "\u00a0", "\u2003", "\u2028", "\u180e", "\v", "\f"];
const emoji = [
  "\ud83d\ude00", "\ud83d\udc4d\ud83c\udffd", "\ud83d\udc68\u200d\ud83d\udc69\u200d\ud83d\udc67\u200d\ud83d\udc66",
  "\ud83c\uddef\ud83c\uddf5", "\u2764\ufe0f", "\ud83c\udff3\ufe0f\u200d\ud83c\udf08", "\ud83e\uddd1\u200d\ud83d\udcbb",
  "\u270c\ud83c\udffb", "1\ufe0f\u20e3", "\ud83d\ude4f",
];
const numbers = ["0", "7", "42", "123", "1234", "123456789012345", "3.14159", "1,000,000", "-17", "1e10", "0x1F",
  "\u0661\u0662\u0663\u0664", "\u0967\u0968\u0969", "\uff11\uff12\uff13\uff14", "\u00b2\u00b3", "\u216b", "\u2460\u2461"];
const words = ["hello", "World", "AI", "tokenizer", "don't", "CAN'T", "we'Ve", "x", "A1b2", "snake_case", "camelCase",
  "UPPER", "na\u00efve", "\u00c9cole", "\u0130stanbul", "stra\u00dfe", "\u01c5", "\u02b0", "\u00aa"];

// Code point ranges for random text: every class the split pattern distinguishes.
const ranges = [
  [0x20, 0x7e], [0x20, 0x7e], [0x20, 0x7e], [0x09, 0x0d], [0xa0, 0x24f], [0x300, 0x36f], [0x370, 0x3ff],
  [0x400, 0x4ff], [0x590, 0x5ff], [0x600, 0x6ff], [0x900, 0x97f], [0xe00, 0xe7f], [0x1e00, 0x1eff],
  [0x2000, 0x206f], [0x2070, 0x218f], [0x2460, 0x24ff], [0x3000, 0x30ff], [0x4e00, 0x9fff], [0xac00, 0xd7a3],
  [0xff00, 0xffef], [0x1f300, 0x1f64f], [0x1d400, 0x1d7ff], [0x10000, 0x1007f],
];

function randomCodePoints(random, length) {
  let text = "";
  for (let i = 0; i < length; i++) {
    const [low, high] = pick(random, ranges);
    text += String.fromCodePoint(between(random, low, high));
  }
  return text;
}

function randomLossyBytes(random, length) {
  const bytes = new Uint8Array(length);
  for (let i = 0; i < length; i++) {
    // Mostly ASCII with UTF-8 lead and continuation bytes mixed in.
    bytes[i] = random() < 0.5 ? between(random, 0x20, 0x7e) : between(random, 0, 255);
  }
  return new TextDecoder("utf-8", { fatal: false }).decode(bytes);
}

function randomMix(random, parts) {
  const pools = [prose, scripts, code, whitespace, emoji, numbers, words, ["'", "'s", "'LL", "\u0301", "\u200d", "/", "\r", "\n"]];
  let text = "";
  for (let i = 0; i < parts; i++) {
    const pool = pick(random, pools);
    let part = pick(random, pool);
    if (pool === prose || pool === scripts || pool === code) {
      const start = between(random, 0, part.length - 1);
      part = part.slice(start, start + between(random, 1, 40));
    }
    text += part + (random() < 0.3 ? pick(random, whitespace) : "");
  }
  return text;
}

// Drops a lone surrogate that slicing may have left at either end.
const wellFormed = (text) => text.replace(/[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g, "");

export function makeCorpus(seed = 20261130) {
  const random = makeRandom(seed);
  const items = [...prose, ...scripts, ...code, ...whitespace, ...emoji, ...numbers, ...words];
  items.push(prose.join(" "), scripts.join("\n"), code.join("\n\n"), "", " ", "a", "  leading and trailing  ",
    "<|endoftext|> is just text here <|endofprompt|>", "    \n\n\t\t   x", "x \n \n ", "\u3000\u3000abc\u3000",
    "'s 'S 't", "a'", "'", "123'll", "\u0301\u0301abc", " \u0301x", "A\u0301B\u0301c", "\u01c5a\u01c5", "\u02b0\u02b0A",
    "ab\u02b0C", "x".repeat(1000), " ".repeat(100) + "y", "\n".repeat(20), "!@#$%^&*()_+-=[]{}|;:,.<>?/~`".repeat(3));
  for (let i = 0; i < 300; i++) items.push(randomMix(random, between(random, 1, 12)));
  for (let i = 0; i < 300; i++) items.push(randomCodePoints(random, between(random, 1, 60)));
  for (let i = 0; i < 200; i++) items.push(randomLossyBytes(random, between(random, 1, 80)));
  return items.map((item) => avoidEngineDifferences(wellFormed(item)));
}
