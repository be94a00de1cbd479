// The server under hostile and careless clients (issue 22): a seeded fuzz of request bodies (malformed JSON, wrong
// types, huge and negative values, deep nesting, unicode edge cases) on every JSON endpoint, raw malformed HTTP on
// the socket, and a short soak of streams whose clients leave at random points. Each answer must be a success or an
// OpenAI error JSON (never a 5xx, never a dropped connection for a well-formed request), and afterwards the server
// must still answer, with nothing left running or waiting and every KV block back.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { makeTinyModel, metrics, metricValue, rawExchange, startServer, waitFor } from './server_harness.mjs';

const MODEL = 'tiny';
const FUZZ_REQUESTS = Number(process.env.BEAMLINE_FUZZ_REQUESTS ?? 400);

// mulberry32, so a failure names a seed that reproduces it.
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

const ENDPOINTS = {
  '/v1/chat/completions': { messages: [{ role: 'user', content: 'Hi' }], max_tokens: 4 },
  '/v1/completions': { prompt: 'Hello', max_tokens: 4 },
  '/v1/responses': { input: 'Hi', max_output_tokens: 4 },
  '/tokenize': { prompt: 'Hello' },
  '/detokenize': { tokens: [1, 2, 3] },
  '/generate': { text: 'Hello', sampling_params: { max_new_tokens: 4 } },
};
// Fields a mutation may hit (some exist only on some endpoints: then they are unknown and ignored, or refused).
const FIELDS = ['model', 'messages', 'prompt', 'input', 'max_tokens', 'max_output_tokens', 'n', 'temperature',
  'top_p', 'top_k', 'stop', 'stop_token_ids', 'logit_bias', 'logprobs', 'top_logprobs', 'seed', 'stream',
  'stream_options', 'tools', 'tool_choice', 'response_format', 'structured_outputs', 'tokens', 'instructions',
  'reasoning', 'sampling_params', 'echo', 'min_tokens', 'presence_penalty', 'ignore_eos'];
// Fields whose valid values set how long a request runs: a mutation gives them only values no engine accepts or
// small ones, so the fuzz stays fast without skipping them.
const LENGTH_FIELDS = new Set(['max_tokens', 'max_output_tokens', 'n', 'min_tokens', 'sampling_params']);

const UNICODE = ['\u0000', '\ud800', '\udfff', '\ufeff', '\u202e', '🦀🦀', 'é'.normalize('NFD'), '\uffff', '<|start|>',
  '<|call|>', '\u{10ffff}', 'a'.repeat(20000)];

function randomValue(random, depth = 0) {
  const pick = (list) => list[Math.floor(random() * list.length)];
  switch (Math.floor(random() * 12)) {
    case 0: return null;
    case 1: return random() < 0.5;
    case 2: return pick([0, -1, 1, 2 ** 31, 2 ** 53 + 1, -(2 ** 63), 1e308, -1e308, 0.5, 1e-320]);
    case 3: return pick(UNICODE);
    case 4: return '';
    case 5: return depth < 3 ? Array.from({ length: Math.floor(random() * 4) }, () => randomValue(random, depth + 1)) : [];
    case 6: return depth < 3 ? { [pick(FIELDS)]: randomValue(random, depth + 1) } : {};
    case 7: return Array.from({ length: 2000 }, (_, i) => i);        // long lists (stop_token_ids, tokens, ...)
    case 8: return Object.fromEntries(Array.from({ length: 2000 }, (_, i) => [String(i), 1]));  // a big logit_bias
    case 9: return [{ role: pick(['user', 'assistant', 'tool', 'robot']), content: randomValue(random, depth + 1) }];
    case 10: return JSON.parse('['.repeat(100) + ']'.repeat(100));  // past the nesting limit
    default: return pick(['text', 'auto', 'none', 'required', 'json_object', 'low', 'function']);
  }
}

function lengthValue(random) {
  return [0, -1, 1, 2, 1e9, 2 ** 53, '4', 4.5, [], {}, true][Math.floor(random() * 11)];
}

// A request body text: a valid base with some fields mutated, or bytes that are not JSON.
function fuzzBody(random, base) {
  const roll = random();
  if (roll < 0.08) return JSON.stringify(base).slice(0, Math.floor(random() * 20));  // truncated
  if (roll < 0.12) return Buffer.from(Array.from({ length: 64 }, () => Math.floor(random() * 256))).toString('latin1');
  if (roll < 0.15) return '{"prompt": "\xff\xfe invalid utf-8 \xc3", "max_tokens": 2}';
  if (roll < 0.18) return JSON.stringify([base]);
  const body = structuredClone(base);
  const mutations = 1 + Math.floor(random() * 3);
  for (let m = 0; m < mutations; ++m) {
    const field = FIELDS[Math.floor(random() * FIELDS.length)];
    body[field] = LENGTH_FIELDS.has(field) ? lengthValue(random) : randomValue(random);
  }
  if (body.stream === true && random() < 0.5) body.stream_options = { include_usage: true };
  return JSON.stringify(body);
}

