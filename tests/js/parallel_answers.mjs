// The answers the distributed-serving tests compare between layouts: greedy chat (one at a time and concurrent) and
// completions through the official openai client, against one process's.
import assert from 'node:assert/strict';
import OpenAI from 'openai';

export const MODEL = 'tiny';
export const SERVE_ARGS = ['--device', 'cpu', '--served-model-name', MODEL];
export const REQUESTS = [
  [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Name three colours.' }],
  [{ role: 'user', content: 'Count from one to ten, slowly, in words.' }],
  [{ role: 'user', content: 'What is the capital of France?' }],
].map((messages) => ({ model: MODEL, messages, max_tokens: 24, temperature: 0, logprobs: true }));
export const PROMPTS = ['The weather today is', 'Once upon a time'];

// A greedy chat answer as text, its tokens (a random model's answer may hold no Harmony content), and its logprobs,
// which may differ in the last digits between layouts (sums in another order).
export function record(choice, usage) {
  return {
    text: { content: choice.message.content ?? '', reasoning: choice.message.reasoning_content ?? '',
            finish: choice.finish_reason, tokens: choice.logprobs.content.map((entry) => entry.token),
            completion_tokens: usage.completion_tokens },
    logprobs: choice.logprobs.content.map((entry) => entry.logprob),
  };
}

export async function answers(server) {
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

export function assertSameAnswers(got, expected, what) {
  assert.deepEqual(got.map((answer) => answer.text), expected.map((answer) => answer.text), what);
  got.forEach((answer, i) => answer.logprobs.forEach((logprob, j) => {
    assert.ok(Math.abs(logprob - expected[i].logprobs[j]) <= 1e-4, `${what}: logprob ${j} of answer ${i}`);
  }));
}
