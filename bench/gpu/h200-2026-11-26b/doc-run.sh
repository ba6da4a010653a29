#!/usr/bin/env bash
# The doctor, whose official-run item is the whole official-shape run on the 32,000-image folder (200 s),
# judged against the doctor's own step rates measured in the same call. Few files back in $OUT.
export PYTHONUNBUFFERED=1 NO_COLOR=1 COLUMNS=160
T0=$SECONDS; D=$PWD/.device; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$D"/whl/*.whl >/tmp/i.log 2>&1 || { cat /tmp/i.log; exit 3; }
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
python3 -c "import torch, automlperf; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0), automlperf.__version__)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
cd /tmp; timeout 100 python3 "$D"/gen_folder.py /tmp/data/imnet | tail -1; echo "folder at $((SECONDS-T0)) s"
nvidia-smi dmon -s pu -d 5 > /tmp/dmon.txt 2>&1 & dm=$!
timeout -k 10 $((530 - (SECONDS-T0))) automlperf doctor --out /tmp/doc --data-dir /tmp/data/imnet --run-duration 200s 2>&1 | tee $OUT/doctor.log
echo "doctor rc=${PIPESTATUS[0]} at $((SECONDS-T0)) s"
kill $dm 2>/dev/null; cp /tmp/dmon.txt $OUT/ 2>/dev/null
cp /tmp/doc/doctor.json /tmp/doc/run/result.json $OUT/ 2>/dev/null
tar czf $OUT/run.tgz --exclude='*.safetensors' --exclude='*.json.gz' -C /tmp/doc run run.log 2>/dev/null
grep -h "epoch\|compile" /tmp/doc/run/replica-*.log 2>/dev/null | tail -30
echo "total $((SECONDS-T0)) s"
