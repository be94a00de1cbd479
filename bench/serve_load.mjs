#!/usr/bin/env node
// Load generator for a running `beamline serve` (or any OpenAI-compatible server), reporting in the
// conventions of `vllm bench serve`: TTFT, TPOT, ITL and E2E latency (mean, median, p99), request and token
// throughput, and the prefix-cache hit rate read from the server's /metrics. Node only, no dependencies.
//
//   node bench/serve_load.mjs --base-url http://127.0.0.1:8000 --num-prompts 200 --request-rate 8 \
//        --max-concurrency 32 --dataset random --random-input-len 256 --random-output-len 64
//   node bench/serve_load.mjs --dataset multi-turn --num-sessions 16 --num-turns 4 ...
import { parseArgs } from 'node:util';
import { writeFileSync } from 'node:fs';

const { values: opts } = parseArgs({
  options: {
    'base-url': { type: 'string', default: 'http://127.0.0.1:8000' },
    model: { type: 'string' },
    'api-key': { type: 'string' },
    dataset: { type: 'string', default: 'random' },             // random | multi-turn
    'num-prompts': { type: 'string', default: '100' },          // random: requests in all
    'num-sessions': { type: 'string', default: '16' },          // multi-turn: conversations
    'num-turns': { type: 'string', default: '4' },              // multi-turn: requests per conversation
    'random-input-len': { type: 'string', default: '128' },
    'random-output-len': { type: 'string', default: '32' },
    'random-range-ratio': { type: 'string', default: '0' },     // lengths drawn from [len*(1-r), len*(1+r)]
    'random-prefix-len': { type: 'string', default: '0' },      // a prefix every random prompt shares
    'request-rate': { type: 'string', default: 'inf' },         // requests/s; inf = all at once
    burstiness: { type: 'string', default: '1' },               // 1 = Poisson arrivals; gamma shape otherwise
    'max-concurrency': { type: 'string', default: '0' },        // 0 = unlimited
    'token-id-range': { type: 'string', default: '0-255' },     // random prompts are token ids from this range
    'ignore-eos': { type: 'boolean', default: true },
    seed: { type: 'string', default: '0' },
    'result-json': { type: 'string' },
    help: { type: 'boolean', default: false },
  },
});

if (opts.help) {
  console.log(`usage: node bench/serve_load.mjs [--base-url URL] [--dataset random|multi-turn] [--num-prompts N]
  [--num-sessions N --num-turns N] [--random-input-len N] [--random-output-len N] [--random-range-ratio R]
  [--random-prefix-len N] [--request-rate R|inf] [--burstiness B] [--max-concurrency N] [--token-id-range A-B]
  [--no-ignore-eos] [--seed S] [--model NAME] [--api-key KEY] [--result-json FILE]`);
  process.exit(0);
}

const number = (name) => {
  const value = Number(opts[name]);
  if (!Number.isFinite(value) && !(name === 'request-rate' && opts[name] === 'inf')) {
    throw new Error(`--${name}: '${opts[name]}' is not a number`);
  }
  return value;
};

// mulberry32: a small seeded generator, so the same --seed sends the same prompts.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const random = rng(number('seed'));
const randInt = (lo, hi) => lo + Math.floor(random() * (hi - lo + 1));
const drawLength = (len, ratio) => Math.max(1, randInt(Math.floor(len * (1 - ratio)), Math.ceil(len * (1 + ratio))));
const [idLo, idHi] = opts['token-id-range'].split('-').map(Number);
const randomIds = (n) => Array.from({ length: n }, () => randInt(idLo, idHi));
const WORDS = ('time person year way day thing man world life hand part child eye woman place work week case point ' +
  'government company number group problem fact river city music garden window story light market voice').split(' ');
const randomText = (n) => Array.from({ length: n }, () => WORDS[randInt(0, WORDS.length - 1)]).join(' ');

const headers = { 'Content-Type': 'application/json' };
if (opts['api-key']) headers.Authorization = `Bearer ${opts['api-key']}`;
const base = opts['base-url'].replace(/\/$/, '');

async function prefixCacheCounters() {
  const response = await fetch(`${base}/metrics`);
  if (!response.ok) return null;
  const text = await response.text();
  const read = (name) => {
    const line = text.split('\n').find((l) => l.startsWith(name + '{') || l.startsWith(name + ' '));
    return line ? Number(line.slice(line.lastIndexOf(' ') + 1)) : NaN;
  };
  return { queries: read('vllm:prefix_cache_queries_total'), hits: read('vllm:prefix_cache_hits_total') };
}

