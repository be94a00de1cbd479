// `beamline serve --speculative-config` on the default model answers exactly as without it (`none`), with n-gram drafts
// and with the dflash drafter the default model uses when no flag is given (models/beam-nano-drafter): the same greedy
// chat answers, tool calls, streamed text and logprobs, through the official openai client; drafts are accepted
// (vLLM's spec_decode metrics), and a dflash config without a fitting drafter is refused at start-up.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';
import OpenAI from 'openai';
import { metrics, metricValue, startServer } from './server_harness.mjs';

const repoRoot = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const ngram = JSON.stringify({ method: 'ngram', num_speculative_tokens: 5, prompt_lookup_min: 2, prompt_lookup_max: 4 });

const tools = [{
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Get the current weather for a city.',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
}];
const conversations = [
  [{ role: 'user', content: 'Add 57 and 406.' }],
  [{ role: 'user', content: 'Convert 12 kilometers to meters.' }],
  [{ role: 'user', content: "What's the weather in Paris?" }],
];

// Each conversation greedy (with logprobs), and the first one streamed, as one server answers them.
async function answers(server) {
  const client = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'unused' });
  const out = [];
  for (const messages of conversations) {
    const reply = await client.chat.completions.create({
      model: 'beam-nano', messages, tools, temperature: 0, max_tokens: 200, logprobs: true, top_logprobs: 2,
    });
    const choice = reply.choices[0];
    out.push({ message: choice.message, finish: choice.finish_reason,
               logprobs: choice.logprobs?.content?.map((t) => [t.token, t.logprob]) });
  }
  const stream = await client.chat.completions.create({
    model: 'beam-nano', messages: conversations[0], temperature: 0, max_tokens: 200, stream: true,
  });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
  out.push({ streamed: text });
  return out;
}

let expected;  // the plain engine's answers, once
async function plainAnswers() {
  if (expected) return expected;
  const plain = await startServer(null, ['--speculative-config', 'none'], { cwd: repoRoot });
  try {
    expected = await answers(plain);
  } finally {
    await plain.stop();
  }
  return expected;
}

for (const [name, flags] of [['n-gram', ['--speculative-config', ngram]], ['dflash (the default)', []]]) test(
    `speculative decoding (${name}) serves the answers of the plain engine`, async () => {
  const expected = await plainAnswers();
  const speculative = await startServer(null, flags, { cwd: repoRoot });
  try {
    const got = await answers(speculative);
    for (let i = 0; i < expected.length; ++i) {
      // Tool call ids are random per response; everything else must match.
      for (const call of [...(got[i].message?.tool_calls ?? []), ...(expected[i].message?.tool_calls ?? [])]) delete call.id;
      assert.deepEqual(got[i], expected[i], `answer ${i}`);
    }
    const { samples } = await metrics(speculative.base);
    assert.ok(metricValue(samples, 'vllm:spec_decode_num_drafts_total') > 0);
    assert.ok(metricValue(samples, 'vllm:spec_decode_num_accepted_tokens_total') > 0, 'no draft was accepted');
    assert.ok(metricValue(samples, 'vllm:spec_decode_num_accepted_tokens_per_pos_total', 'position="0"') > 0);
  } finally {
    await speculative.stop();
  }
});

test('a dflash drafter that is not there is refused at start-up, naming it', async () => {
  const config = JSON.stringify({ method: 'dflash', model: '/nonexistent/drafter', num_speculative_tokens: 7 });
  await assert.rejects(startServer(null, ['--speculative-config', config], { cwd: repoRoot }),
                       /nonexistent\/drafter\/config\.json/);
});
