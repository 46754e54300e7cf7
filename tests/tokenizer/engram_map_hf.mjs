// engram_map_hf.mjs - the DeepSeek-V4.1 Engram token map computed with the Hugging Face tokenizers
// library itself (the npm `tokenizers` package: the Rust library behind a node binding), the way
// the official inference/engram.py build_compressed_token_map calls it (docs/ENGRAM.md, "The
// token map"). tests/unit/test_engram_map.c compares dsv4's map with it.
//
//   node engram_map_hf.mjs TOKENIZER_JSON     prints {"compressed_vocab": C, "map": [...]}
//
// The normalizer Sequence of engram.py is given to the library as a tokenizer.json "normalizer"
// (the binding's own replace() takes no regex); the decode and id_to_token are the library's.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const { Tokenizer } = require("tokenizers");

const SENTINEL = "\ue000";
const NORMALIZER = {
  type: "Sequence",
  normalizers: [
    { type: "NFKC" },
    { type: "NFD" },
    { type: "StripAccents" },
    { type: "Lowercase" },
    { type: "Replace", pattern: { Regex: "[ \t\r\n]+" }, content: " " },
    { type: "Replace", pattern: { Regex: "^ $" }, content: SENTINEL },
    { type: "Strip", strip_left: true, strip_right: true },
    { type: "Replace", pattern: { String: SENTINEL }, content: " " },
  ],
};

// The engram normalizer, loaded through a copy of the tokenizer that carries it.
function engramNormalizer(doc) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "engram-map-"));
  const file = path.join(dir, "tokenizer.json");
  fs.writeFileSync(file, JSON.stringify({ ...doc, normalizer: NORMALIZER }));
  const normalizer = Tokenizer.fromFile(file).getNormalizer();
  fs.rmSync(dir, { recursive: true });
  return normalizer;
}

async function main(file) {
  const tok = Tokenizer.fromFile(file);
  const normalizer = engramNormalizer(JSON.parse(fs.readFileSync(file, "utf8")));
  const keyToNew = new Map();
  const map = [];
  for (let id = 0; id < tok.getVocabSize(true); id++) {
    const text = await tok.decode([id], false);
    let key = tok.idToToken(id); // a partial UTF-8 byte token keeps its raw form
    if (!text.includes("\ufffd")) key = normalizer.normalizeString(text) || text;
    if (!keyToNew.has(key)) keyToNew.set(key, keyToNew.size);
    map.push(keyToNew.get(key));
  }
  process.stdout.write(JSON.stringify({ compressed_vocab: keyToNew.size, map }) + "\n");
}

await main(process.argv[2]);