// One streamed /v1/completions request; times every chunk that carries text.
async function send(prompt, maxTokens) {
  const body = {
    model: opts.model, prompt, max_tokens: maxTokens, temperature: 0, ignore_eos: opts['ignore-eos'],
    stream: true, stream_options: { include_usage: true },
  };
  const start = performance.now();
  const result = { ok: false, ttft: 0, itl: [], e2e: 0, promptTokens: 0, outputTokens: 0, cachedTokens: 0, text: '' };
  try {
    const response = await fetch(`${base}/v1/completions`, { method: 'POST', headers, body: JSON.stringify(body) });
    if (!response.ok) {
      result.error = `HTTP ${response.status}: ${await response.text()}`;
      return result;
    }
    const decoder = new TextDecoder();
    let buffer = '';
    let last = 0;
    for await (const bytes of response.body) {
      buffer += decoder.decode(bytes, { stream: true });
      let end;
      while ((end = buffer.indexOf('\n\n')) >= 0) {
        const event = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        if (!event.startsWith('data: ')) continue;
        const data = event.slice(6);
        if (data === '[DONE]') continue;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message);
        const now = performance.now();
        const text = (chunk.choices ?? []).map((c) => c.text ?? '').join('');
        if (text) {
          if (last === 0) result.ttft = now - start;
          else result.itl.push(now - last);
          last = now;
          result.text += text;
        }
        if (chunk.usage) {
          result.promptTokens = chunk.usage.prompt_tokens;
          result.outputTokens = chunk.usage.completion_tokens;
          result.cachedTokens = chunk.usage.prompt_tokens_details?.cached_tokens ?? 0;
        }
      }
    }
    result.e2e = performance.now() - start;
    result.ok = true;
  } catch (error) {
    result.error = String(error);
  }
  return result;
}

// Work items: each is a function that sends one request (multi-turn items chain their own turns).
function buildWork() {
  const inLen = number('random-input-len');
  const outLen = number('random-output-len');
  const ratio = number('random-range-ratio');
  if (opts.dataset === 'random') {
    const prefix = randomIds(number('random-prefix-len'));
    return Array.from({ length: number('num-prompts') }, () => {
      const prompt = [...prefix, ...randomIds(drawLength(inLen, ratio))];
      const maxTokens = drawLength(outLen, ratio);
      return async (record) => record(await send(prompt, maxTokens));
    });
  }
  if (opts.dataset === 'multi-turn') {
    // Each turn resends the whole conversation so far plus a new user message: the earlier turns are
    // a prefix the server's cache can serve.
    return Array.from({ length: number('num-sessions') }, () => {
      const turns = Array.from({ length: number('num-turns') }, () => randomText(drawLength(inLen, ratio)));
      const maxTokens = drawLength(outLen, ratio);
      return async (record) => {
        let conversation = '';
        for (const user of turns) {
          conversation += `User: ${user}\nAssistant:`;
          const result = await send(conversation, maxTokens);
          record(result);
          conversation += `${result.text}\n`;
        }
      };
    });
  }
  throw new Error(`--dataset: '${opts.dataset}' is not random or multi-turn`);
}

// Gamma(shape, scale) by Marsaglia-Tsang; shape 1 gives the exponential gaps of a Poisson process.
function gamma(shape, scale) {
  if (shape < 1) return gamma(shape + 1, scale) * Math.pow(random(), 1 / shape);
  const d = shape - 1 / 3;
  const c = 1 / Math.sqrt(9 * d);
  for (;;) {
    let x;
    let v;
    do {
      const u1 = random();
      const u2 = random();
      x = Math.sqrt(-2 * Math.log(u1 || 1e-12)) * Math.cos(2 * Math.PI * u2);
      v = 1 + c * x;
    } while (v <= 0);
    v = v * v * v;
    const u = random();
    if (u < 1 - 0.0331 * x ** 4 || Math.log(u) < 0.5 * x * x + d * (1 - v + Math.log(v))) return d * v * scale;
  }
}

const stats = (values) => {
  if (values.length === 0) return { mean: 0, median: 0, p99: 0 };
  const sorted = [...values].sort((a, b) => a - b);
  const at = (q) => {
    const position = (sorted.length - 1) * q;
    const lo = Math.floor(position);
    const hi = Math.ceil(position);
    return sorted[lo] + (sorted[hi] - sorted[lo]) * (position - lo);
  };
  return { mean: values.reduce((a, b) => a + b, 0) / values.length, median: at(0.5), p99: at(0.99) };
};

