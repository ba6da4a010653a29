#!/usr/bin/env bash
# On a lent GPU machine, from the project's root with .device/whl filled beforehand (see
# bench/bench_gpu_decode.py's description): install the wheels as a user would, then measure
# the GPU decoders (bench/bench_gpu_decode.py) with nvidia-smi's per-second JPEG-engine use
# beside it. Writes gpu-decode.json, dmon.txt and the log to OUT. About 5 minutes on one H200.
export PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .device/whl/*.whl \
  > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 3; }
export PYTHONPATH=/tmp/site:$PWD/src
nvidia-smi dmon -s u -d 1 > "$OUT/dmon.txt" 2>&1 & dm=$!
timeout -k 10 "${BENCH_S:-420}" python3 bench/bench_gpu_decode.py --out "$OUT/gpu-decode.json" \
  "$@" 2>&1 | tee "$OUT/bench.log"
kill $dm 2>/dev/null
