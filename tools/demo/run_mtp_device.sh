#!/bin/bash
# The demo model's MTP layer on the GPU machine, one call (about 5 minutes on one H200): corpus -> train_mtp.py
# (main model frozen, the MTP layer trained, QAT for its MXFP4 experts, exported into models/latent-demo in place)
# -> the model files into $OUT.
# usage: OUT=/some/dir tools/demo/run_mtp_device.sh [TRAIN_SECONDS]     (default 220)
# $OUT gets 5 files: device.txt, train_mtp.log, mtp_report.json (training log, acceptance per eval set and draft
# position), mtp_card.md (the model card's MTP section, with those numbers) and model.tar.gz
# (models/latent-demo/config.json + model.safetensors: the main tensors byte for byte as committed, plus
# model.layers.4.*). Unpack at the repository root: tar xzf model.tar.gz; then python3 tools/demo/check_mtp.py
# models/latent-demo --base <the committed model> checks it with latent on the CPU.
set -euo pipefail
SECONDS_TRAIN=${1:-220}
PY=${PY:-python3}
OUT=${OUT:?}
mkdir -p build "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/device.txt" || true
$PY -c "import torch, transformers, tokenizers; print(torch.__version__, transformers.__version__, tokenizers.__version__)" \
    | tee -a "$OUT/device.txt"
$PY tools/demo/make_corpus.py build/demo-data --seed 1234 2>&1 | tee "$OUT/train_mtp.log"
rc=0
# shellcheck disable=SC2086
$PY -u tools/demo/train_mtp.py build/demo-data models/latent-demo models/latent-demo --device cuda \
    --seconds "$SECONDS_TRAIN" --seed 0 --report "$OUT/mtp_report.json" --card "$OUT/mtp_card.md" ${TRAIN_ARGS:-} \
    2>&1 | tee -a "$OUT/train_mtp.log" || rc=$?
# the exported model comes back even if the evaluation after the export failed
if grep -q '"num_nextn_predict_layers": 1' models/latent-demo/config.json; then
  tar czf "$OUT/model.tar.gz" models/latent-demo/config.json models/latent-demo/model.safetensors
fi
ls -la "$OUT"
exit $rc
