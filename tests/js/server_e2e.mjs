// End-to-end tests of `beamline serve` on a random tiny model, driven by the official `openai` npm client
// (and plain fetch where the test needs the raw HTTP status or bytes). Run: BEAMLINE_EXE=... node --test.
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { execFileSync } from 'node:child_process';

import {
  BEAMLINE, makeTinyModel, startServer, postJson, metrics, metricValue, waitFor, readSse, rawStream,
} from './server_harness.mjs';

const MODEL = 'tiny';
const WEATHER_TOOL = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Current weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
};

// Greedy chat output as one comparable record per choice, from a non-streaming response.
function messageRecord(choice) {
  const message = choice.message;
  return {
    content: message.content ?? '',
    reasoning: message.reasoning_content ?? '',
    tools: (message.tool_calls ?? []).map((call) => [call.function.name, call.function.arguments]),
    finish: choice.finish_reason,
  };
}

// The same record assembled from streamed chunks (checks the chunk protocol on the way).
function streamRecords(chunks) {
  const records = new Map();
  for (const chunk of chunks) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    for (const choice of chunk.choices) {
      if (!records.has(choice.index)) {
        assert.equal(choice.delta.role, 'assistant', 'the first chunk of a choice carries the role');
        records.set(choice.index, { content: '', reasoning: '', tools: [], finish: null });
      }
      const record = records.get(choice.index);
      assert.equal(record.finish, null, 'no chunk after the finish_reason chunk');
      const delta = choice.delta ?? {};
      record.content += delta.content ?? '';
      record.reasoning += delta.reasoning_content ?? '';
      for (const call of delta.tool_calls ?? []) {
        if (call.id) {
          assert.equal(call.index, record.tools.length, 'a new tool call gets the next index');
          assert.match(call.id, /^call_/);
          assert.ok(call.function?.name, 'a new tool call names its function');
          record.tools.push([call.function.name, call.function.arguments ?? '']);
        } else {
          assert.ok(call.index < record.tools.length, 'argument fragments follow their call');
          assert.equal(call.function?.name, undefined, 'only the first delta of a call has the name');
          record.tools[call.index][1] += call.function?.arguments ?? '';
        }
      }
      if (choice.finish_reason) record.finish = choice.finish_reason;
    }
  }
  return [...records.entries()].sort((a, b) => a[0] - b[0]).map(([, record]) => record);
}

async function collectStream(stream) {
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  return chunks;
}

function assertErrorShape(result, status, param) {
  assert.equal(result.status, status, result.text);
  assert.ok(result.json && typeof result.json.error === 'object', `error JSON expected, got: ${result.text}`);
  const { error } = result.json;
  for (const key of ['message', 'type', 'param', 'code']) assert.ok(key in error, `error.${key} missing: ${result.text}`);
  assert.equal(typeof error.message, 'string');
  assert.ok(error.message.length > 0);
  if (param !== undefined) assert.equal(error.param, param, result.text);
}

