// chat_page.mjs - the chat page of `dsv4 serve` (GET /) in Debian's chromium, headless,
// driven by puppeteer-core; run by tests/unit/test_webui.c against two servers on the demo
// model (models/kjv-v4-tiny):
//
//   node tests/webui/chat_page.mjs OPEN_URL KEY_URL KEY SCREENSHOT
//
// OPEN_URL: a server without an API key. The page loads with no console error and no failed
// request; a typed prompt streams an answer into the page, with the temperature and max
// tokens of the settings; the next turn re-sends the conversation; Stop ends a long
// generation (the answer stops growing, the page returns to idle, the next prompt is
// answered); a reload keeps the conversation. Then answers faked by request interception:
// markup in the answer (<script>, <img onerror>) is shown as text and runs nothing; reasoning
// and a tool call (its arguments streamed in pieces) are rendered. A screenshot goes to
// SCREENSHOT.
// KEY_URL: a server started with --api-key KEY. The page says a key is needed; once it is
// entered, requests carry "Authorization: Bearer KEY" and the answer streams; a reload keeps
// the key.
// Exit 0 when every check passed; otherwise each failure is printed and the exit is 1.
// CHROMIUM=PATH names the browser (default: chromium on PATH). Every wait is bounded, and the
// whole run too.
import { existsSync } from "node:fs";
import { join } from "node:path";
import puppeteer from "puppeteer-core";

const [openUrl, keyUrl, apiKey, shotPath] = process.argv.slice(2);
if (!shotPath) {
  console.error("usage: chat_page.mjs OPEN_URL KEY_URL KEY SCREENSHOT");
  process.exit(2);
}
const WAIT_MS = 60000;
setTimeout(() => {
  console.error("chat_page.mjs: the whole run took over 240 s");
  process.exit(1);
}, 240000);

const failures = [];
let checks = 0;
function check(ok, what) {
  checks++;
  if (!ok) failures.push(what);
}

const CHAT = "/v1/chat/completions";

// Console errors, page errors and failed requests of a page; `allow` filters expected ones.
function watch(page) {
  const w = { errors: [], allow: () => false };
  page.on("console", (m) => {
    if (m.type() === "error" && !w.allow(m.text())) w.errors.push("console: " + m.text());
  });
  page.on("pageerror", (e) => w.errors.push("page error: " + e.message));
  page.on("requestfailed", (r) => {
    const why = r.failure() ? r.failure().errorText : "?";
    if (!w.allow(why + " " + r.url())) w.errors.push("request failed: " + r.url() + " " + why);
  });
  page.on("response", (r) => {
    if (r.status() >= 400 && !w.allow(r.status() + " " + r.url()))
      w.errors.push("HTTP " + r.status() + " " + r.url());
  });
  return w;
}

const answerText = (page) =>
  page.$$eval(".msg.assistant .content", (els) => (els.length ? els[els.length - 1].textContent : ""));
const lastNote = (page) =>
  page.$$eval(".msg.assistant .note", (els) => (els.length ? els[els.length - 1].textContent : ""));
const idle = (page) => page.waitForSelector('body[data-state="idle"]', { timeout: WAIT_MS });

// Types a prompt, sends it with Enter and waits until its answer is in and the page is idle.
async function ask(page, text) {
  const before = await page.$$eval(".msg.assistant", (els) => els.length);
  await page.type("#prompt", text);
  await page.keyboard.press("Enter");
  await page.waitForFunction((n) => document.querySelectorAll(".msg.assistant").length > n &&
    document.body.dataset.state === "idle", { timeout: WAIT_MS }, before);
}

async function setField(page, id, value) {
  await page.$eval("#" + id, (e, v) => {
    e.value = v;
    e.dispatchEvent(new Event("change"));
  }, value);
}

// The JSON bodies of the chat requests the page sends.
function recordBodies(page) {
  const bodies = [];
  page.on("request", (r) => {
    if (r.url().endsWith(CHAT) && r.method() === "POST")
      bodies.push({ body: JSON.parse(r.postData() || "{}"), auth: r.headers().authorization });
  });
  return bodies;
}