async function readFully(response) {
  const type = response.headers.get('content-type') ?? '';
  const text = await response.text();
  return { status: response.status, type, text };
}

function assertWellFormed(result, what) {
  assert.ok(result.status < 500, `${what}: HTTP ${result.status}: ${result.text.slice(0, 300)}`);
  if (result.status === 200 && result.type.startsWith('text/event-stream')) {
    assert.ok(/data: \[DONE\]\n\n$|event: response\.(completed|incomplete)\n/.test(result.text),
      `${what}: the stream did not end properly: ${result.text.slice(-300)}`);
    return;
  }
  assert.ok(result.type.startsWith('application/json'), `${what}: content-type ${result.type}`);
  const json = JSON.parse(result.text);
  if (result.status === 200) return;
  assert.equal(typeof json.error?.message, 'string', `${what}: ${result.text.slice(0, 300)}`);
  assert.ok(json.error.message.length > 0);
  for (const key of ['type', 'param', 'code']) assert.ok(key in json.error, `${what}: error.${key} missing`);
}

async function expectIdle(base) {
  await waitFor(async () => {
    const { samples } = await metrics(base);
    return metricValue(samples, 'vllm:num_requests_running') === 0 &&
      metricValue(samples, 'vllm:num_requests_waiting') === 0 &&
      metricValue(samples, 'vllm:kv_cache_usage_perc') === 0;
  }, 30000, 'no request running or waiting and every KV block free');
}

async function expectServing(base, client) {
  assert.equal((await fetch(`${base}/health`)).status, 200);
  const answer = await client.chat.completions.create({
    model: MODEL, messages: [{ role: 'user', content: 'Still there?' }], max_tokens: 3,
  });
  assert.equal(answer.choices.length, 1);
}

