#!/bin/bash
# Full latent-demo pipeline on the GPU machine (one call): corpus -> train -> export -> eval + fixtures.
# The tokenizer (models/latent-demo/tokenizer.json) is trained beforehand on the CPU with train_tokenizer.py.
# usage: OUT=/some/dir tools/demo/run_device.sh [TRAIN_SECONDS]
# What lands in $OUT stays small (the device tool brings back at most 8 files of 16 MiB): device.txt, train.log,
# model.tar.gz (right after export), fixtures.tar.gz (after eval_fixtures), results.tar.gz (at the end). The fp32
# checkpoint stays in $CKPT (build/demo-ckpt).
set -euo pipefail
SECONDS_TRAIN=${1:-280}
PY=${PY:-python3}
OUT=${OUT:?}
CKPT=${CKPT:-build/demo-ckpt}
mkdir -p build "$OUT" "$CKPT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/device.txt" || true
$PY -c "import torch, transformers, tokenizers; print(torch.__version__, transformers.__version__, tokenizers.__version__)" | tee -a "$OUT/device.txt"
$PY tools/demo/make_corpus.py build/demo-data --seed 1234 ${CORPUS_ARGS:-} 2>&1 | tee "$OUT/train.log"
# TRAIN_ARGS: the default continues from the committed model (warm start), sparse from the start, QAT from 65 %;
# TRAIN_ARGS="--lr 1e-3" trains from scratch as the first model was.
TRAIN_ARGS=${TRAIN_ARGS:---init models/latent-demo --lr 7e-4 --warmup-steps 50 --dense-frac 0 --qat-frac 0.65}
# shellcheck disable=SC2086
$PY -u tools/demo/train.py build/demo-data models/latent-demo "$CKPT" --seconds "$SECONDS_TRAIN" --seed 0 \
    --bs 128 $TRAIN_ARGS 2>&1 | tee -a "$OUT/train.log"
$PY -u tools/demo/export.py "$CKPT" models/latent-demo models/latent-demo 2>&1 | tee -a "$OUT/train.log"
# the exported model comes back even if an evaluation below fails
tar czf "$OUT/model.tar.gz" models/latent-demo/config.json models/latent-demo/generation_config.json \
    models/latent-demo/model.safetensors models/latent-demo/chat_template.jinja
$PY -u tools/demo/eval_fixtures.py "$CKPT" models/latent-demo build/demo-data tests/golden/latent-demo 2>&1 \
    | tee -a "$OUT/train.log"
tar czf "$OUT/fixtures.tar.gz" tests/golden/latent-demo
$PY -u tools/demo/eval_tools.py models/latent-demo build/demo-data tests/golden/latent-demo/tool_accuracy.json 2>&1 \
    | tee -a "$OUT/train.log" || echo "eval_tools failed" | tee -a "$OUT/train.log"
tar czf "$OUT/results.tar.gz" models/latent-demo/config.json models/latent-demo/generation_config.json \
    models/latent-demo/model.safetensors models/latent-demo/chat_template.jinja tests/golden/latent-demo
ls -la "$OUT" "$CKPT"