async function openPage(browser, url, allow) {
  const page = await browser.newPage();
  page.setDefaultTimeout(WAIT_MS);
  await page.setViewport({ width: 1000, height: 900 });
  const w = watch(page);
  if (allow) w.allow = allow;
  await page.goto(url, { waitUntil: "networkidle0", timeout: WAIT_MS });
  return { page, w };
}

async function streamsAnswer(page, bodies) {
  await setField(page, "temperature", "0.5");
  await setField(page, "max-tokens", "40");
  await ask(page, "And God said");
  const a = await answerText(page);
  check(a.length >= 10 && /[a-z]/i.test(a), "the first answer streamed into the page: " + JSON.stringify(a));
  const b = bodies[bodies.length - 1];
  check(b && b.body.stream === true && b.body.temperature === 0.5 && b.body.max_tokens === 40,
    "the request carries stream, temperature 0.5 and max_tokens 40: " + JSON.stringify(b && b.body));
  check(b && b.body.model === "kjv-v4-tiny", "the request names the model from /v1/models");
  check(b && b.body.chat_template_kwargs && b.body.chat_template_kwargs.thinking === false,
    "the Thinking box, unticked, asks for chat mode");
  check(/finish: (stop|length)/.test(await lastNote(page)), "the turn ends with its finish reason");

  await ask(page, "And the earth");
  const m = bodies[bodies.length - 1].body.messages;
  check(m.length === 3 && m[0].content === "And God said" && m[1].role === "assistant" && m[1].content === a,
    "the second turn re-sends the conversation: " + JSON.stringify(m));
  check((await answerText(page)).length > 0, "the second answer streamed");
}

// A long generation (ignore_eos added on the way, so that the model cannot end it first),
// stopped once text has arrived. The body is changed by wrapping the page's fetch, not by
// request interception: Chromium does not always stream an intercepted response to the page
// (seen here: the whole answer arrived at once, after the generation had ended).
// CI saw the page show no text until 4000 tokens had ended, so Stop came too late: when the
// server streamed faster than the page took the chunks, the page's read loop ran on microtasks
// and never gave the browser a turn, and each chunk forced a layout (chat.html now yields every
// 50 ms and follows the end once a frame). The renderer is slowed 8x here to keep it behind the
// server; the budget is as long as the model's context allows.
const STOP_TOKENS = 4000;
async function stopWorks(page, w) {
  await setField(page, "max-tokens", String(STOP_TOKENS));
  await page.evaluate((chat) => {
    const plain = window.fetch;
    window.__plainFetch = plain;
    window.fetch = (url, opts) => {
      if (new URL(String(url), location.href).pathname === chat && opts && typeof opts.body === "string") {
        const body = JSON.parse(opts.body);
        body.ignore_eos = true;
        body.seed = 7;
        opts = Object.assign({}, opts, { body: JSON.stringify(body) });
      }
      return plain(url, opts);
    };
  }, CHAT);
  w.allow = (s) => /ERR_ABORTED/.test(s) && s.includes(CHAT);
  // a renderer slower than the server (CI saw 4000 tokens arrive faster than the page could
  // take them): the page must still show text and take the click while it streams
  await page.emulateCPUThrottling(8);
  await page.type("#prompt", "In the beginning");
  await page.click("#send");
  await page.waitForFunction(() => {
    const els = document.querySelectorAll(".msg.assistant .content");
    return els.length && els[els.length - 1].textContent.length > 40;
  }, { timeout: WAIT_MS, polling: 50 });
  check(await page.$eval("#stop", (b) => !b.disabled), "Stop is enabled while generating");
  // a DOM click rather than page.click: the answer grows and scrolls the page while the mouse
  // events are on their way, and a pointer aimed at the old position can miss the button
  await page.$eval("#stop", (b) => b.click());
  await idle(page);
  await page.emulateCPUThrottling(1);
  const n1 = (await answerText(page)).length;
  await new Promise((r) => setTimeout(r, 1500));
  const n2 = (await answerText(page)).length;
  check(n1 === n2 && n1 < STOP_TOKENS * 2, `the answer stopped growing after Stop (${n1} then ${n2} chars)`);
  check((await lastNote(page)) === "stopped", "the stopped turn says so: " + (await lastNote(page)));
  check(await page.$eval("#send", (b) => !b.disabled), "Send is enabled again after Stop");
  await page.evaluate(() => { window.fetch = window.__plainFetch; });
  w.allow = () => false;
  await setField(page, "max-tokens", "24");
  await ask(page, "And he said");
  check((await answerText(page)).length > 0, "the server answers after a stopped generation");
}

