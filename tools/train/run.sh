#!/bin/sh
# run.sh - the demo model from nothing: text, tokenizer, training, export, test fixtures and
# the model card's figures. Run from the repository root; needs Debian's bible-kjv,
# python3-torch, python3-numpy, python3-regex and a built ./dsv4 (make).
#
#   tools/train/run.sh                 everything (training: ~45 min of one idle core)
#   STEPS=200 tools/train/run.sh       a quick smoke run (writes the same files!)
#
# Training resumes from $OUT/run/ckpt.pt when one exists (same options = same result).
set -eu
OUT=${OUT:-build-train}
MODEL=${MODEL:-models/kjv-v4-tiny}
STEPS=${STEPS:-1700}
SEED=${SEED:-1234}
PY=/usr/bin/python3
T=tools/train

$PY $T/kjv.py --out "$OUT"
$PY $T/bpe.py train --text "$OUT/train.txt" --vocab 4096 --out "$OUT/tokenizer.json"
$PY $T/train.py --data "$OUT" --out "$OUT/run" --seed "$SEED" --steps "$STEPS" --batch 3 --seq 512 --eval-every 200
$PY $T/export.py --ckpt "$OUT/run/final.pt" --tokenizer "$OUT/tokenizer.json" --out "$MODEL"
./dsv4 inspect -m "$MODEL" | tail -1
$PY $T/make_fixture.py --model "$MODEL" --heldout "$OUT/heldout.txt" --out tests/demo

# Held-out perplexity (ctx 512): float model, quantised model under the reference and under
# dsv4, and the KL divergence of dsv4 from both.
$PY $T/eval_ppl.py --float "$OUT/run/final.pt" --tokenizer "$OUT/tokenizer.json" -f "$OUT/heldout.txt" \
    --ctx 512 --save-logits "$OUT/float.lgt"
$PY $T/eval_ppl.py --ref "$MODEL" -f "$OUT/heldout.txt" --ctx 512 --save-logits "$OUT/ref.lgt"
./dsv4 perplexity -m "$MODEL" -f "$OUT/heldout.txt" --ctx 512 --kl-base "$OUT/ref.lgt"
./dsv4 perplexity -m "$MODEL" -f "$OUT/heldout.txt" --ctx 512 --kl-base "$OUT/float.lgt"
