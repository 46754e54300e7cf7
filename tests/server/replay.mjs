// replay.mjs - a local HTTP server that answers every POST with canned bodies dsv4's output
// code wrote (used by openai_client.mjs and anthropic_client.mjs): the SSE text when the
// request asked for a stream, the whole JSON body otherwise. Resolves to {port, close}.
import http from 'node:http';

export async function startReplay(wholeBody, sseBody) {
    const server = http.createServer((req, res) => {
        let body = '';
        req.on('data', (d) => { body += d; });
        req.on('end', () => {
            const streamed = JSON.parse(body).stream === true;
            res.writeHead(200, { 'content-type': streamed ? 'text/event-stream' : 'application/json' });
            res.end(streamed ? sseBody : wholeBody);
        });
    });
    await new Promise((ok) => server.listen(0, '127.0.0.1', ok));
    return { port: server.address().port, close: () => server.close() };
}
