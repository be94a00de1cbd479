// js-tiktoken's o200k_base encode throughput on each benchmark text, as JSON lines {name, bytes, seconds, mb_per_s}.
// Seconds are CPU time (user + system) of this process, the measure Google Benchmark reports for beamline,
// so a busy machine slows neither side's figure.
// Usage: node bench_js_tiktoken.mjs TEXT_FILE...
import { readFileSync } from "node:fs";
import { basename } from "node:path";
import { Tiktoken } from "js-tiktoken/lite";
import o200k from "js-tiktoken/ranks/o200k_base";

const encoder = new Tiktoken(o200k);
for (const file of process.argv.slice(2)) {
  const text = readFileSync(file, "utf8");
  const bytes = Buffer.byteLength(text);
  encoder.encode(text.slice(0, 100000), [], []);  // warm up the JIT
  let best = Infinity, tokens = 0;
  for (let run = 0; run < 2; run++) {
    const start = process.cpuUsage();
    tokens = encoder.encode(text, [], []).length;
    const used = process.cpuUsage(start);
    best = Math.min(best, (used.user + used.system) / 1e6);
  }
  console.log(JSON.stringify({ name: basename(file, ".txt"), bytes, tokens, seconds: best, mb_per_s: bytes / 1e6 / best }));
}