function sse(chunks) {
  const head = { id: "chatcmpl-fake", object: "chat.completion.chunk", created: 1, model: "kjv-v4-tiny" };
  return chunks.map((c) => "data: " + JSON.stringify({ ...head, choices: [c] }) + "\n\n").join("") + "data: [DONE]\n\n";
}

// Answers faked by interception: markup as text, reasoning and a tool call rendered.
async function fakedAnswers(page) {
  const evil = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">';
  const fakes = [
    sse([
      { index: 0, delta: { role: "assistant", content: "" }, finish_reason: null },
      { index: 0, delta: { content: evil.slice(0, 20) }, finish_reason: null },
      { index: 0, delta: { content: evil.slice(20) }, finish_reason: null },
      { index: 0, delta: {}, finish_reason: "stop" },
    ]),
    sse([
      { index: 0, delta: { role: "assistant", content: "" }, finish_reason: null },
      { index: 0, delta: { reasoning_content: "Weighing <b>the</b> question" }, finish_reason: null },
      { index: 0, delta: { content: "I will look it up." }, finish_reason: null },
      { index: 0, delta: { tool_calls: [{ index: 0, id: "call_1", type: "function",
        function: { name: "get_weather", arguments: '{"city": "<img src=x ' } }] }, finish_reason: null },
      { index: 0, delta: { tool_calls: [{ index: 0, function: { arguments: 'onerror=alert(1)>"}' } }] },
        finish_reason: null },
      { index: 0, delta: {}, finish_reason: "tool_calls" },
    ]),
  ];
  await page.setRequestInterception(true);
  const handler = (r) => {
    if (r.isInterceptResolutionHandled()) return;
    if (r.url().endsWith(CHAT) && r.method() === "POST" && fakes.length)
      r.respond({ status: 200, contentType: "text/event-stream", body: fakes.shift() });
    else r.continue();
  };
  page.on("request", handler);
  await ask(page, "Say something dangerous");
  check((await answerText(page)) === evil, "markup in the answer is shown as text: " + (await answerText(page)));
  const state = await page.evaluate(() => ({
    pwned: window.__pwned, imgs: document.querySelectorAll("#messages img, #messages script, #messages b").length,
  }));
  check(state.pwned === undefined && state.imgs === 0, "nothing the model wrote became markup or ran: " +
    JSON.stringify(state));

  await ask(page, "What is the weather?");
  const r = await page.$$eval(".msg.assistant", (els) => {
    const m = els[els.length - 1];
    const d = m.querySelector("details.reasoning");
    return {
      reasoningShown: d && !d.hidden, reasoning: d && d.querySelector(".text").textContent,
      content: m.querySelector(".content").textContent,
      name: (m.querySelector(".tool-name") || {}).textContent, args: (m.querySelector(".tool-args") || {}).textContent,
      note: m.querySelector(".note").textContent, markup: m.querySelectorAll("img, b, script").length,
    };
  });
  check(r.reasoningShown && r.reasoning === "Weighing <b>the</b> question", "reasoning is shown apart: " +
    JSON.stringify(r));
  check(r.content === "I will look it up.", "the answer beside the reasoning: " + r.content);
  check(r.name === "Tool call: get_weather", "the tool call's name: " + r.name);
  let args = null;
  try { args = JSON.parse(r.args); } catch (e) { /* checked below */ }
  check(args && args.city === "<img src=x onerror=alert(1)>", "the tool call's arguments, joined: " + r.args);
  check(r.markup === 0 && /finish: tool_calls/.test(r.note), "the tool call turn: no markup, its finish reason");
  await page.$eval("details.reasoning:not([hidden])", (d) => { d.open = true; }).catch(() => {});
  page.off("request", handler);
  await page.setRequestInterception(false);
}

