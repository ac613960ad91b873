#!/usr/bin/env bash
# Issue 41 on the H200: `profile --nsys --backend vllm` of the demo pair (plain and DSpark) with the
# defaults (no --preset: vLLM takes the lean set, with a notice), and SIGTERM in the middle of a vLLM
# profile (how long until it and every child have ended, what it kept). Run from the project root on the
# GPU machine once the vLLM 0.26 parts (tools/vllm_offline/build.py --part-mb 11 --out .carry/vs: 14 parts
# beside a 54 MB working tree) are in /tmp/vp and .carry/nsys-lib in /tmp/nsys-lib, one part per call:
#   bash benchmarks/profile_vllm_h200.sh REVISION [default] [sigterm]   (both when none is named)
# Results: /tmp/r/profile-vllm-default (its run folders, summaries, logs; traces left out) packed to $OUT.
set -u
revision=$1
shift
stages=${*:-default sigterm}
SITE=${SITE:-/tmp/site}
export PYTHONPATH=$SITE:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 DSPARK_GIT_REVISION=$revision PYTHONUNBUFFERED=1
export LD_LIBRARY_PATH=/tmp/nsys-lib:${LD_LIBRARY_PATH:-}
R=/tmp/r
OUT=${OUT:-/tmp/out}
mkdir -p "$R" "$OUT"
CLI=(python3 -m harness.cli)
. benchmarks/stage.sh  # stage NAME SECONDS COMMAND...
[ -d "$SITE/vllm" ] || python3 tools/vllm_offline/install.py ${PARTS:-/tmp/vp/*} --target "$SITE" >"$R/install.log" 2>&1
tail -1 "$R/install.log"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$R/device.txt"

# 1. The defaults: no --preset, no --nsys-arg.
if [[ " $stages " == *" default "* ]]; then
stage profile-vllm-default 400 "${CLI[@]}" profile --nsys --backend vllm --device cuda --systems plain,dspark \
  --out "$R/profile-vllm-default"
"${CLI[@]}" trace summarize "$R/profile-vllm-default/dspark.sqlite" >"$R/dspark-kernels.txt" 2>&1
fi

# 2. SIGTERM once DSpark's child has started: seconds until the profile has ended, and what is left running.
if [[ " $stages " == *" sigterm "* ]]; then
"${CLI[@]}" profile --nsys --backend vllm --device cuda --systems dspark --out "$R/profile-vllm-sigterm" \
  >"$R/profile-vllm-sigterm.txt" 2>"$R/profile-vllm-sigterm.log" &
pid=$!
for _ in $(seq 600); do [ -f "$R/profile-vllm-sigterm/dspark.log" ] && break; sleep 0.5; done
sleep 20  # DSpark's engine is starting under nsys
t0=$(date +%s.%N)
kill -TERM $pid
wait $pid
rc=$?
t1=$(date +%s.%N)
sleep 1
ps -eo pid,pgid,ppid,stat,args | grep -E "harness.cli|nsys|VLLM|vllm" | grep -v -e grep -e profile_vllm_h200 >"$R/left-after-sigterm.txt"
left=$(wc -l <"$R/left-after-sigterm.txt")
echo "profile-vllm-sigterm rc=$rc ended $(python3 -c "print(f'{$t1 - $t0:.1f}')") s after SIGTERM, processes left: $left" \
  | tee -a "$R/stages.txt"
tail -3 "$R/profile-vllm-sigterm.log" >>"$R/stages.txt"
cat "$R/left-after-sigterm.txt" >>"$R/stages.txt"
fi

tar -C "$R" --exclude='*.nsys-rep' --exclude='*.sqlite' --exclude='*.qdstrm' -czf "$OUT/r.tgz" .
cp "$R"/stages.txt "$R"/profile-vllm-default.log "$OUT/" 2>/dev/null
cat "$R/stages.txt"
