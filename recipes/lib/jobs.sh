# Sourced by the shell recipes: run their independent steps JOBS at a time.
#   spawn CMD...  runs CMD now (JOBS=1, the default: one by one, with the machine's threads), or as one of
#                 JOBS background jobs of THREADS (1) threads each, waiting for a free slot first
#   settle        waits for every spawned job; if any failed, says so and exits 1 (run the recipe again:
#                 its steps pass --resume, so finished ones are kept)
# On a CPU machine, small models train and generate faster as N one-thread jobs than one job on N threads
# (REPRODUCTION.md ran JOBS=2 on 2 cores). On GPUs scale out with LAUNCH="accelerate launch ..." instead.
jobs_max=${JOBS:-1} threads=${THREADS:-1} pids=()
[[ $jobs_max =~ ^[1-9][0-9]*$ ]] || { echo "JOBS must be a positive integer, not '$jobs_max'" >&2; exit 2; }
[[ $threads =~ ^[1-9][0-9]*$ ]] || { echo "THREADS must be a positive integer, not '$threads'" >&2; exit 2; }

spawn() {
  if (( jobs_max == 1 )); then "$@"; return; fi
  while (( $(jobs -rp | wc -l) >= jobs_max )); do sleep 1; done
  OMP_NUM_THREADS=$threads "$@" &
  pids+=($!)
}

settle() {
  local failed=0 pid
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  pids=()
  (( failed == 0 )) || { echo "a job failed (its error is above); run the recipe again to resume" >&2; exit 1; }
}
