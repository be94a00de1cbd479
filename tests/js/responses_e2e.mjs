// /v1/responses through the official openai client's responses.create on the default model (beam-nano): the
// weather tool called as a function_call item and answered from its function_call_output, streaming events that
// build the same items as the non-streaming response, and each answer equal to what /v1/chat/completions gives
// for the equivalent chat request (the two endpoints share the Harmony path, so greedy outputs must agree).
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';
import OpenAI from 'openai';
import { postJson, startServer } from './server_harness.mjs';

const repoRoot = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const MODEL = 'beam-nano';
const weather = {
  name: 'get_weather',
  description: 'Get the current weather for a city.',
  parameters: {
    type: 'object',
    properties: { city: { type: 'string', description: 'The city name, e.g. Paris' } },
    required: ['city'],
  },
};
const responseTools = [{ type: 'function', ...weather }];
const chatTools = [{ type: 'function', function: weather }];
const QUESTION = "What's the weather in Paris?";
const RESULT = JSON.stringify({ temperature: 17, unit: 'celsius', conditions: 'light rain' });

// The output items without their random ids, for comparing two responses to one request.
const withoutIds = (items) => items.map(({ id, call_id: callId, ...rest }) => rest);

// Reads a streamed response: checks the event order rules and rebuilds the output items from the deltas alone.
async function readEvents(stream) {
  const events = [];
  for await (const event of stream) events.push(event);
  events.forEach((event, i) => assert.equal(event.sequence_number, i, 'sequence numbers count up from 0'));
  assert.equal(events[0].type, 'response.created');
  assert.equal(events[0].response.status, 'in_progress');
  assert.equal(events[1].type, 'response.in_progress');
  const last = events.at(-1);
  assert.ok(['response.completed', 'response.incomplete'].includes(last.type), last.type);
  const built = [];
  for (const event of events.slice(2, -1)) {
    switch (event.type) {
      case 'response.output_item.added':
        assert.equal(event.output_index, built.length, 'items are added in order');
        built.push({ item: event.item, text: '' });
        break;
      case 'response.output_text.delta':
      case 'response.reasoning_text.delta':
      case 'response.function_call_arguments.delta':
        assert.equal(event.output_index, built.length - 1, 'deltas go to the open item');
        assert.equal(event.item_id, built.at(-1).item.id);
        built.at(-1).text += event.delta;
        break;
      case 'response.output_text.done':
      case 'response.reasoning_text.done':
        assert.equal(event.text, built.at(-1).text, 'the done text is the deltas joined');
        break;
      case 'response.function_call_arguments.done':
        assert.equal(event.arguments, built.at(-1).text, 'the done arguments are the deltas joined');
        break;
      case 'response.output_item.done':
        assert.equal(event.output_index, built.length - 1);
        assert.equal(event.item.status, 'completed');
        built.at(-1).done = event.item;
        break;
      case 'response.content_part.added':
      case 'response.content_part.done':
        break;
      default:
        assert.fail(`unexpected event ${event.type}`);
    }
  }
  assert.ok(built.every((entry) => entry.done), 'every added item is done');
  assert.deepEqual(last.response.output, built.map((entry) => entry.done));
  return { events, response: last.response };
}

