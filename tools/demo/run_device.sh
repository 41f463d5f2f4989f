#!/bin/bash
# Full latent-demo pipeline on the GPU machine (one call): corpus -> train -> export -> eval + fixtures.
# The tokenizer (models/latent-demo/tokenizer.json) is trained beforehand on the CPU with train_tokenizer.py.
# usage: OUT=/some/dir tools/demo/run_device.sh [TRAIN_SECONDS]
set -euo pipefail
SECONDS_TRAIN=${1:-280}
PY=${PY:-python3}
OUT=${OUT:?}
mkdir -p build "$OUT/ckpt"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/device.txt" || true
$PY -c "import torch, transformers, tokenizers; print(torch.__version__, transformers.__version__, tokenizers.__version__)" | tee -a "$OUT/device.txt"
$PY tools/demo/make_corpus.py build/demo-data --seed 1234 2>&1 | tee "$OUT/train.log"
$PY -u tools/demo/train.py build/demo-data models/latent-demo "$OUT/ckpt" --seconds "$SECONDS_TRAIN" --seed 0 \
    --bs 128 --lr 1e-3 2>&1 | tee -a "$OUT/train.log"
$PY -u tools/demo/export.py "$OUT/ckpt" models/latent-demo models/latent-demo 2>&1 | tee -a "$OUT/train.log"
# the exported model comes back even if an evaluation below fails
tar czf "$OUT/model.tar.gz" models/latent-demo/config.json models/latent-demo/generation_config.json \
    models/latent-demo/model.safetensors models/latent-demo/chat_template.jinja
$PY -u tools/demo/eval_fixtures.py "$OUT/ckpt" models/latent-demo build/demo-data tests/golden/latent-demo 2>&1 \
    | tee -a "$OUT/train.log"
$PY -u tools/demo/eval_tools.py models/latent-demo build/demo-data tests/golden/latent-demo/tool_accuracy.json 2>&1 \
    | tee -a "$OUT/train.log" || echo "eval_tools failed" | tee -a "$OUT/train.log"
cp build/demo-data/eval.json "$OUT/eval.json"
tar czf "$OUT/results.tar.gz" models/latent-demo/config.json models/latent-demo/generation_config.json \
    models/latent-demo/model.safetensors models/latent-demo/chat_template.jinja tests/golden/latent-demo
ls -la "$OUT" "$OUT/ckpt"