describe('robustness', () => {
  let model;
  let server;
  let client;

  before(async () => {
    model = makeTinyModel(MODEL);
    server = await startServer(model.dir, ['--max-request-body-bytes', '1M']);
    client = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
  });

  after(async () => {
    const { code } = await server.stop();
    model.cleanup();
    assert.equal(code, 0, `server exit code after SIGTERM\n${server.log()}`);
  });

  test(`fuzzed request bodies (${FUZZ_REQUESTS}) all get a success or an OpenAI error`, async (t) => {
    const seed = Number(process.env.BEAMLINE_FUZZ_SEED ?? 22);
    const random = rng(seed);
    const paths = Object.keys(ENDPOINTS);
    const statuses = new Map();
    for (let batch = 0; batch < FUZZ_REQUESTS; batch += 16) {
      await Promise.all(Array.from({ length: Math.min(16, FUZZ_REQUESTS - batch) }, async (_, k) => {
        const path = paths[Math.floor(random() * paths.length)];
        const body = fuzzBody(random, ENDPOINTS[path]);
        const what = `seed ${seed} request ${batch + k} ${path} ${body.slice(0, 200)}`;
        const response = await fetch(server.base + path, {
          method: 'POST', headers: { 'Content-Type': 'application/json' }, body,
        });
        const result = await readFully(response);
        assertWellFormed(result, what);
        statuses.set(result.status, (statuses.get(result.status) ?? 0) + 1);
      }));
    }
    t.diagnostic(`seed ${seed}: HTTP statuses ${JSON.stringify(Object.fromEntries(statuses))}`);
    // The fuzz must reach both sides: bodies the server accepts and bodies it refuses.
    assert.ok((statuses.get(200) ?? 0) > 0, `no fuzzed request succeeded: ${[...statuses]}`);
    assert.ok((statuses.get(400) ?? 0) > FUZZ_REQUESTS / 4, `too few 400s: ${[...statuses]}`);
    const oversized = await fetch(`${server.base}/v1/completions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ prompt: 'x'.repeat(2 << 20), max_tokens: 1 }),
    });
    assertWellFormed(await readFully(oversized), 'a body over --max-request-body-bytes');
    assert.equal(oversized.status, 413);
    await expectServing(server.base, client);
    await expectIdle(server.base);
  });

  test('malformed HTTP on the socket: answered with a status line or closed, and the server keeps serving', async (t) => {
    const cases = [
      'GARBAGE\r\n\r\n',
      'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n{}',
      'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n{}',
      'POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n',
      'POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\n{}',
      `GET /${'a'.repeat(100000)} HTTP/1.1\r\nHost: x\r\n\r\n`,
      `GET /health HTTP/1.1\r\n${'X-Junk: y\r\n'.repeat(5000)}\r\n`,
      'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n{"a"',  // shorter than announced
      'GET /health HTTP/9.9\r\n\r\n',
      '\r\n\r\n\r\n',
    ];
    const answers = await Promise.all(cases.map((bytes) => rawExchange(server.port, bytes)));
    cases.forEach((bytes, i) => {
      const answer = answers[i];
      if (answer) assert.match(answer, /^HTTP\/1\.1 \d{3} /, `${JSON.stringify(bytes.slice(0, 80))} got ${answer.slice(0, 200)}`);
    });
    t.diagnostic(`status lines: ${answers.map((answer) => answer.slice(9, 12) || 'closed').join(' ')}`);
    // Most of these are answered rather than dropped (a malformed request line, an oversize header, ...).
    assert.ok(answers.filter(Boolean).length >= cases.length / 2, answers.map((a) => a.slice(0, 12)).join(' | '));
    await expectServing(server.base, client);
    await expectIdle(server.base);
  });

  test('non-streamed requests whose clients leave are aborted: nothing left running, every KV block back', async () => {
    // Long enough that none ends before the engine is paused below (the chat prompt's 173 tokens leave room under the
    // harness's 4,096 context); paused, none can end on its own however fast the machine, so each must be aborted.
    const long = 3500;
    const bodies = [
      ['/v1/chat/completions', { messages: [{ role: 'user', content: 'Talk.' }], max_tokens: long, ignore_eos: true }],
      ['/v1/completions', { prompt: ['Once', 'Upon'], max_tokens: long, ignore_eos: true }],  // two engine requests
      ['/v1/responses', { input: 'Talk.', max_output_tokens: long, ignore_eos: true }],
      ['/generate', { text: 'Once', sampling_params: { max_new_tokens: long, ignore_eos: true } }],
    ];
    const engineRequests = 5;
    const before = await metrics(server.base);
    const abortedBefore = metricValue(before.samples, 'vllm:request_success_total', 'abort');
    const controller = new AbortController();
    const pending = bodies.map(([path, body]) => fetch(server.base + path, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body),
      signal: controller.signal,
    }).then((response) => assert.fail(`${path} answered ${response.status} before its client left`),
      (error) => assert.equal(error.name, 'AbortError')));
    await waitFor(async () => {
      const { samples } = await metrics(server.base);
      return metricValue(samples, 'vllm:num_requests_running') === engineRequests;
    }, 30000, `${engineRequests} requests running`);
    assert.equal((await fetch(`${server.base}/pause?mode=keep`, { method: 'POST' })).status, 200);
    try {
      controller.abort();
      await Promise.all(pending);
      await expectIdle(server.base);
      const { samples } = await metrics(server.base);
      assert.equal(metricValue(samples, 'vllm:request_success_total', 'abort') - abortedBefore, engineRequests,
        'every request of a client that left ends as aborted');
    } finally {
      assert.equal((await fetch(`${server.base}/resume`, { method: 'POST' })).status, 200);
    }
    await expectServing(server.base, client);
  });

  test('soak: streams whose clients leave at random points; /health stays fast, nothing leaks', async () => {
    const random = rng(7);
    const healthTimes = [];
    let loading = true;
    const prober = (async () => {
      while (loading) {
        const start = performance.now();
        assert.equal((await fetch(`${server.base}/health`)).status, 200);
        healthTimes.push(performance.now() - start);
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
    })();
    let left = 0;
    let finished = 0;
    for (let round = 0; round < 3; ++round) {
      await Promise.all(Array.from({ length: 48 }, async (_, i) => {
        const leaveAfter = random() < 0.4 ? 1 + Math.floor(random() * 20) : Infinity;
        const controller = new AbortController();
        const path = ['/v1/chat/completions', '/v1/completions', '/v1/responses'][i % 3];
        const body = path === '/v1/responses'
          ? { input: `story ${i}`, max_output_tokens: 32, stream: true }
          : path === '/v1/completions'
            ? { prompt: `story ${i}`, max_tokens: 32, ignore_eos: true, stream: true }
            : { messages: [{ role: 'user', content: `story ${i}` }], max_tokens: 32, ignore_eos: true, stream: true, n: 1 + (i % 2) };
        try {
          const response = await fetch(server.base + path, {
            method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body),
            signal: controller.signal,
          });
          assert.equal(response.status, 200);
          let chunks = 0;
          for await (const bytes of response.body) {
            chunks += bytes.length > 0 ? 1 : 0;
            if (chunks >= leaveAfter) {
              controller.abort();
              ++left;
              return;
            }
          }
          ++finished;
        } catch (error) {
          if (error.name !== 'AbortError') throw error;
        }
      }));
    }
    loading = false;
    await prober;
    assert.ok(left > 10 && finished > 10, `left ${left}, finished ${finished}`);
    await expectIdle(server.base);
    await expectServing(server.base, client);
    healthTimes.sort((a, b) => a - b);
    const p95 = healthTimes[Math.floor(healthTimes.length * 0.95)];
    assert.ok(p95 < 500, `/health p95 ${p95.toFixed(1)} ms under load (${healthTimes.length} probes)`);
    const { samples } = await metrics(server.base);
    assert.equal(metricValue(samples, 'beamline:http_streams_active') ?? samples.get('beamline:http_streams_active'), 0);
  });
});