describe('beamline serve', () => {
  let model;
  let server;
  let client;

  before(async () => {
    model = makeTinyModel(MODEL);
    server = await startServer(model.dir, ['--max-request-body-bytes', '1M']);
    client = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
  });

  after(async () => {
    const { code } = await server.stop();
    model.cleanup();
    assert.equal(code, 0, `server exit code after SIGTERM\n${server.log()}`);
  });

  test('health and models', async () => {
    assert.equal((await fetch(`${server.base}/health`)).status, 200);
    const models = await client.models.list();
    assert.deepEqual(models.data.map((m) => m.id), [MODEL]);
    assert.equal(models.data[0].max_model_len, 4096);
  });

  test('/version agrees with beamline --version', async () => {
    const response = await fetch(`${server.base}/version`);
    assert.equal(response.status, 200);
    const { version } = await response.json();
    assert.match(version, /^\d+\.\d+\.\d+/);
    assert.equal(execFileSync(BEAMLINE, ['--version'], { encoding: 'utf8' }).trim(), version);
  });

  test('/tokenize and /detokenize: a prompt round-trips, chat messages count as the chat endpoint does', async () => {
    const base = server.base;
    const text = 'The sky is blue, and <|start|> is a special token.';
    const tokenized = await postJson(base, '/tokenize', { model: MODEL, prompt: text, return_token_strs: true });
    assert.equal(tokenized.status, 200, tokenized.text);
    const { count, max_model_len: maxModelLen, tokens, token_strs: tokenStrs } = tokenized.json;
    assert.equal(count, tokens.length);
    assert.ok(count > 5);
    assert.equal(maxModelLen, 4096);
    assert.equal(tokenStrs.length, count);
    assert.equal(tokenStrs.join(''), text, 'this text is ASCII: the token strings concatenate to it');
    const plain = await postJson(base, '/tokenize', { model: MODEL, prompt: text });
    assert.equal(plain.json.token_strs, undefined, 'token_strs only when asked');

    const detokenized = await postJson(base, '/detokenize', { model: MODEL, tokens });
    assert.equal(detokenized.status, 200, detokenized.text);
    assert.deepEqual(detokenized.json, { prompt: text });

    const messages = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Name three colours.' }];
    const chatTokens = await postJson(base, '/tokenize', { model: MODEL, messages, add_generation_prompt: true });
    assert.equal(chatTokens.status, 200, chatTokens.text);
    const chat = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 1, temperature: 0 });
    assert.equal(chatTokens.json.count, chat.usage.prompt_tokens);
    // The ids are the chat prompt: Harmony messages, ending in the assistant header the model continues.
    const rendered = (await postJson(base, '/detokenize', { model: MODEL, tokens: chatTokens.json.tokens })).json.prompt;
    assert.ok(rendered.startsWith('<|start|>system<|message|>'), rendered);
    assert.ok(rendered.endsWith('<|start|>assistant'), rendered);
    assert.ok(rendered.includes('<|start|>user<|message|>Name three colours.<|end|>'), rendered);
    const noGeneration = await postJson(base, '/tokenize', { model: MODEL, messages, add_generation_prompt: false });
    assert.deepEqual(noGeneration.json.tokens, chatTokens.json.tokens.slice(0, noGeneration.json.count),
      'without the generation prompt the ids are a prefix');
    assert.ok(noGeneration.json.count < chatTokens.json.count);

    assertErrorShape(await postJson(base, '/tokenize', { model: MODEL }), 400, 'prompt');
    assertErrorShape(await postJson(base, '/tokenize', { model: MODEL, prompt: 'x', messages }), 400, 'messages');
    assertErrorShape(await postJson(base, '/tokenize', { model: MODEL, prompt: 7 }), 400, 'prompt');
    assertErrorShape(await postJson(base, '/tokenize', { model: MODEL, messages: [] }), 400, 'messages');
    assertErrorShape(await postJson(base, '/tokenize', { model: MODEL, prompt: 'x', return_token_strs: 'yes' }), 400,
      'return_token_strs');
    const unknown = await postJson(base, '/tokenize', { model: 'gpt-4o', prompt: 'x' });
    assertErrorShape(unknown, 404, 'model');
    assert.equal(unknown.json.error.code, 'model_not_found');
    assertErrorShape(await postJson(base, '/detokenize', { model: MODEL, tokens: [1, 1000000000] }), 400, 'tokens');
    assertErrorShape(await postJson(base, '/detokenize', { model: MODEL, tokens: [-1] }), 400, 'tokens');
    assertErrorShape(await postJson(base, '/detokenize', { model: MODEL, tokens: 'abc' }), 400, 'tokens');
    assertErrorShape(await postJson(base, '/detokenize', { model: MODEL }), 400, 'tokens');
    assertErrorShape(await postJson(base, '/detokenize', { model: 'gpt-4o', tokens: [1] }), 404, 'model');
  });

  test('chat: non-streaming and streaming give the same greedy answer', async () => {
    const request = {
      model: MODEL,
      messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Name three colours.' }],
      max_tokens: 40,
      temperature: 0,
    };
    const whole = await client.chat.completions.create(request);
    assert.equal(whole.object, 'chat.completion');
    assert.match(whole.id, /^chatcmpl-/);
    assert.equal(whole.choices.length, 1);
    assert.equal(whole.choices[0].message.role, 'assistant');
    assert.ok(['stop', 'length', 'tool_calls'].includes(whole.choices[0].finish_reason));
    const usage = whole.usage;
    assert.ok(usage.prompt_tokens > 20, 'the Harmony prompt has a system message');
    assert.ok(usage.completion_tokens >= 1 && usage.completion_tokens <= 40);
    assert.equal(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens);
    if (whole.choices[0].finish_reason === 'length') assert.equal(usage.completion_tokens, 40);

    const chunks = await collectStream(await client.chat.completions.create({
      ...request, stream: true, stream_options: { include_usage: true },
    }));
    const last = chunks[chunks.length - 1];
    assert.deepEqual(last.choices, [], 'the usage chunk comes last, without choices');
    assert.equal(last.usage.completion_tokens, usage.completion_tokens);
    assert.equal(last.usage.prompt_tokens, usage.prompt_tokens);
    for (const chunk of chunks.slice(0, -1)) assert.equal(chunk.usage, null);
    assert.deepEqual(streamRecords(chunks), [messageRecord(whole.choices[0])]);
  });

  test('completions: text, token ids, echo, streaming', async () => {
    const whole = await client.completions.create({ model: MODEL, prompt: 'The sky is', max_tokens: 12, temperature: 0 });
    assert.equal(whole.object, 'text_completion');
    assert.equal(whole.choices.length, 1);
    assert.ok(['stop', 'length'].includes(whole.choices[0].finish_reason));
    assert.ok(whole.usage.prompt_tokens >= 1);

    const echoed = await client.completions.create({
      model: MODEL, prompt: 'The sky is', max_tokens: 12, temperature: 0, echo: true,
    });
    assert.equal(echoed.choices[0].text, 'The sky is' + whole.choices[0].text);

    const ids = await client.completions.create({ model: MODEL, prompt: [5, 6, 7, 8], max_tokens: 6, temperature: 0 });
    assert.equal(ids.usage.prompt_tokens, 4);
    assert.ok(ids.usage.completion_tokens >= 1);

    const chunks = await collectStream(await client.completions.create({
      model: MODEL, prompt: 'The sky is', max_tokens: 12, temperature: 0, stream: true,
    }));
    const text = chunks.map((c) => c.choices.map((choice) => choice.text).join('')).join('');
    assert.equal(text, whole.choices[0].text);
    const finishes = chunks.flatMap((c) => c.choices.filter((choice) => choice.finish_reason));
    assert.equal(finishes.length, 1);
  });

  test('n > 1: every choice is returned once, with its own index', async () => {
    const chat = await client.chat.completions.create({
      model: MODEL, messages: [{ role: 'user', content: 'Tell me a story.' }], n: 3, max_tokens: 16,
      temperature: 1.0, seed: 42,
    });
    assert.deepEqual(chat.choices.map((c) => c.index).sort(), [0, 1, 2]);
    const again = await client.chat.completions.create({
      model: MODEL, messages: [{ role: 'user', content: 'Tell me a story.' }], n: 3, max_tokens: 16,
      temperature: 1.0, seed: 42,
    });
    assert.deepEqual(again.choices.map(messageRecord), chat.choices.map(messageRecord), 'same seed, same answers');

    const chunks = await collectStream(await client.completions.create({
      model: MODEL, prompt: 'Once upon a time', n: 2, max_tokens: 10, temperature: 1.0, seed: 7, stream: true,
    }));
    const finished = chunks.flatMap((c) => c.choices.filter((choice) => choice.finish_reason).map((choice) => choice.index));
    assert.deepEqual(finished.sort(), [0, 1]);
  });

  test('logprobs: chat top_logprobs and completions logprobs', async () => {
    const chat = await client.chat.completions.create({
      model: MODEL, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 10, temperature: 0,
      logprobs: true, top_logprobs: 3,
    });
    const entries = chat.choices[0].logprobs.content;
    assert.equal(entries.length, chat.usage.completion_tokens, 'one entry per generated token');
    for (const entry of entries) {
      assert.ok(entry.logprob <= 0);
      assert.equal(entry.top_logprobs.length, 3);
      for (let i = 1; i < 3; ++i) assert.ok(entry.top_logprobs[i - 1].logprob >= entry.top_logprobs[i].logprob);
      // Greedy: the sampled token is the most likely one.
      assert.ok(Math.abs(entry.logprob - entry.top_logprobs[0].logprob) < 1e-5);
      assert.ok(Array.isArray(entry.bytes));
    }
    const completion = await client.completions.create({
      model: MODEL, prompt: 'Hello', max_tokens: 8, temperature: 0, logprobs: 2,
    });
    const lp = completion.choices[0].logprobs;
    assert.equal(lp.tokens.length, completion.usage.completion_tokens);
    assert.equal(lp.token_logprobs.length, lp.tokens.length);
    assert.equal(lp.top_logprobs.length, lp.tokens.length);
    for (const value of lp.token_logprobs) assert.ok(value <= 0);
    for (const top of lp.top_logprobs) assert.ok(Object.keys(top).length >= 1 && Object.keys(top).length <= 2);
  });

  test('tools: auto, a named tool_choice (streamed the same), and a tool-call round trip', async () => {
    const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];
    const auto = await client.chat.completions.create({
      model: MODEL, messages, tools: [WEATHER_TOOL], max_tokens: 24, temperature: 0,
    });
    assert.equal(auto.choices.length, 1);

    const named = {
      model: MODEL, messages, tools: [WEATHER_TOOL], max_tokens: 24, temperature: 0,
      tool_choice: { type: 'function', function: { name: 'get_weather' } },
    };
    const forced = await client.chat.completions.create(named);
    const calls = forced.choices[0].message.tool_calls;
    assert.ok(calls && calls.length >= 1, JSON.stringify(forced));
    assert.equal(calls[0].type, 'function');
    assert.equal(calls[0].function.name, 'get_weather');
    assert.match(calls[0].id, /^call_/);
    const streamed = streamRecords(await collectStream(await client.chat.completions.create({ ...named, stream: true })));
    assert.deepEqual(streamed, [messageRecord(forced.choices[0])]);

    const roundTrip = await client.chat.completions.create({
      model: MODEL, tools: [WEATHER_TOOL], max_tokens: 8, temperature: 0,
      messages: [
        ...messages,
        { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
        { role: 'tool', tool_call_id: 'call_1', content: '{"temperature": 21}' },
      ],
    });
    assert.ok(roundTrip.usage.prompt_tokens > forced.usage.prompt_tokens - 20);

    const none = await client.chat.completions.create({ ...named, tool_choice: 'none' });
    assert.ok(none.usage.prompt_tokens < auto.usage.prompt_tokens, 'tool_choice none leaves the tools out of the prompt');
  });

  test('multi-turn conversation hits the prefix cache', async () => {
    const messages = [
      { role: 'system', content: 'You are a helpful assistant who answers questions about geography in detail.' },
      { role: 'user', content: 'What is the capital of France, and what river runs through it?' },
    ];
    const first = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 8, temperature: 0 });
    const reply = first.choices[0].message.content || 'Paris, on the Seine.';
    const second = await client.chat.completions.create({
      model: MODEL, max_tokens: 8, temperature: 0,
      messages: [...messages, { role: 'assistant', content: reply }, { role: 'user', content: 'And of Italy?' }],
    });
    const cached = second.usage.prompt_tokens_details.cached_tokens;
    assert.ok(cached >= 16, `second turn reuses the first turn's prompt blocks (cached ${cached})`);
    assert.ok(cached < second.usage.prompt_tokens);
    const { samples } = await metrics(server.base);
    assert.ok(metricValue(samples, 'vllm:prefix_cache_hits_total') >= cached);
  });

  test('64 concurrent streams give exactly what each request gives alone (greedy)', async () => {
    const requests = Array.from({ length: 64 }, (_, i) => ({
      model: MODEL, max_tokens: 12 + (i % 5) * 4, temperature: 0, ignore_eos: true,
      messages: [{ role: 'user', content: `Question number ${i}: ${'why '.repeat(i % 7)}?` }],
    }));
    const alone = [];
    for (const request of requests) alone.push(messageRecord((await client.chat.completions.create(request)).choices[0]));
    const together = await Promise.all(requests.map(async (request) =>
      streamRecords(await collectStream(await client.chat.completions.create({ ...request, stream: true })))[0]));
    for (let i = 0; i < requests.length; ++i) assert.deepEqual(together[i], alone[i], `request ${i}`);
  });

  test('512 concurrent streaming connections are held and all finish', async () => {
    let peak = 0;
    let sampling = true;
    const sampler = (async () => {
      while (sampling) {
        const { samples } = await metrics(server.base);
        peak = Math.max(peak, metricValue(samples, 'beamline:http_streams_active'));
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
    })();
    // node:http with one connection per request: fetch's pool would cap the connections the test opens.
    const results = await Promise.all(Array.from({ length: 512 }, (_, i) => rawStream(server.port,
      JSON.stringify({ model: MODEL, prompt: `stream ${i}`, max_tokens: 24, ignore_eos: true, stream: true }))));
    sampling = false;
    await sampler;
    for (const { events, done } of results) {
      assert.ok(done);
      assert.equal(events.flatMap((e) => e.choices).filter((c) => c.finish_reason === 'length').length, 1);
    }
    assert.ok(peak >= 448, `streams open at once: ${peak}`);
  });

  test('bad input gets 4xx with an OpenAI error body, and the server keeps serving', async () => {
    const base = server.base;
    const chat = (body) => postJson(base, '/v1/chat/completions', body);
    const user = [{ role: 'user', content: 'hi' }];

    assertErrorShape(await postJson(base, '/v1/chat/completions', '{"model": "tiny", "messages": ['), 400);
    assertErrorShape(await postJson(base, '/v1/chat/completions', '[1, 2, 3]'), 400);
    assertErrorShape(await chat({ model: MODEL, messages: user, temperature: 'hot' }), 400, 'temperature');
    assertErrorShape(await chat({ model: MODEL, messages: 'hi' }), 400, 'messages');
    assertErrorShape(await chat({ model: MODEL }), 400, 'messages');
    assertErrorShape(await chat({ model: MODEL, messages: [{ role: 'wizard', content: 'x' }] }), 400);
    assertErrorShape(await chat({ model: MODEL, messages: user, max_tokens: '10' }), 400, 'max_tokens');
    assertErrorShape(await chat({ model: MODEL, messages: user, stream: 'yes' }), 400, 'stream');
    const unknown = await chat({ model: 'gpt-4o', messages: user });
    assertErrorShape(unknown, 404, 'model');
    assert.equal(unknown.json.error.code, 'model_not_found');
    assertErrorShape(await chat({ model: MODEL, messages: user, max_tokens: -5 }), 400, 'max_tokens');
    assertErrorShape(await chat({ model: MODEL, messages: user, max_tokens: 1000000000 }), 400, 'max_tokens');
    assertErrorShape(await chat({ model: MODEL, messages: user, n: 0 }), 400, 'n');
    assertErrorShape(await chat({ model: MODEL, messages: user, n: 1000 }), 400, 'n');
    assertErrorShape(await chat({ model: MODEL, messages: user, logprobs: true, top_logprobs: 50 }), 400, 'top_logprobs');
    assertErrorShape(await chat({ model: MODEL, messages: user, logprobs: true, top_logprobs: -1 }), 400, 'top_logprobs');
    assertErrorShape(await postJson(base, '/v1/completions', { model: MODEL, prompt: 'x', logprobs: 100 }), 400, 'logprobs');
    assertErrorShape(await chat({
      model: MODEL, messages: user, tools: [WEATHER_TOOL], tool_choice: { type: 'function', function: { name: 'launch_rocket' } },
    }), 400, 'tool_choice');
    assertErrorShape(await chat({ model: MODEL, messages: user, tool_choice: 'required' }), 400, 'tool_choice');
    assertErrorShape(await chat({ model: MODEL, messages: user, tool_choice: 'sometimes', tools: [WEATHER_TOOL] }), 400, 'tool_choice');
    assertErrorShape(await chat({ model: MODEL, messages: user, reasoning_effort: 'extreme' }), 400, 'reasoning_effort');
    assertErrorShape(await chat({ model: MODEL, messages: user, response_format: { type: 'json_schema' } }), 400, 'response_format.json_schema');
    // Longer than the 4096-token context.
    const longIds = Array.from({ length: 4200 }, (_, i) => 10 + (i % 200));
    assertErrorShape(await postJson(base, '/v1/completions', { model: MODEL, prompt: longIds, max_tokens: 1 }), 400, 'prompt');
    assertErrorShape(await chat({ model: MODEL, messages: [{ role: 'user', content: 'word '.repeat(5000) }] }), 400);
    assertErrorShape(await postJson(base, '/v1/completions', { model: MODEL, prompt: [99999] }), 400, 'prompt');
    assertErrorShape(await postJson(base, '/v1/completions', { model: MODEL }), 400, 'prompt');
    // Over --max-request-body-bytes 1M.
    const oversize = await postJson(base, '/v1/chat/completions', { model: MODEL, messages: [{ role: 'user', content: 'x'.repeat(2 << 20) }] });
    assertErrorShape(oversize, 413);
    assertErrorShape(await postJson(base, '/v1/no-such-route', {}), 404);

    // The official client surfaces the same errors.
    await assert.rejects(client.chat.completions.create({ model: MODEL, messages: user, n: 0 }),
      (error) => error.status === 400 && error.error?.param === 'n');

    const ok = await client.chat.completions.create({ model: MODEL, messages: user, max_tokens: 4 });
    assert.equal(ok.choices.length, 1);
  });

  test('a client leaving mid-stream aborts its request and frees its blocks', async () => {
    const before = (await metrics(server.base)).samples;
    const abortedBefore = metricValue(before, 'vllm:request_success_total', 'finished_reason="abort"');
    const stream = await client.completions.create({
      model: MODEL, prompt: 'Count forever:', max_tokens: 3000, temperature: 0, ignore_eos: true, stream: true,
    });
    let received = 0;
    for await (const chunk of stream) {
      assert.equal(chunk.object, 'text_completion');
      if (++received === 5) break;  // leaving the loop aborts the HTTP request
    }
    await waitFor(async () => {
      const { samples } = await metrics(server.base);
      return metricValue(samples, 'vllm:request_success_total', 'finished_reason="abort"') === abortedBefore + 1 &&
        metricValue(samples, 'vllm:num_requests_running') === 0 &&
        metricValue(samples, 'vllm:kv_cache_usage_perc') === 0;
    }, 20000, 'the aborted request to free its blocks');
    const ok = await client.completions.create({ model: MODEL, prompt: 'Still there?', max_tokens: 4 });
    assert.equal(ok.choices.length, 1);
  });

  test('/metrics has vLLM names, consistent histograms and counters that moved', async () => {
    const { text, samples } = await metrics(server.base);
    for (const name of ['vllm:num_requests_running', 'vllm:num_requests_waiting', 'vllm:kv_cache_usage_perc',
      'vllm:prompt_tokens_total', 'vllm:generation_tokens_total', 'vllm:prefix_cache_queries_total',
      'vllm:prefix_cache_hits_total', 'vllm:time_to_first_token_seconds', 'vllm:time_per_output_token_seconds',
      'vllm:e2e_request_latency_seconds', 'beamline:kv_cache_hybrid_saved_bytes']) {
      assert.match(text, new RegExp(`^# TYPE ${name} `, 'm'), name);
    }
    assert.ok(metricValue(samples, 'vllm:prompt_tokens_total') > 0);
    assert.ok(metricValue(samples, 'vllm:generation_tokens_total') > 0);
    assert.ok(metricValue(samples, 'vllm:prefix_cache_queries_total') >= metricValue(samples, 'vllm:prefix_cache_hits_total'));
    const ttft = [...samples].filter(([key]) => key.startsWith('vllm:time_to_first_token_seconds_bucket'));
    for (let i = 1; i < ttft.length; ++i) assert.ok(ttft[i][1] >= ttft[i - 1][1], 'buckets are cumulative');
    assert.equal(ttft[ttft.length - 1][1], metricValue(samples, 'vllm:time_to_first_token_seconds_count'));
    assert.ok(metricValue(samples, 'vllm:time_to_first_token_seconds_count') > 0);
    assert.ok(metricValue(samples, 'beamline:http_responses_total', 'code="400"') > 0);
  });
});

