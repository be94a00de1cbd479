// `beamline serve --tensor-parallel-size 2` (one command: it starts its two ranks under mpirun itself) on the CPU
// backend answers the official client's chat requests with the same greedy text as one process, concurrent requests
// included; a killed worker rank stops the server, which exits naming the rank. Run: BEAMLINE_EXE=... node --test.
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

import { MODEL, REQUESTS, SERVE_ARGS, answers, assertSameAnswers } from './parallel_answers.mjs';
import { makeTinyModel, startServer, waitFor } from './server_harness.mjs';

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
