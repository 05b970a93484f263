# Sourced by the DQ-BART recipes after lib/jobs.sh, with `run` and `launch` defined: their eval stage.
#   dq_eval DQ TEACHER DATA MODELS PAIRS EVAL_OPTIONS...
# The float teacher first (DQ/eval-float); then every model of the array named MODELS (DQ/NAME) tested against it,
# JOBS at a time; then each "A:B" of the array named PAIRS, A's evaluation tested against B's (nothing generated).
dq_eval() {
  local dq=$1 teacher=$2 data=$3 name pair a b
  local -n dq_models=$4 dq_pairs=$5
  shift 5
  run eval "$teacher" "$data" -o "$dq/eval-float" "$@" --latency-docs 0 >/dev/null
  for name in "${dq_models[@]}"; do
    spawn run eval "$dq/$name" "$data" -o "$dq/eval-$name" "$@" --latency-docs 0 --reference-size "$teacher" \
      --against "$dq/eval-float" >/dev/null
  done
  settle
  for pair in "${dq_pairs[@]}"; do
    a=${pair%%:*} b=${pair##*:}
    [[ -f $dq/eval-$a-vs-$b/metrics.json ]] ||
      $launch eval "$dq/eval-$a" -o "$dq/eval-$a-vs-$b" --against "$dq/eval-$b" --overwrite --quiet >/dev/null
  done
}
