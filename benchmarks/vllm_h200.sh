#!/usr/bin/env bash
# One device call's work on the H200 after the bring-up (docs/gpu.md, "vLLM on an offline GPU host": the parts
# copied to /tmp/vp, one a call). Usage, from the project root on the GPU machine:
#   bash benchmarks/vllm_h200.sh REVISION STAGE...
# Stages: install, demo (the demo pair through vLLM against our engine, float32, parity), demo-bf16 (the
# same at vLLM's defaults), bench (engine-bench --against vllm with batch sizes), engine (engine-bench alone: its
# default EAGLE-3 draft timed beside the block draft), serve (the vllm-server
# sweep), profile (nsys of both engines, compared), profile-dspark-graphs (vLLM's DSpark under nsys with whole
# graphs traced), cuda-tests (the CUDA-marked tests). Results go to /tmp/r (kept while the machine stays
# warm) and, packed, to $OUT. Each stage runs under its own time limit (PROFILE_NATIVE_S, PROFILE_VLLM_S, SERVE_S
# override three); a failed one does not stop the next.
# vLLM 0.32 (issue 31, built with tools/vllm_offline/wheels-0.32.txt) the same way, from other folders:
#   PARTS='/tmp/vp32/v32-*' SITE=/tmp/site32 bash benchmarks/vllm_h200.sh REVISION install smoke adaptive
# smoke (vLLM's DSpark with adaptive verification on two demo prompts, offline engine) and adaptive (the
# demo pair's DSpark with and without it through `vllm serve` at concurrency 1, 4, 16, 32, T = 0 and 1; the
# two systems run in one order, then in the other, ABBA) need vLLM 0.28 or later.
set -u
revision=$1
shift
SITE=${SITE:-/tmp/site}
export PYTHONPATH=$SITE:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 DSPARK_GIT_REVISION=$revision
export LD_LIBRARY_PATH=/tmp/nsys-lib:${LD_LIBRARY_PATH:-}
R=/tmp/r
mkdir -p "$R" "${OUT:-/tmp/out}"
CLI=(python3 -m harness.cli)
. benchmarks/stage.sh  # stage NAME SECONDS COMMAND...
demo() {  # demo DTYPE SUFFIX VLLM_ARGS...: the demo pair on both engines, then parity per run
  local dtype=$1 tag=$2
  shift 2
  local common=(--experiment demo --device cuda --dtype "$dtype" --temperature 0 --output-len 128)
  stage "vllm$tag" 300 "${CLI[@]}" run "${common[@]}" --backend vllm --systems plain,ngram,dspark "$@" --out "$R/vllm$tag"
  stage "vllm-dflash$tag" 120 "${CLI[@]}" run "${common[@]}" --backend vllm --systems dflash "$@" --out "$R/vllm-dflash$tag"
  stage "native$tag" 110 "${CLI[@]}" run "${common[@]}" --backend native --record-margins --out "$R/native$tag"
  for run in "vllm$tag" "vllm-dflash$tag"; do
    "${CLI[@]}" parity "$R/native$tag" "$R/$run" >"$R/parity-$run.txt" 2>&1
    "${CLI[@]}" parity "$R/native$tag" "$R/$run" --json >"$R/parity-$run.json" 2>/dev/null
  done
}
for s in "$@"; do
  case $s in
    install) stage install 120 python3 tools/vllm_offline/install.py ${PARTS:-/tmp/vp/vllm-*} --target "$SITE" ;;
    smoke) stage smoke "${SMOKE_S:-240}" "${CLI[@]}" run --experiment confidence --backend vllm --device cuda \
             --systems dspark-schedule --num-prompts 2 --temperature 0 --output-len 64 --out "$R/smoke" ;;
    adaptive)
      for order in dspark,dspark-schedule dspark-schedule,dspark; do
        stage "adaptive-$order" "${ADAPTIVE_S:-280}" "${CLI[@]}" run --experiment confidence --backend vllm-server \
          --device cuda --systems "$order" --split qualitative --num-prompts 32 --max-concurrency 1,4,16,32 \
          --temperature 0,1 --output-len 128 --ignore-eos --out "$R/adaptive-$order"
      done ;;
    demo) demo float32 "" --vllm-arg enforce_eager=true ;;
    demo-bf16) demo bfloat16 -bf16 ;;
    bench) stage bench 560 sh -c "python3 -m harness.cli engine-bench --skip-hf --repeats 20 --against vllm \
             --concurrency 1,4,16,32 --json > $R/engine_bench_vs_vllm.json" ;;
    engine) stage engine 300 sh -c "python3 -m harness.cli engine-bench --skip-hf --repeats 20 --json > $R/engine_bench.json" ;;
    serve) stage serve "${SERVE_S:-300}" "${CLI[@]}" run --experiment demo --backend vllm-server --device cuda --systems plain,ngram,dspark \
             --split qualitative --num-prompts 32 --max-concurrency 1,4,16,32 --temperature 0 --output-len 128 \
             --ignore-eos --out "$R/serve" ;;
    profile)
      stage profile-native "${PROFILE_NATIVE_S:-90}" "${CLI[@]}" profile --nsys --preset lean --backend native --device cuda --systems plain,dspark \
        --out "$R/profile-native"
      stage profile-vllm "${PROFILE_VLLM_S:-280}" "${CLI[@]}" profile --nsys --preset lean --backend vllm --device cuda --systems plain,dspark \
        --out "$R/profile-vllm"
      "${CLI[@]}" trace compare "$R/profile-native" "$R/profile-vllm" >"$R/profile-compare.txt" 2>&1
      "${CLI[@]}" trace compare "$R/profile-native" "$R/profile-vllm" --json >"$R/profile-compare.json" 2>/dev/null ;;
    cuda-tests) stage cuda-tests 300 python3 -m pytest -q -m cuda tests/test_cuda.py tests/test_kernels.py ;;
    profile-dspark-graphs)  # vLLM's DSpark hung under nsys with graph nodes traced: the same with whole graphs
      stage profile-vllm-dspark-graphs "${PROFILE_VLLM_S:-280}" "${CLI[@]}" profile --nsys --preset lean --backend vllm \
        --device cuda --systems dspark --nsys-arg=--cuda-graph-trace=graph --out "$R/profile-vllm-dspark-graphs" ;;
    *) echo "unknown stage $s" ;;
  esac
done
# what comes back: everything but the large traces (at most 8 files come back from $OUT)
tar -C "$R" --exclude='*.nsys-rep' --exclude='*.sqlite' --exclude='*.qdstrm' -czf "${OUT:-/tmp/out}/r.tgz" .
cp "$R/stages.txt" "${OUT:-/tmp/out}/"
ls -la "${OUT:-/tmp/out}"
