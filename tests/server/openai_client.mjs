// openai_client.mjs - the official OpenAI Node client against `dsv4 serve` (run by the
// server test group: node tests/server/openai_client.mjs BASE_URL MODEL CANNED_DIR).
//
// Against the live server: models.list, chat (whole and streamed, same text), a request
// with tools, completions, and an error raised as the client's typed exception. Tool
// calls cannot come from a random-weight model, so they are checked on canned answers
// that dsv4's own output code produced (CANNED_DIR, written by the C test): a small local
// HTTP server replays them and the client must parse the tool calls, in a whole response
// and by accumulating streamed deltas (chat.completions.stream().finalChatCompletion()).
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { startReplay } from './replay.mjs';
import OpenAI from 'openai';

const [baseURL, model, canned] = process.argv.slice(2);
if (!baseURL || !model || !canned) {
    console.error('usage: node openai_client.mjs BASE_URL MODEL CANNED_DIR');
    process.exit(2);
}
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
const messages = [{ role: 'user', content: 'hello there, tell me about rivers' }];

// models
const models = await client.models.list();
assert.equal(models.data[0].id, model);

// chat, whole
const whole = await client.chat.completions.create({ model, messages, max_tokens: 16, temperature: 0, seed: 1 });
assert.equal(whole.object, 'chat.completion');
assert.equal(whole.choices[0].message.role, 'assistant');
assert.equal(typeof whole.choices[0].message.content, 'string');
assert.ok(['stop', 'length'].includes(whole.choices[0].finish_reason));
assert.ok(whole.usage.prompt_tokens > 0 && whole.usage.completion_tokens > 0);

// chat, streamed: the same text
const stream = await client.chat.completions.create({
    model, messages, max_tokens: 16, temperature: 0, seed: 1, stream: true, stream_options: { include_usage: true },
});
let text = '', usage = null, finish = null;
for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    const c = chunk.choices[0];
    if (!c) continue;
    text += c.delta?.content ?? '';
    if (c.finish_reason) finish = c.finish_reason;
}
assert.equal(text, whole.choices[0].message.content);
assert.equal(finish, whole.choices[0].finish_reason);
assert.equal(usage.completion_tokens, whole.usage.completion_tokens);

// tools are accepted and rendered (a random model will not call them)
const tools = [{
    type: 'function',
    function: {
        name: 'get_weather', description: 'Weather for a city',
        parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } }, required: ['city'] },
    },
}];
const withTools = await client.chat.completions.create({ model, messages, tools, tool_choice: 'auto', max_tokens: 8 });
assert.ok(withTools.choices[0].finish_reason);

// completions
const comp = await client.completions.create({ model, prompt: 'the river of light', max_tokens: 6, temperature: 0 });
assert.equal(comp.object, 'text_completion');
assert.equal(typeof comp.choices[0].text, 'string');

