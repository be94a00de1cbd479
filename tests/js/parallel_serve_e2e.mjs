// `beamline serve --tensor-parallel-size 2` (one command: it starts its two ranks under mpirun itself) on the CPU
// backend answers the official client's chat requests with the same greedy text as one process, concurrent requests
// included; a killed worker rank stops the server, which exits naming the rank. Run: BEAMLINE_EXE=... node --test.
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

import { makeTinyModel, startServer, waitFor } from './server_harness.mjs';

const MODEL = 'tiny';
const SERVE_ARGS = ['--device', 'cpu', '--served-model-name', MODEL];
const REQUESTS = [
  [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Name three colours.' }],
  [{ role: 'user', content: 'Count from one to ten, slowly, in words.' }],
  [{ role: 'user', content: 'What is the capital of France?' }],
].map((messages) => ({ model: MODEL, messages, max_tokens: 24, temperature: 0, logprobs: true }));
const PROMPTS = ['The weather today is', 'Once upon a time'];

// A greedy chat answer as text, its tokens (a random model's answer may hold no Harmony content), and its logprobs,
// which may differ in the last digits between layouts (sums in another order).
function record(choice, usage) {
  return {
    text: { content: choice.message.content ?? '', reasoning: choice.message.reasoning_content ?? '',
            finish: choice.finish_reason, tokens: choice.logprobs.content.map((entry) => entry.token),
            completion_tokens: usage.completion_tokens },
    logprobs: choice.logprobs.content.map((entry) => entry.logprob),
  };
}

async function answers(server) {
  const client = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'unused', maxRetries: 0 });
  const chat = (request) => client.chat.completions.create(request).then((r) => record(r.choices[0], r.usage));
  const one = [];
  for (const request of REQUESTS) one.push(await chat(request));
  const together = await Promise.all(REQUESTS.map(chat));
  const completions = [];
  for (const prompt of PROMPTS) {
    const response = await client.completions.create({ model: MODEL, prompt, max_tokens: 16, temperature: 0 });
    completions.push(response.choices[0].text);
  }
  return { one, together, completions };
}

function assertSameAnswers(got, expected, what) {
  assert.deepEqual(got.map((answer) => answer.text), expected.map((answer) => answer.text), what);
  got.forEach((answer, i) => answer.logprobs.forEach((logprob, j) => {
    assert.ok(Math.abs(logprob - expected[i].logprobs[j]) <= 1e-4, `${what}: logprob ${j} of answer ${i}`);
  }));
}

describe('serve --tensor-parallel-size 2', () => {
  let model;
  let expected;
  before(async () => {
    model = makeTinyModel(MODEL);
    const single = await startServer(model.dir, SERVE_ARGS);
    try {
      expected = await answers(single);
    } finally {
      await single.stop();
    }
  });
  after(() => model?.cleanup());

  test('two ranks give the greedy answers of one', async () => {
    const server = await startServer(model.dir, [...SERVE_ARGS, '--tensor-parallel-size', '2']);
    try {
      await waitFor(() => /\[rank 1\].*ready/.test(server.log()), 20000, 'rank 1 logging with its rank');
      const got = await answers(server);
      assertSameAnswers(got.one, expected.one, 'one at a time');
      assertSameAnswers(got.together, expected.one, 'concurrent requests');
      assert.deepEqual(got.completions, expected.completions, 'completions');
      assert.ok(expected.completions.some((text) => text.length > 0), 'the answers have text');
      assert.ok(expected.one.every((answer) => answer.text.tokens.length > 0), 'every chat answer has tokens');
    } finally {
      await server.stop();  // mpirun ends every rank on SIGTERM (no drain, unlike one process)
    }
  });

  test('a worker rank that dies stops the server, naming the rank', async () => {
    const server = await startServer(model.dir, [...SERVE_ARGS, '--tensor-parallel-size', '2']);
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

describe('serve --tensor-parallel-size 2 --distributed-timeout-seconds 2', () => {
  let model;
  before(() => { model = makeTinyModel(MODEL); });
  after(() => model?.cleanup());

  test('a stuck worker: the request gets an error naming the timeout, and the server exits with it', async () => {
    const server = await startServer(model.dir,
      [...SERVE_ARGS, '--tensor-parallel-size', '2', '--distributed-timeout-seconds', '2']);
    await waitFor(() => /rank 1 of 2 ready \(pid \d+\)/.test(server.log()), 20000, 'rank 1 ready');
    const pid = Number(server.log().match(/rank 1 of 2 ready \(pid (\d+)\)/)[1]);
    process.kill(pid, 'SIGSTOP');
    const client = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'unused', maxRetries: 0 });
    await assert.rejects(client.chat.completions.create(REQUESTS[0]), (error) => {
      assert.match(String(error.message), /no answer within --distributed-timeout-seconds 2/, server.log());
      return true;
    });
    const { code } = await Promise.race([
      server.exited,
      new Promise((_, reject) => setTimeout(() => reject(new Error(`still running:\n${server.log()}`)), 30000)),
    ]);
    assert.notEqual(code, 0);
    assert.match(server.log(), /\[rank 0\].*the distributed model failed: rank 0: .*group \(world ranks 0, 1\)/,
                 server.log());
  });
});
