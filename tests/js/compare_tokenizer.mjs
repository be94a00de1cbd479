// Encodes the corpus with js-tiktoken (o200k_base, and o200k_harmony with special tokens allowed) and
// with `beamline tokenize --jsonl`, and fails on the first item whose ids differ.
// Usage: node compare_tokenizer.mjs BEAMLINE_EXE O200K_RANKS_FILE WORK_DIR
import { execFileSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { Tiktoken } from "js-tiktoken/lite";
import o200k from "js-tiktoken/ranks/o200k_base";
import { makeCorpus } from "./tokenizer_corpus.mjs";

const [beamline, ranks, workDir] = process.argv.slice(2);
if (!workDir) {
  console.error("usage: node compare_tokenizer.mjs BEAMLINE_EXE O200K_RANKS_FILE WORK_DIR");
  process.exit(2);
}

const harmonySpecials = {
  "<|startoftext|>": 199998, "<|endoftext|>": 199999, "<|return|>": 200002, "<|constrain|>": 200003,
  "<|channel|>": 200005, "<|start|>": 200006, "<|end|>": 200007, "<|message|>": 200008, "<|call|>": 200012,
  "<|reserved_200000|>": 200000, "<|reserved_201087|>": 201087,
};

function ours(items, extraArgs) {
  const file = join(workDir, `corpus-${extraArgs.join("_") || "plain"}.jsonl`.replace(/[^\w.\-/]/g, ""));
  writeFileSync(file, items.map((item) => JSON.stringify(item)).join("\n") + "\n");
  const output = execFileSync(beamline, ["tokenize", "--tiktoken", ranks, ...extraArgs, "--jsonl", "--text-file", file],
    { maxBuffer: 1 << 30, encoding: "utf8" });
  return output.split("\n").slice(0, items.length).map((line) => (line ? line.split(" ").map(Number) : []));
}

function compare(name, items, expected, actual) {
  let failures = 0;
  for (let i = 0; i < items.length; i++) {
    const want = expected[i].join(" "), got = (actual[i] ?? []).join(" ");
    if (want === got) continue;
    if (++failures <= 5) {
      console.error(`${name}: item ${i} differs\n  text: ${JSON.stringify(items[i]).slice(0, 300)}\n` +
        `  js-tiktoken: ${want.slice(0, 300)}\n  beamline:    ${got.slice(0, 300)}`);
    }
  }
  const bytes = items.reduce((sum, item) => sum + Buffer.byteLength(item), 0);
  console.log(`${name}: ${items.length - failures} of ${items.length} items (${bytes} bytes) identical`);
  return failures;
}

const corpus = makeCorpus();
const base = new Tiktoken(o200k);
let failures = compare("o200k_base", corpus, corpus.map((text) => base.encode(text, [], [])),
  ours(corpus, ["--encoding", "o200k_base"]));

const harmony = new Tiktoken(o200k, harmonySpecials);
const names = Object.keys(harmonySpecials);
const withSpecials = corpus.filter((_, i) => i % 4 === 0).map((text, i) => {
  const cut = Math.floor(text.length / 2);
  const clean = (s) => s.replace(/[\ud800-\udbff]$/, "").replace(/^[\udc00-\udfff]/, "");
  return `${names[i % names.length]}${clean(text.slice(0, cut))}${names[(i + 3) % names.length]}${clean(text.slice(cut))}<|end|>`;
});
failures += compare("o200k_harmony with specials", withSpecials, withSpecials.map((text) => harmony.encode(text, "all")),
  ours(withSpecials, ["--encoding", "o200k_harmony", "--allow-special"]));

console.log(`${failures === 0 ? corpus.length + withSpecials.length : 0} passed, ${failures} failed`);
process.exit(failures === 0 ? 0 : 1);
