// Writes o200k_base as a standard .tiktoken rank file ("<base64 token> <rank>" per line, rank order),
// reconstructed from js-tiktoken's own compressed table, so no rank data is ever committed.
// Usage: node export_o200k.mjs OUTPUT_FILE
import { writeFileSync, renameSync } from "node:fs";
import o200k from "js-tiktoken/ranks/o200k_base";

const output = process.argv[2];
if (!output) {
  console.error("usage: node export_o200k.mjs OUTPUT_FILE");
  process.exit(2);
}
// js-tiktoken's format: lines of "! <first rank> <base64 token> <base64 token> ...", consecutive ranks.
const entries = [];
for (const line of o200k.bpe_ranks.split("\n")) {
  if (!line) continue;
  const [, offsetText, ...tokens] = line.split(" ");
  const offset = Number.parseInt(offsetText, 10);
  tokens.forEach((token, i) => entries.push([offset + i, token]));
}
entries.sort((a, b) => a[0] - b[0]);
const temporary = `${output}.partial`;
writeFileSync(temporary, entries.map(([rank, token]) => `${token} ${rank}\n`).join(""));
renameSync(temporary, output);
console.log(`wrote ${entries.length} ranks to ${output}`);
