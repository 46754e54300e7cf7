// constrained_client.mjs - constrained output against `dsv4 serve`, checked by a JSON Schema
// validator that is not dsv4's (ajv): node tests/server/constrained_client.mjs BASE_URL MODEL.
//
// 30 sampled chat completions with response_format json_schema (strict), 5 with
// json_object, and 5 Responses API answers with text.format json_schema, through the
// official OpenAI client: every answer must finish (finish_reason "stop" / status
// "completed"), parse, and validate. Then 10 forced calls of a strict tool and 5 unforced
// turns (the model may call or answer): every call's arguments must validate against the
// tool's parameters.
import assert from 'node:assert/strict';
import Ajv from 'ajv';
import OpenAI from 'openai';

const [baseURL, model] = process.argv.slice(2);
if (!baseURL || !model) {
    console.error('usage: node constrained_client.mjs BASE_URL MODEL');
    process.exit(2);
}
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
// sanitizer builds of the server are 10-50x slower: fewer requests of each kind
const small = process.env.DSV4_TEST_SCALE === 'small';
const count = (n) => (small ? Math.max(2, Math.ceil(n / 5)) : n);
const schema = {
    type: 'object',
    properties: {
        kind: { enum: ['river', 'sea', 'hill'] },
        count: { type: 'integer' },
        ok: { type: 'boolean' },
        name: { type: 'string', maxLength: 8 },
        tags: { type: 'array', items: { enum: ['a', 'b', null] }, maxItems: 3 },
        depth: { type: ['number', 'null'] },
    },
    required: ['kind', 'count', 'ok', 'name', 'tags', 'depth'],
    additionalProperties: false,
};
const validate = new Ajv({ strict: false }).compile(schema);
const messages = [{ role: 'user', content: 'describe a place as JSON' }];

for (let i = 0; i < count(30); i++) {
    const r = await client.chat.completions.create({
        model, messages, max_tokens: 1200, temperature: 1, seed: i,
        response_format: { type: 'json_schema', json_schema: { name: 'place', strict: true, schema } },
    });
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'stop', `completion ${i} did not finish: ${c.message.content}`);
    const v = JSON.parse(c.message.content);
    assert.ok(validate(v), `completion ${i}: ${c.message.content}: ${JSON.stringify(validate.errors)}`);
}
for (let i = 0; i < count(5); i++) {
    const r = await client.chat.completions.create({
        model, messages, max_tokens: 1200, temperature: 1, seed: 100 + i, response_format: { type: 'json_object' },
    });
    const text = r.choices[0].message.content;
    if (r.choices[0].finish_reason === 'stop') {
        const v = JSON.parse(text);
        assert.ok(v && typeof v === 'object' && !Array.isArray(v), `json_object ${i}: ${text}`);
    } else {
        assert.equal(r.choices[0].finish_reason, 'length'); // an object may be longer than max_tokens
    }
}
for (let i = 0; i < count(5); i++) {
    const r = await client.responses.create({
        model, input: 'describe a place as JSON', max_output_tokens: 1200, temperature: 1,
        text: { format: { type: 'json_schema', name: 'place', strict: true, schema } },
    });
    assert.equal(r.status, 'completed', `response ${i}: ${r.status}: ${r.output_text}`);
    const v = JSON.parse(r.output_text);
    assert.ok(validate(v), `response ${i}: ${r.output_text}: ${JSON.stringify(validate.errors)}`);
}
// strict tools under a forced call: the arguments fit the tool's schema
const params = {
    type: 'object',
    properties: { city: { type: 'string', maxLength: 10 }, days: { type: 'integer' }, units: { enum: ['c', 'f'] } },
    required: ['city', 'days', 'units'],
    additionalProperties: false,
};
const validArgs = new Ajv({ strict: false }).compile(params);
const tools = [{ type: 'function', function: { name: 'get_weather', strict: true, parameters: params } }];
for (let i = 0; i < count(10); i++) {
    const r = await client.chat.completions.create({
        model, messages, tools, tool_choice: 'required', max_tokens: 600, temperature: 1, seed: 200 + i,
    });
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'tool_calls', `strict call ${i}: ${JSON.stringify(c.message)}`);
    assert.ok(c.message.tool_calls.length >= 1);
    for (const call of c.message.tool_calls) {
        assert.equal(call.function.name, 'get_weather');
        assert.ok(validArgs(JSON.parse(call.function.arguments)), `strict call ${i}: ${call.function.arguments}`);
    }
}
for (let i = 0; i < count(5); i++) {
    const r = await client.chat.completions.create({ model, messages, tools, max_tokens: 300, temperature: 1, seed: 300 + i });
    for (const call of r.choices[0].message.tool_calls ?? [])
        assert.ok(validArgs(JSON.parse(call.function.arguments)), `unforced call ${i}: ${call.function.arguments}`);
}
console.log('constrained client: ok');