// errors arrive as typed exceptions with the status
const two = await client.chat.completions.create({ model, messages, n: 2, max_tokens: 6, seed: 3 });
assert.equal(two.choices.length, 2);
assert.deepEqual(two.choices.map((c) => c.index), [0, 1]);
await assert.rejects(
    client.chat.completions.create({ model, messages, n: 17 }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && /'n'/.test(e.message));
await assert.rejects(
    client.chat.completions.create({ model: 'no-such-model', messages }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400);

// responses, whole and streamed (the same text), and a second turn by previous_response_id
// (the stream's final response has no output_text convenience field: the text is read off the items)
const textOf = (r) => r.output.filter((i) => i.type === 'message').flatMap((i) => i.content)
    .filter((c) => c.type === 'output_text').map((c) => c.text).join('');
const r1 = await client.responses.create({ model, input: 'tell me about rivers', instructions: 'Be brief.',
    max_output_tokens: 12, temperature: 0 });
assert.equal(r1.object, 'response');
assert.ok(['completed', 'incomplete'].includes(r1.status));
assert.equal(typeof r1.output_text, 'string');
const rs = client.responses.stream({ model, input: 'tell me about rivers', instructions: 'Be brief.',
    max_output_tokens: 12, temperature: 0 });
let rdeltas = '';
rs.on('response.output_text.delta', (e) => { rdeltas += e.delta; });
const rfinal = await rs.finalResponse();
assert.equal(textOf(rfinal), r1.output_text);
assert.equal(textOf(r1), r1.output_text);
assert.equal(rdeltas, r1.output_text);
const r2 = await client.responses.create({ model, previous_response_id: r1.id, input: 'and then?', max_output_tokens: 4 });
assert.equal(r2.previous_response_id, r1.id);
assert.ok(r2.usage.input_tokens > r1.usage.input_tokens);
await assert.rejects(
    client.responses.create({ model, previous_response_id: 'resp_nope', input: 'x' }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400);

// tool calls, from dsv4's canned answers
const wholeBody = fs.readFileSync(`${canned}/tool_whole.json`, 'utf8');
const sseBody = fs.readFileSync(`${canned}/tool_stream.sse`, 'utf8');
const replay = await startReplay(wholeBody, sseBody);
const replayClient = new OpenAI({ baseURL: `http://127.0.0.1:${replay.port}/v1`, apiKey: 'x', maxRetries: 0 });
const expectCalls = (calls) => {
    assert.equal(calls.length, 2);
    assert.equal(calls[0].type, 'function');
    assert.equal(calls[0].function.name, 'get_weather');
    assert.deepEqual(JSON.parse(calls[0].function.arguments), { city: 'Paris', days: 3 });
    assert.equal(calls[1].function.name, 'get_time');
    assert.deepEqual(JSON.parse(calls[1].function.arguments), { tz: 'CET' });
    assert.ok(calls[0].id && calls[1].id && calls[0].id !== calls[1].id);
};
try {
    const tw = await replayClient.chat.completions.create({ model, messages, tools });
    assert.equal(tw.choices[0].finish_reason, 'tool_calls');
    assert.equal(tw.choices[0].message.content, 'Let me check.');
    assert.equal(tw.choices[0].message.reasoning_content, 'The user wants two things.');
    expectCalls(tw.choices[0].message.tool_calls);

    const runner = replayClient.chat.completions.stream({ model, messages, tools });
    const final = await runner.finalChatCompletion();
    assert.equal(final.choices[0].finish_reason, 'tool_calls');
    assert.equal(final.choices[0].message.content, 'Let me check.');
    expectCalls(final.choices[0].message.tool_calls);
} finally {
    replay.close();
}

// function calls through the Responses API, from canned answers
const replay2 = await startReplay(fs.readFileSync(`${canned}/responses_whole.json`, 'utf8'),
    fs.readFileSync(`${canned}/responses_stream.sse`, 'utf8'));
const replayClient2 = new OpenAI({ baseURL: `http://127.0.0.1:${replay2.port}/v1`, apiKey: 'x', maxRetries: 0 });
const expectItems = (r) => {
    assert.equal(textOf(r), 'Let me check.');
    const calls = r.output.filter((i) => i.type === 'function_call');
    assert.equal(calls.length, 2);
    assert.equal(calls[0].name, 'get_weather');
    assert.deepEqual(JSON.parse(calls[0].arguments), { city: 'Paris', days: 3 });
    assert.equal(calls[1].name, 'get_time');
    assert.ok(calls[0].call_id && calls[0].call_id !== calls[1].call_id);
    const reasoning = r.output.find((i) => i.type === 'reasoning');
    assert.equal(reasoning.content[0].text, 'The user wants two things.');
};
try {
    expectItems(await replayClient2.responses.create({ model, input: 'weather?' }));
    expectItems(await replayClient2.responses.stream({ model, input: 'weather?' }).finalResponse());
} finally {
    replay2.close();
}
console.log('openai client: ok');