describe('/v1/responses on beam-nano', () => {
  let server;
  let client;

  before(async () => {
    server = await startServer(null, [], { cwd: repoRoot });
    client = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
  });

  after(async () => {
    const { code } = await server.stop();
    assert.equal(code, 0, `server exit code after SIGTERM\n${server.log()}`);
  });

  test('a function call, then the answer from its output; both equal the chat endpoint\'s', async () => {
    const first = await client.responses.create({
      model: MODEL, input: QUESTION, tools: responseTools, temperature: 0, max_output_tokens: 200,
    });
    assert.equal(first.object, 'response');
    assert.match(first.id, /^resp_/);
    assert.equal(first.status, 'completed', JSON.stringify(first));
    const call = first.output.find((item) => item.type === 'function_call');
    assert.ok(call, JSON.stringify(first.output));
    assert.equal(call.name, 'get_weather');
    assert.match(call.call_id, /^call_/);
    assert.match(call.id, /^fc_/);
    assert.match(JSON.parse(call.arguments).city, /Paris/);

    const chat = await client.chat.completions.create({
      model: MODEL, messages: [{ role: 'user', content: QUESTION }], tools: chatTools, temperature: 0, max_tokens: 200,
    });
    const message = chat.choices[0].message;
    assert.equal(message.tool_calls[0].function.arguments, call.arguments);
    const reasoning = first.output.filter((item) => item.type === 'reasoning');
    assert.equal(reasoning.map((item) => item.content[0].text).join('\n') || undefined, message.reasoning_content ?? undefined);
    assert.equal(first.usage.input_tokens, chat.usage.prompt_tokens);
    assert.equal(first.usage.output_tokens, chat.usage.completion_tokens);
    assert.equal(first.usage.total_tokens, first.usage.input_tokens + first.usage.output_tokens);
    assert.ok(first.usage.output_tokens_details.reasoning_tokens <= first.usage.output_tokens);
    assert.equal(first.usage.output_tokens_details.reasoning_tokens > 0, reasoning.length > 0);

    // The tool's result goes back as a function_call_output item after the model's own items.
    const second = await client.responses.create({
      model: MODEL, tools: responseTools, temperature: 0, max_output_tokens: 200,
      input: [{ role: 'user', content: QUESTION }, ...first.output,
              { type: 'function_call_output', call_id: call.call_id, output: RESULT }],
    });
    assert.equal(second.status, 'completed', JSON.stringify(second));
    assert.match(second.output_text, /light rain/i, 'the SDK\'s output_text joins the message items');
    assert.match(second.output_text, /Paris/);
    const chatSecond = await client.chat.completions.create({
      model: MODEL, tools: chatTools, temperature: 0, max_tokens: 200,
      messages: [{ role: 'user', content: QUESTION }, message,
                 { role: 'tool', tool_call_id: message.tool_calls[0].id, content: RESULT }],
    });
    assert.equal(second.output_text, chatSecond.choices[0].message.content);
  });

  test('streaming events build the same items as the non-streaming response', async () => {
    const request = { model: MODEL, input: QUESTION, tools: responseTools, temperature: 0, max_output_tokens: 200 };
    const whole = await client.responses.create(request);
    const { response } = await readEvents(await client.responses.create({ ...request, stream: true }));
    assert.equal(response.status, 'completed');
    assert.deepEqual(withoutIds(response.output), withoutIds(whole.output));
    assert.deepEqual(response.usage, whole.usage);

    const plain = { model: MODEL, input: 'Say hello.', instructions: 'Answer in one sentence.', temperature: 0,
                    max_output_tokens: 100 };
    const plainWhole = await client.responses.create(plain);
    const streamed = await readEvents(await client.responses.create({ ...plain, stream: true }));
    assert.equal(streamed.response.output.filter((i) => i.type === 'message').map((i) => i.content[0].text).join(''),
                 plainWhole.output_text);
    assert.equal(plainWhole.instructions, 'Answer in one sentence.');
  });

  test('max_output_tokens cuts the response: status incomplete, streaming and not', async () => {
    const request = { model: MODEL, input: 'Tell me a long story about a river.', temperature: 0, max_output_tokens: 5 };
    const whole = await client.responses.create(request);
    assert.equal(whole.status, 'incomplete');
    assert.deepEqual(whole.incomplete_details, { reason: 'max_output_tokens' });
    assert.equal(whole.usage.output_tokens, 5);
    const { events, response } = await readEvents(await client.responses.create({ ...request, stream: true }));
    assert.equal(events.at(-1).type, 'response.incomplete');
    assert.equal(response.usage.output_tokens, 5);
  });

  test('messages as input items, roles and content parts', async () => {
    const response = await client.responses.create({
      model: MODEL, temperature: 0, max_output_tokens: 60, reasoning: { effort: 'low' },
      input: [{ role: 'developer', content: 'Be brief.' },
              { role: 'user', content: [{ type: 'input_text', text: 'Name a colour.' }] }],
    });
    assert.equal(response.reasoning.effort, 'low');
    const chat = await client.chat.completions.create({
      model: MODEL, temperature: 0, max_tokens: 60, reasoning_effort: 'low',
      messages: [{ role: 'developer', content: 'Be brief.' }, { role: 'user', content: 'Name a colour.' }],
    });
    assert.equal(response.output_text, chat.choices[0].message.content ?? '');
  });

  test('bad requests are OpenAI errors naming the field', async () => {
    const cases = [
      [{ model: MODEL, input: 'x', tools: [{ type: 'web_search_preview' }] }, 400, /^tools/],
      [{ model: MODEL, input: 'x', previous_response_id: 'resp_1' }, 400, /^previous_response_id$/],
      [{ model: MODEL, input: [{ type: 'function_call_output', call_id: 'call_x', output: 'r' }] }, 400, /^input/],
      [{ model: MODEL, input: 'x', max_output_tokens: 0 }, 400, /^max_output_tokens$/],
      [{ model: MODEL, input: 'x', max_output_tokens: 1e9 }, 400, /^max_output_tokens$/],
      [{ model: MODEL, input: 'x', reasoning: { effort: 'extreme' } }, 400, /^reasoning\.effort$/],
      [{ model: MODEL, input: 'x', tool_choice: { type: 'function', name: 'nope' }, tools: responseTools }, 400, /^tool_choice$/],
      [{ model: MODEL }, 400, /^input$/],
      [{ model: 'other', input: 'x' }, 404, /^model$/],
    ];
    for (const [body, status, param] of cases) {
      await assert.rejects(client.responses.create(body), (error) => {
        assert.equal(error.status, status, `${JSON.stringify(body)}: ${error.message}`);
        assert.match(error.param ?? '', param, `${JSON.stringify(body)}: ${error.message}`);
        return true;
      });
    }
    const raw = await postJson(server.base, '/v1/responses', '{"input": ');
    assert.equal(raw.status, 400);
    assert.equal(raw.json.error.type, 'invalid_request_error');
  });
});