describe('beamline serve --api-key', () => {
  test('every /v1 request needs the key; /health does not', async () => {
    const model = makeTinyModel(MODEL);
    const server = await startServer(model.dir, ['--api-key', 'sesame']);
    try {
      assertErrorShape(await postJson(server.base, '/v1/chat/completions', { model: MODEL, messages: [] }), 401);
      const noKey = await fetch(`${server.base}/v1/models`);
      assert.equal(noKey.status, 401);
      const wrong = await fetch(`${server.base}/v1/models`, { headers: { Authorization: 'Bearer open' } });
      assert.equal(wrong.status, 401);
      assert.equal((await fetch(`${server.base}/health`)).status, 200);
      const good = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'sesame', maxRetries: 0 });
      assert.equal((await good.models.list()).data[0].id, MODEL);
      const bad = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'guess', maxRetries: 0 });
      await assert.rejects(bad.models.list(), (error) => error.status === 401);
    } finally {
      await server.stop();
      model.cleanup();
    }
  });
});

describe('beamline serve shutdown', () => {
  test('SIGTERM lets the request in flight finish, then exits 0', async () => {
    const model = makeTinyModel(MODEL);
    const server = await startServer(model.dir);
    try {
      const response = await fetch(`${server.base}/v1/completions`, {
        method: 'POST',
        headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify({ model: MODEL, prompt: 'Go:', max_tokens: 200, ignore_eos: true, stream: true }),
      });
      assert.equal(response.status, 200);
      server.proc.kill('SIGTERM');
      const { events, done } = await readSse(response);
      assert.ok(done, 'the stream ended with [DONE]');
      const finish = events.flatMap((e) => e.choices).find((c) => c.finish_reason);
      assert.equal(finish.finish_reason, 'length');
      const { code } = await server.exited;
      assert.equal(code, 0, server.log());
    } finally {
      await server.stop();
      model.cleanup();
    }
  });
});