async function openServer(browser) {
  const { page, w } = await openPage(browser, openUrl);
  check((await page.title()) === "dsv4 chat", "the page's title");
  await page.waitForFunction(() => document.getElementById("model").textContent === "kjv-v4-tiny",
    { timeout: WAIT_MS }).catch(() => {});
  check((await page.$eval("#model", (e) => e.textContent)) === "kjv-v4-tiny", "the model's name from /v1/models");
  check(w.errors.length === 0, "the page loads with no console error and no failed request: " + w.errors.join("; "));
  const bodies = recordBodies(page);
  await streamsAnswer(page, bodies);
  await stopWorks(page, w);

  const turns = await page.$$eval(".msg", (els) => els.length);
  await page.reload({ waitUntil: "networkidle0", timeout: WAIT_MS });
  check((await page.$$eval(".msg", (els) => els.length)) === turns, `a reload keeps the conversation (${turns} turns)`);

  await fakedAnswers(page);
  await page.click("#toggle-settings"); // the screenshot shows the settings too
  await page.$eval("#scroller", (s) => { s.scrollTop = s.scrollHeight; });
  await page.screenshot({ path: shotPath });
  check(w.errors.length === 0, "no console error or failed request on the page: " + w.errors.join("; "));
  await page.close();
}

async function keyServer(browser) {
  // the page's first /v1/models, before the key is set, is a 401
  const { page, w } = await openPage(browser, keyUrl, (s) => /\b401\b/.test(s));
  await page.waitForSelector("#banner.show", { timeout: WAIT_MS });
  check(/API key/.test(await page.$eval("#banner", (e) => e.textContent)), "the page asks for the API key");
  const bodies = recordBodies(page);
  await page.click("#toggle-settings");
  await page.type("#key", apiKey);
  await page.$eval("#key", (e) => e.dispatchEvent(new Event("change")));
  await page.waitForFunction(() => document.getElementById("model").textContent === "kjv-v4-tiny",
    { timeout: WAIT_MS }).catch(() => {});
  check(!(await page.$eval("#banner", (e) => e.classList.contains("show"))), "the banner goes once the key is set");
  await setField(page, "max-tokens", "24");
  await ask(page, "And God said");
  check(bodies.length === 1 && bodies[0].auth === "Bearer " + apiKey, "the request carries the key: " +
    JSON.stringify(bodies.map((b) => b.auth)));
  check((await answerText(page)).length > 0, "an answer with the key");
  await page.reload({ waitUntil: "networkidle0", timeout: WAIT_MS });
  check((await page.$eval("#key", (e) => e.value)) === apiKey, "a reload keeps the key (localStorage)");
  check(w.errors.length === 0, "no unexpected error on the key server's page: " + w.errors.join("; "));
  await page.close();
}

function chromium() {
  if (process.env.CHROMIUM) return process.env.CHROMIUM;
  const dir = (process.env.PATH || "").split(":").find((d) => d && existsSync(join(d, "chromium")));
  return dir ? join(dir, "chromium") : "/usr/bin/chromium";
}

const browser = await puppeteer.launch({
  executablePath: chromium(),
  headless: true,
  timeout: WAIT_MS,
  protocolTimeout: WAIT_MS,
  // root in a container: no sandbox; no GPU, no /dev/shm assumptions
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check"],
});
try {
  await openServer(browser);
  await keyServer(browser);
} catch (e) {
  failures.push("exception: " + (e && e.stack ? e.stack : e));
} finally {
  await browser.close().catch(() => {});
}
for (const f of failures) console.log("FAIL " + f);
console.log(`chat_page.mjs: ${checks} checks, ${failures.length} failed`);
process.exit(failures.length ? 1 : 0);