async function main() {
  if (!opts.model) {
    const response = await fetch(`${base}/v1/models`, { headers });
    if (!response.ok) throw new Error(`GET /v1/models: HTTP ${response.status}`);
    opts.model = (await response.json()).data[0].id;
  }
  const work = buildWork();
  const rate = opts['request-rate'] === 'inf' ? Infinity : number('request-rate');
  const burstiness = number('burstiness');
  const maxConcurrency = number('max-concurrency');
  const results = [];
  const record = (result) => results.push(result);

  const cacheBefore = await prefixCacheCounters();
  const start = performance.now();
  let active = 0;
  const waiting = [];
  const acquire = async () => {
    if (maxConcurrency > 0 && active >= maxConcurrency) await new Promise((resolve) => waiting.push(resolve));
    ++active;
  };
  const release = () => {
    --active;
    waiting.shift()?.();
  };
  const running = [];
  for (const item of work) {
    running.push((async () => {
      await acquire();
      try { await item(record); } finally { release(); }
    })());
    if (rate !== Infinity) await new Promise((resolve) => setTimeout(resolve, 1000 * gamma(burstiness, 1 / (rate * burstiness))));
  }
  await Promise.all(running);
  const duration = (performance.now() - start) / 1000;
  const cacheAfter = await prefixCacheCounters();

  const ok = results.filter((r) => r.ok);
  const failed = results.filter((r) => !r.ok);
  const input = ok.reduce((a, r) => a + r.promptTokens, 0);
  const output = ok.reduce((a, r) => a + r.outputTokens, 0);
  const cached = ok.reduce((a, r) => a + r.cachedTokens, 0);
  const ttft = stats(ok.map((r) => r.ttft));
  const tpot = stats(ok.filter((r) => r.outputTokens > 1).map((r) => (r.e2e - r.ttft) / (r.outputTokens - 1)));
  const itl = stats(ok.flatMap((r) => r.itl));
  const e2e = stats(ok.map((r) => r.e2e));
  let hitRate = input > 0 ? cached / input : 0;
  if (cacheBefore && cacheAfter && cacheAfter.queries > cacheBefore.queries) {
    hitRate = (cacheAfter.hits - cacheBefore.hits) / (cacheAfter.queries - cacheBefore.queries);
  }

  const line = (label, value) => console.log(label.padEnd(40) + String(value).padStart(12));
  const fixed = (value) => value.toFixed(2);
  console.log('============ Serving Benchmark Result ============');
  line('Successful requests:', ok.length);
  line('Failed requests:', failed.length);
  line('Maximum request concurrency:', maxConcurrency > 0 ? maxConcurrency : 'unlimited');
  line('Request rate configured (RPS):', rate === Infinity ? 'inf' : fixed(rate));
  line('Benchmark duration (s):', fixed(duration));
  line('Total input tokens:', input);
  line('Total generated tokens:', output);
  line('Request throughput (req/s):', fixed(ok.length / duration));
  line('Output token throughput (tok/s):', fixed(output / duration));
  line('Total Token throughput (tok/s):', fixed((input + output) / duration));
  line('Prefix cache hit rate (%):', fixed(100 * hitRate));
  const section = (title, key, s) => {
    console.log(title);
    line(`Mean ${key} (ms):`, fixed(s.mean));
    line(`Median ${key} (ms):`, fixed(s.median));
    line(`P99 ${key} (ms):`, fixed(s.p99));
  };
  section('---------------Time to First Token----------------', 'TTFT', ttft);
  section('-----Time per Output Token (excl. 1st token)------', 'TPOT', tpot);
  section('---------------Inter-token Latency----------------', 'ITL', itl);
  section('----------------End-to-end Latency----------------', 'E2EL', e2e);
  console.log('==================================================');
  if (failed.length > 0) console.log(`first failure: ${failed[0].error}`);

  if (opts['result-json']) {
    writeFileSync(opts['result-json'], JSON.stringify({
      options: opts, duration, completed: ok.length, failed: failed.length, total_input_tokens: input,
      total_output_tokens: output, request_throughput: ok.length / duration, output_throughput: output / duration,
      total_token_throughput: (input + output) / duration, prefix_cache_hit_rate: hitRate,
      ttft_ms: ttft, tpot_ms: tpot, itl_ms: itl, e2el_ms: e2e,
    }, null, 2));
  }
  process.exitCode = failed.length > 0 ? 1 : 0;
}

await main();
