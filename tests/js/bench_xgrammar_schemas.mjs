// XGrammar's WebAssembly build (@mlc-ai/web-xgrammar) on the same schemas and outputs as bench_structured's per-schema
// mask table: for each schema of SCHEMAS.json, compile it (cache off, so each compile is timed), then feed the first
// (up to) 20 outputs of OUTPUTS.jsonl (bench_structured_scale's lines) that ended by the grammar, tokenized by
// js-tiktoken's o200k_base, token by token, one mask (`getNextTokenBitmask`) before each token and before the end
// token. The vocabulary is o200k_base's 199,998 tokens given as byte-level strings (exact bytes), padded to
// o200k_harmony's 201,088 ids, `<|end|>` (200,007) the stop token. XGrammar's JSON grammar is asked for any whitespace
// (beamline's allows one optional space after `,` and `:`, which the outputs use); an output token XGrammar refuses
// ends that output and is counted. Each schema is given with every object's keys sorted, as bench_structured_scale
// passes it (nlohmann::json's dump), so `properties` come in the same order for both engines.
// Usage: node bench_xgrammar_schemas.mjs O200K_BASE.tiktoken SCHEMAS.json OUTPUTS.jsonl
import { readFileSync } from "node:fs";
import Module, { createRequire } from "node:module";
import { dirname } from "node:path";
import { performance } from "node:perf_hooks";
import { Tiktoken } from "js-tiktoken/lite";
import o200k from "js-tiktoken/ranks/o200k_base";

// lib/index.js is a CommonJS (UMD) bundle in a package marked "type": "module": compiled here as CommonJS.
const xgr = (() => {
  const path = createRequire(import.meta.url).resolve("@mlc-ai/web-xgrammar/lib/index.js");
  const bundle = new Module(path);
  bundle.filename = path;
  bundle.paths = Module._nodeModulePaths(dirname(path));
  bundle._compile(readFileSync(path, "utf8"), path);
  return bundle.exports;
})();

const [ranksPath, schemasPath, outputsPath] = process.argv.slice(2);
if (!ranksPath || !schemasPath || !outputsPath) {
  console.error("usage: node bench_xgrammar_schemas.mjs O200K_BASE.tiktoken SCHEMAS.json OUTPUTS.jsonl");
  process.exit(2);
}
const kPerSchema = 20;
const kVocabSize = 201088;
const kEnd = 200007;

// GPT-2's byte-to-character map, the form XGrammar's "byte_level" vocabularies decode.
const byteChar = (() => {
  const printable = [];
  for (let b = 0x21; b <= 0x7e; ++b) printable.push(b);
  for (let b = 0xa1; b <= 0xac; ++b) printable.push(b);
  for (let b = 0xae; b <= 0xff; ++b) printable.push(b);
  const map = new Array(256);
  let extra = 0;
  for (let b = 0; b < 256; ++b) map[b] = String.fromCodePoint(printable.includes(b) ? b : 256 + extra++);
  return map;
})();

const vocab = new Array(kVocabSize);
for (const line of readFileSync(ranksPath, "utf8").split("\n")) {
  if (!line) continue;
  const [token, rank] = line.split(" ");
  vocab[Number(rank)] = Array.from(Buffer.from(token, "base64"), (b) => byteChar[b]).join("");
}
for (let id = 0; id < kVocabSize; ++id) if (vocab[id] === undefined) vocab[id] = `<|reserved_${id}|>`;
vocab[kEnd] = "<|end|>";

const schemas = JSON.parse(readFileSync(schemasPath, "utf8"));
const texts = schemas.map(() => []);
for (const line of readFileSync(outputsPath, "utf8").split("\n")) {
  if (!line) continue;
  const o = JSON.parse(line);
  if (o.schema < texts.length && o.constrained && o.finish === "stop" && texts[o.schema].length < kPerSchema)
    texts[o.schema].push(o.text);
}

const percentile = (values, p) => {
  if (values.length === 0) return NaN;
  const sorted = Float64Array.from(values).sort();
  return sorted[Math.min(sorted.length - 1, Math.floor(p * (sorted.length - 1) + 0.5))];
};

const sortedKeys = (value) =>
  Array.isArray(value) ? value.map(sortedKeys)
  : value !== null && typeof value === "object"
    ? Object.fromEntries(Object.keys(value).sort().map((key) => [key, sortedKeys(value[key])]))
    : value;

const encoder = new Tiktoken(o200k);
let start = performance.now();
const info = await xgr.TokenizerInfo.createTokenizerInfo(vocab, "byte_level", false, kVocabSize, [kEnd]);
console.log(`tokenizer info: ${(performance.now() - start).toFixed(0)} ms`);
const compiler = await xgr.GrammarCompiler.createGrammarCompiler(info, false);

console.log("| # | schema | compile ms | outputs | tokens | mask p50 µs | p99 µs | max µs | refused tokens |");
console.log("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
const all = [];
for (let i = 0; i < schemas.length; ++i) {
  const name = schemas[i].name;
  let compiled;
  start = performance.now();
  try {
    compiled = await compiler.compileJSONSchema(JSON.stringify(sortedKeys(schemas[i].schema)), true);
  } catch (error) {
    console.log(`| ${i} | ${name} | refused: ${String(error.message ?? error).split("\n")[0]} | | | | | | |`);
    continue;
  }
  const compileMs = performance.now() - start;
  const us = [];
  let refused = 0;
  for (const text of texts[i]) {
    const matcher = await xgr.GrammarMatcher.createGrammarMatcher(compiled);
    const tokens = [...encoder.encode(text), kEnd];
    for (let at = 0; at < tokens.length; ++at) {
      const token = tokens[at];
      const t0 = performance.now();
      const mask = await matcher.getNextTokenBitmask();
      us.push((performance.now() - t0) * 1e3);
      if (((mask[token >> 5] >>> (token & 31)) & 1) === 0 || !matcher.acceptToken(token)) {
        if (refused++ === 0) {  // the first refusal of each schema, to see where the two grammars differ
          const before = encoder.decode(tokens.slice(Math.max(0, at - 8), at));
          const what = token === kEnd ? "<|end|>" : encoder.decode([token]);
          console.error(`${name}: refused ${JSON.stringify(what)} after ${JSON.stringify(before)}`);
        }
        break;
      }
    }
    matcher.dispose();
  }
  compiled.dispose();
  all.push(...us);
  const f = (v) => (Number.isNaN(v) ? "" : v.toFixed(1));
  console.log(`| ${i} | ${name} | ${compileMs.toFixed(1)} | ${texts[i].length} | ${us.length} | ${f(percentile(us, 0.5))} | ` +
              `${f(percentile(us, 0.99))} | ${f(percentile(us, 1))} | ${refused} |`);
}
console.log(`\nall ${all.length} masks of the set: p50 ${percentile(all, 0.5).toFixed(2)} µs, ` +
            `p99 ${percentile(all, 0.99).toFixed(1)} µs, max ${percentile(all, 1).toFixed(1)} µs`);
