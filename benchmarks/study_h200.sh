#!/usr/bin/env bash
# The write-up's study at Qwen3-8B shapes on the H200 (issue 42): random weights, synthetic acceptance at
# published profiles (experiments/qwen3-8b-random.toml), our engine and vLLM 0.32 (offline and served), kernel
# profiles. One device call's work per invocation, after vLLM 0.32's parts were copied to /tmp/vp32 (one part a
# call: docs/gpu.md; AIPerf's to /tmp/ap for the agreement). Usage, from the project root on the GPU machine:
#   bash benchmarks/study_h200.sh REVISION STAGE...
# Stages: install (vLLM 0.32 into /tmp/site32), native (our engine, every system, one request at a time),
# writeup (plain and DSpark at the write-up's own settings: 3 prompts, 64 output tokens), bench (engine-bench
# --json: the step costs the derived speedups divide by), vllm-a / vllm-b (vLLM offline, the systems in two
# calls), serve (vllm serve at concurrency 1, 4, 16, 32), profile-native, profile-vllm (nsys, the lean preset:
# graph nodes traced), install-aiperf (AIPerf 0.13.0 into /tmp/aiperf), agreement (issue 56: our client and AIPerf
# alternated on one server per system, AGREE_SYSTEMS), crossover-ab / crossover-ba (issue 57: plain against DSpark
# served at concurrency 16 to 256 on 512 filled prompts, the systems in one order, then the other), bench-vllm
# (issue 57: engine-bench --against vllm on vLLM 0.32 at the crossover's batch sizes: the derived column per level),
# adaptive-ab / adaptive-ba (issue 57: the demo pair's trained DSpark draft served with and without vLLM's adaptive
# verification beside plain decoding at the crossover's levels, the systems in one order, then the other: random
# weights have no confidence head to adapt by; study_report.py reads both pairs of stages). Results go to
# /tmp/r (kept while the machine stays warm) and, packed, to $OUT. Each stage runs under its own time limit; a
# failed one does not stop the next.
set -u
revision=$1
shift
SITE=/tmp/site32
export PYTHONPATH=$SITE:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 DSPARK_GIT_REVISION=$revision HF_HUB_OFFLINE=1
export DSPARK_CACHE=/tmp/dcache LD_LIBRARY_PATH=/tmp/nsys-lib:${LD_LIBRARY_PATH:-}
R=/tmp/r
mkdir -p "$R" "${OUT:-/tmp/out}"
CLI=(python3 -m harness.cli)
STUDY=(--experiment qwen3-8b-random --device cuda --split qualitative --category coding --ignore-eos)
N=${N:-6}  # prompts: the fewest that give a speedup its interval
LEN=${LEN:-1024}  # output tokens a request
. benchmarks/stage.sh  # stage NAME SECONDS COMMAND...
for s in "$@"; do
  case $s in
    install) stage install 150 python3 tools/vllm_offline/install.py /tmp/vp32/v32-* --target "$SITE" ;;
    native) stage native 420 "${CLI[@]}" run "${STUDY[@]}" --backend native --num-prompts "$N" --output-len "$LEN" \
              --out "$R/native" ;;
    writeup) stage writeup 150 "${CLI[@]}" run "${STUDY[@]}" --backend native --systems plain,dspark-official \
               --num-prompts 3 --output-len 64 --out "$R/writeup" ;;
    bench) stage bench 240 sh -c "${CLI[*]} engine-bench --skip-hf --repeats 20 --json > $R/engine_bench.json" ;;
    vllm-a) stage vllm-a 560 "${CLI[@]}" run "${STUDY[@]}" --backend vllm --systems plain,dspark-official,dspark-collapse \
              --num-prompts "$N" --output-len "$LEN" --out "$R/vllm-a" ;;
    vllm-b) stage vllm-b 560 "${CLI[@]}" run "${STUDY[@]}" --backend vllm --systems plain,eagle3,dflash \
              --num-prompts "$N" --output-len "$LEN" --out "$R/vllm-b" ;;
    serve) stage serve "${SERVE_S:-560}" "${CLI[@]}" run --experiment qwen3-8b-random --device cuda --split qualitative \
             --ignore-eos --backend vllm-server --systems "${SERVE_SYSTEMS:-plain,dspark-official,dspark-collapse}" \
             --num-prompts 32 --max-concurrency 1,4,16,32 --output-len "${SERVE_LEN:-128}" --out "$R/serve" ;;
    profile-native) stage profile-native 300 "${CLI[@]}" profile --nsys --preset lean "${STUDY[@]}" --backend native \
                      --systems plain,dspark-official --num-prompts 2 --output-len 256 --out "$R/profile-native" ;;
    profile-vllm) stage profile-vllm 330 "${CLI[@]}" profile --nsys "${STUDY[@]}" --backend vllm \
                    --systems plain,dspark-official --num-prompts 2 --output-len 256 --out "$R/profile-vllm" ;;
    install-aiperf) stage install-aiperf 120 python3 tools/vllm_offline/install.py /tmp/ap/ap-* --target /tmp/aiperf \
                      --check aiperf ;;
    agreement) stage "agreement-${AGREE_SYSTEMS:-plain}" "${AGREE_S:-560}" python3 benchmarks/load_generators.py \
                 --experiment qwen3-8b-random --device cuda --split qualitative --min-prompts 16 \
                 --systems "${AGREE_SYSTEMS:-plain}" --levels "${AGREE_LEVELS:-1,4,16,32}" --pairs "${AGREE_PAIRS:-2}" \
                 --output-len "${AGREE_LEN:-128}" --budget-s "${AGREE_BUDGET_S:-400}" --aiperf /tmp/aiperf/bin/aiperf \
                 --out "$R/agreement-${AGREE_SYSTEMS:-plain}" ;;
    crossover-ab|crossover-ba)
      [ -f /tmp/filled/qualitative.jsonl ] || python3 benchmarks/filled_split.py --rows 512 --out /tmp/filled/qualitative.jsonl
      order=plain,dspark-official; [ "$s" = crossover-ba ] && order=dspark-official,plain
      stage "$s" "${CROSS_S:-400}" "${CLI[@]}" run --experiment qwen3-8b-random --device cuda --split qualitative \
        --dataset-path /tmp/filled/qualitative.jsonl --ignore-eos --backend vllm-server --systems "$order" \
        --num-prompts 512 --max-concurrency "${CROSS_LEVELS:-16,32,64,128,256}" --output-len 128 --out "$R/$s" ;;
    bench-vllm) stage bench-vllm "${BENCH_S:-560}" sh -c "${CLI[*]} engine-bench --skip-hf --repeats 20 --against vllm \
                  --concurrency ${CROSS_LEVELS:-16,32,64,128,256} --json > $R/engine_bench_vllm.json" ;;
    adaptive-ab|adaptive-ba)
      [ -f /tmp/filled/qualitative.jsonl ] || python3 benchmarks/filled_split.py --rows 512 --out /tmp/filled/qualitative.jsonl
      order=plain,dspark,dspark-schedule; [ "$s" = adaptive-ba ] && order=dspark-schedule,dspark,plain
      stage "$s" "${ADAPT_S:-560}" "${CLI[@]}" run --experiment confidence --device cuda --split qualitative \
        --dataset-path /tmp/filled/qualitative.jsonl --ignore-eos --backend vllm-server --systems "$order" \
        --temperature 1 --num-prompts 512 --max-concurrency "${CROSS_LEVELS:-16,32,64,128,256}" --output-len 128 \
        --out "$R/$s" ;;
    *) echo "unknown stage $s" | tee -a "$R/stages.txt" ;;
  esac
done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/gpu.txt" 2>&1
tar -C /tmp -czf "${OUT:-/tmp/out}/r.tgz" --exclude='*.nsys-rep' --exclude='*.sqlite' r
cp "$R"/*/*.nsys-rep "${OUT:-/tmp/out}/" 2>/dev/null || true
