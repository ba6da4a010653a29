#!/usr/bin/env bash
# One call on a lent GPU: the doctor on the 32,000-image folder (its official-run item short),
# then a whole official-shape run whose trials are compiled (train.compile = true), as long as
# the call's time allows. Few files back in $OUT.
export PYTHONUNBUFFERED=1 NO_COLOR=1 COLUMNS=160
T0=$SECONDS; D=$PWD/.device; mkdir -p "$OUT"; BUDGET=${BUDGET:-545}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$D"/whl/*.whl >/tmp/i.log 2>&1 || { cat /tmp/i.log; exit 3; }
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
python3 -c "import torch, automlperf; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0), automlperf.__version__)"
cd /tmp; timeout 100 python3 "$D"/gen_folder.py /tmp/data/imnet | tail -1; echo "folder at $((SECONDS-T0)) s"
nvidia-smi dmon -s pu -d 5 > /tmp/dmon.txt 2>&1 & dm=$!
timeout -k 10 340 automlperf doctor --out /tmp/doc --data-dir /tmp/data/imnet --run-duration 60s 2>&1 | tee $OUT/doctor.log | grep -v '^[│┃┏┡└]'
echo "doctor rc=${PIPESTATUS[0]} at $((SECONDS-T0)) s"
cp /tmp/doc/doctor.json $OUT/ 2>/dev/null
left=$((BUDGET - (SECONDS-T0) - 45)); echo "compiled run: ${left} s"
if [ $left -ge 90 ]; then
  printf '[train]\ncompile = true\n' > /tmp/compiled.toml
  timeout -k 10 $((left + 25)) automlperf run --config /tmp/compiled.toml --dataset imagenet --data-dir /tmp/data/imnet \
    --unofficial --duration ${left}s --run-dir /tmp/crun > /tmp/crun.log 2>&1; echo "run rc=$? at $((SECONDS-T0)) s"
  timeout 30 automlperf check /tmp/crun 2>&1 | tail -2
  cp /tmp/crun/result.json $OUT/crun-result.json 2>/dev/null; tail -5 /tmp/crun.log
  grep -h "compil" /tmp/crun/replica-*.log 2>/dev/null | tail -8
fi
kill $dm 2>/dev/null; cp /tmp/dmon.txt $OUT/ 2>/dev/null
cp /tmp/doc/run/result.json $OUT/doc-run-result.json 2>/dev/null
tar czf $OUT/runs.tgz --exclude='*.safetensors' --exclude='*.json.gz' --exclude='*.db' -C /tmp doc/run doc/run.log crun crun.log 2>/dev/null
ls -la $OUT; echo "total $((SECONDS-T0)) s"
