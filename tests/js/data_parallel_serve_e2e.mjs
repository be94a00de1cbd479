// `beamline serve --data-parallel-size 2` (one command: two ranks, an engine per replica behind one endpoint) on the
// CPU backend gives the official client one process's greedy answers, with and without expert parallelism (where a
// replica without work joins the other's expert collectives with dummy steps); uneven load is spread over both engines
// (per-engine metrics, vLLM's engine label); prefix-aware routing keeps a conversation's turns on the engine that caches
// them (more prefix-cache hits than least-loaded routing); /pause holds the requests of every engine until /resume, and
// /sleep until /wake_up; a replica that dies stops the server, which exits naming its rank.
// Run: BEAMLINE_EXE=... node --test.
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

import { MODEL, SERVE_ARGS, answers, assertSameAnswers, record } from './parallel_answers.mjs';
import { makeTinyModel, metrics, postJson, startServer, waitFor } from './server_harness.mjs';

const DP2 = [...SERVE_ARGS, '--data-parallel-size', '2'];
const DP2_EP2 = [...DP2, '--enable-expert-parallel'];
// One long answer and several short ones sent at once: one replica keeps working while the other has nothing to do.
const UNEVEN = [48, 4, 4, 6, 4, 5].map((max_tokens, i) => ({
  model: MODEL, messages: [{ role: 'user', content: `Tell me about the number ${i + 1}.` }], max_tokens,
  temperature: 0, logprobs: true, ignore_eos: true,
}));

async function unevenAnswers(server) {
  const client = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'unused', maxRetries: 0 });
  return Promise.all(UNEVEN.map((request) =>
    client.chat.completions.create(request).then((r) => record(r.choices[0], r.usage))));
}

// Finished requests per engine label, from /metrics.
async function finishedByEngine(server) {
  const { samples } = await metrics(server.base);
  const byEngine = new Map();
  for (const [key, value] of samples) {
    const match = key.match(/^vllm:request_success_total\{.*engine="(\d+)"/);
    if (match) byEngine.set(match[1], (byEngine.get(match[1]) ?? 0) + value);
  }
  return byEngine;
}

// Sequential turns of one conversation, each resending the whole of it: the prompt tokens found in the prefix cache
// and the engines that finished requests.
async function conversationHits(server) {
  const client = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'unused', maxRetries: 0 });
  const messages = [{ role: 'system', content: 'You answer questions about numbers, briefly and precisely.' }];
  for (let turn = 1; turn <= 6; ++turn) {
    messages.push({ role: 'user', content: `Turn ${turn}: what do you know about the number ${turn * 7}?` });
    const reply = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 12, temperature: 0 });
    messages.push({ role: 'assistant', content: reply.choices[0].message.content ?? '' });
  }
  let hits = 0;
  let engines = new Map();
  for (let tries = 0; tries < 50; ++tries) {  // engine stats are snapshots up to ~50 ms old while busy
    const { samples } = await metrics(server.base);
    hits = 0;
    for (const [key, value] of samples) if (key.startsWith('vllm:prefix_cache_hits_total')) hits += value;
    engines = await finishedByEngine(server);
    if ([...engines.values()].reduce((a, b) => a + b, 0) === 6) break;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  return { hits, engines: [...engines].filter(([, count]) => count > 0).map(([engine]) => engine) };
}

