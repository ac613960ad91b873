# D1: vLLM installed from /tmp/vp, the engine history of both commits beside their parent, then ours against vLLM
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 DSPARK_GIT_REVISION=30d8eb8
OUT=${OUT:-/tmp/out}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
python3 tools/vllm_offline/install.py /tmp/vp/vllm-* --target /tmp/site > $OUT/install.log 2>&1; tail -1 $OUT/install.log
PYTHONPATH=$PWD timeout 230 python3 benchmarks/engine_history.py measure --trees .carry/trees --pair ea73a8e:c35da4b \
  --pair 30d8eb8:c35da4b --rounds 2 --out $OUT/history.jsonl > $OUT/history.log 2>&1; tail -3 $OUT/history.log
ON=$(python3 -c "
import json
d = {x['revision']: x['median'] for x in map(json.loads, open('$OUT/history.jsonl'))}
on, off = d['ea73a8e'], d['30d8eb8']
print(int(on['round_ms'] < off['round_ms'] and on['decode_ms'] < off['decode_ms']))")
echo "persistent on for the vLLM comparison: $ON"
DSPARK_PERSISTENT=$ON PYTHONPATH=/tmp/site:$PWD timeout 320 python3 -m harness.cli engine-bench --skip-hf --repeats 20 \
  --against vllm --concurrency 1 --json > $OUT/engine_bench_vs_vllm.json 2> $OUT/vs_vllm.err
echo "vs vllm rc=$?"; tail -3 $OUT/vs_vllm.err; head -c 600 $OUT/engine_bench_vs_vllm.json
