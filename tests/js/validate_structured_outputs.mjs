// Validates bench_structured_scale's outputs with ajv (draft 2020-12), independently of beamline's grammar code:
// every constrained output that ended by the grammar must parse as JSON and satisfy its schema; outputs cut by
// max_tokens are counted apart; unconstrained (control) outputs are counted valid / invalid to show the constraint
// bites. Formats are checked by RFC 3339 / RFC 5321-style rules written here (ajv-formats is not a dependency):
// calendar-correct dates (leap years included), times with an offset, dotted-quad IPv4, hyphenated UUIDs.
// Usage: node validate_structured_outputs.mjs SCHEMAS.json OUTPUTS.jsonl   (exit 1 on any invalid constrained output)
import { readFileSync } from "node:fs";
import Ajv2020 from "ajv/dist/2020.js";

const [schemasPath, outputsPath] = process.argv.slice(2);
if (!schemasPath || !outputsPath) {
  console.error("usage: node validate_structured_outputs.mjs SCHEMAS.json OUTPUTS.jsonl");
  process.exit(2);
}

function isDate(text) {
  const m = /^(\d{4})-(\d{2})-(\d{2})$/.exec(text);
  if (!m) return false;
  const [year, month, day] = [Number(m[1]), Number(m[2]), Number(m[3])];
  const leap = (year % 4 === 0 && year % 100 !== 0) || year % 400 === 0;
  const days = [31, leap ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
  return month >= 1 && month <= 12 && day >= 1 && day <= days[month - 1];
}
const timePattern = /^([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?([zZ]|[+-]([01]\d|2[0-3]):[0-5]\d)$/;
const formats = {
  date: isDate,
  time: (t) => timePattern.test(t),
  "date-time": (t) => {
    const at = t.search(/[tT]/);
    return at === 10 && isDate(t.slice(0, 10)) && timePattern.test(t.slice(11));
  },
  email: /^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$/,
  ipv4: /^((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)$/,
  uuid: /^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$/,
};

const ajv = new Ajv2020({ strict: false, allErrors: false, formats });
const schemas = JSON.parse(readFileSync(schemasPath, "utf8"));
const validators = schemas.map((s) => ajv.compile(s.schema));

const counts = schemas.map(() => ({ stop: 0, valid: 0, length: 0, control: 0, controlValid: 0 }));
const failures = [];
for (const line of readFileSync(outputsPath, "utf8").split("\n")) {
  if (!line) continue;
  const o = JSON.parse(line);
  const c = counts[o.schema];
  let valid = false;
  try {
    valid = validators[o.schema](JSON.parse(o.text));
  } catch {
    valid = false;
  }
  if (!o.constrained) {
    c.control++;
    if (valid) c.controlValid++;
  } else if (o.finish === "stop") {
    c.stop++;
    if (valid) c.valid++;
    else if (failures.length < 10) failures.push({ schema: schemas[o.schema].name, text: o.text, errors: validators[o.schema].errors });
  } else {
    c.length++;
  }
}

const sum = (key) => counts.reduce((total, c) => total + c[key], 0);
console.log("| schema | ended by the grammar | valid (ajv) | cut by max_tokens | unconstrained valid |");
console.log("| --- | --- | --- | --- | --- |");
schemas.forEach((s, i) => {
  const c = counts[i];
  console.log(`| ${s.name} | ${c.stop} | ${c.valid} | ${c.length} | ${c.controlValid} / ${c.control} |`);
});
console.log(`| all ${schemas.length} | ${sum("stop")} | ${sum("valid")} | ${sum("length")} | ${sum("controlValid")} / ${sum("control")} |`);
for (const f of failures) console.log("INVALID", JSON.stringify(f));
process.exit(sum("valid") === sum("stop") && sum("stop") > 0 ? 0 : 1);
