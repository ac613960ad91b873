# Sourced by the device scripts (vllm_h200.sh, study_h200.sh, profile_vllm_h200.sh): one stage of a device
# call, timed under its own limit, its output in $R/NAME.log, its exit code and seconds appended to $R/stages.txt.
stage() {  # stage NAME SECONDS COMMAND...
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$R/$name.log" 2>&1
  echo "$name rc=$? $((SECONDS - t0)) s" | tee -a "$R/stages.txt"
}