describe('serve --data-parallel-size 2', () => {
  let model;
  let expected;
  let expectedUneven;
  before(async () => {
    model = makeTinyModel(MODEL);
    const single = await startServer(model.dir, SERVE_ARGS);
    try {
      expected = await answers(single);
      expectedUneven = await unevenAnswers(single);
      assert.deepEqual([...(await finishedByEngine(single)).keys()], ['0'], 'one process: one engine label');
    } finally {
      await single.stop();
    }
  });
  after(() => model?.cleanup());

  for (const [name, args] of [['DP2', DP2], ['DP2 x EP2', DP2_EP2]]) {
    test(`${name}: the greedy answers of one process, uneven load spread over both engines`, async () => {
      const server = await startServer(model.dir, args);
      try {
        assert.match(server.log(), /2 data-parallel engines/);
        const got = await answers(server);
        assertSameAnswers(got.one, expected.one, `${name}: one at a time`);
        assertSameAnswers(got.together, expected.one, `${name}: concurrent requests`);
        assert.deepEqual(got.completions, expected.completions, `${name}: completions`);
        const uneven = await unevenAnswers(server);
        assertSameAnswers(uneven, expectedUneven, `${name}: uneven load`);
        const total = expected.one.length * 2 + expected.completions.length + UNEVEN.length;
        // An engine's stats are a snapshot up to ~50 ms old while it is busy: wait for the last finishes to show.
        let finished = await finishedByEngine(server);
        for (let tries = 0; tries < 50 && (finished.get('0') ?? 0) + (finished.get('1') ?? 0) < total; ++tries) {
          await new Promise((resolve) => setTimeout(resolve, 100));
          finished = await finishedByEngine(server);
        }
        assert.deepEqual([...finished.keys()].sort(), ['0', '1'], `${name}: engine labels`);
        assert.equal(finished.get('0') + finished.get('1'), total, `${name}: every request finished once`);
        assert.ok(finished.get('0') >= 3 && finished.get('1') >= 3, `${name}: both engines served: ${[...finished]}`);
        if (name !== 'DP2') return;
        // Paused: requests to either engine are held, and answered as before once resumed.
        assert.equal((await postJson(server.base, '/pause?mode=keep', {})).status, 200);
        let done = 0;
        const held = unevenAnswers(server).then((reply) => { done = 1; return reply; });
        await new Promise((resolve) => setTimeout(resolve, 300));
        assert.equal(done, 0, 'requests sent while paused are held');
        assert.equal((await postJson(server.base, '/resume', {})).status, 200);
        assertSameAnswers(await held, expectedUneven, 'after /resume');
        // Asleep: the same on every engine (a distributed model keeps its device memory, and says so) until /wake_up.
        const slept = await postJson(server.base, '/sleep?level=1', {});
        assert.equal(slept.status, 200, slept.text);
        assert.equal(slept.json.device_memory_released, false);
        let woken = 0;
        const heldAsleep = unevenAnswers(server).then((reply) => { woken = 1; return reply; });
        await new Promise((resolve) => setTimeout(resolve, 300));
        assert.equal(woken, 0, 'requests sent while asleep are held');
        assert.equal((await postJson(server.base, '/wake_up', {})).status, 200);
        assertSameAnswers(await heldAsleep, expectedUneven, 'after /wake_up');
      } finally {
        await server.stop();
      }
    });
  }

  test('DP2: prefix-aware routing keeps a conversation on one engine; least-loaded spreads it', async () => {
    const results = {};
    for (const routing of ['prefix-aware', 'least-loaded']) {
      const server = await startServer(model.dir, [...DP2, '--data-parallel-routing', routing]);
      try {
        assert.match(server.log(), new RegExp(`2 data-parallel engines, ${routing} routing`));
        results[routing] = await conversationHits(server);
      } finally {
        await server.stop();
      }
    }
    const aware = results['prefix-aware'];
    const least = results['least-loaded'];
    assert.equal(aware.engines.length, 1, `prefix-aware: every turn on one engine: ${JSON.stringify(aware)}`);
    assert.equal(least.engines.length, 2, `least-loaded: turns go round: ${JSON.stringify(least)}`);
    assert.ok(aware.hits > least.hits, `prefix-cache hits: prefix-aware ${aware.hits} > least-loaded ${least.hits}`);
  });

  test('a replica that dies stops the server, naming its rank', async () => {
    const server = await startServer(model.dir, DP2_EP2);
    await waitFor(() => /rank 1 of 2 ready \(pid \d+\)/.test(server.log()), 20000, 'rank 1 ready');
    const pid = Number(server.log().match(/rank 1 of 2 ready \(pid (\d+)\)/)[1]);
    process.kill(pid, 'SIGKILL');
    const { code } = await Promise.race([
      server.exited,
      new Promise((_, reject) => setTimeout(() => reject(new Error(`still running:\n${server.log()}`)), 30000)),
    ]);
    assert.notEqual(code, 0);
    assert.match(server.log(), /process rank 1 .*exited on signal 9/, server.log());
  });
});
