# Sourced by the GPU check scripts (gpu_check.sh, gpu_two.sh, gpu_eight.sh) with REPORT (the Markdown report), LOG
# and INFO (a file of informational rows) set: the report's sections and rows, and the count that decides the exit.
# A check that did not run is "not run" and fails the script like a failed one; informational rows are not counted.

section() { printf '\n## %s\n\n' "$1" >>"$REPORT"; }
# Runs a command, logging it and its output; its status is returned.
logged() {
  printf '\n$ %s\n' "$*" >>"$LOG"
  "$@" >>"$LOG" 2>&1
}
check_row() {  # name, measured, limit, passed(0/1) or "not run"
  local result
  case $4 in 1) result=pass ;; 0) result='**FAIL**' ;; *) result='not run' ;; esac
  printf '| %s | %s | %s | %s |\n' "$1" "$2" "$3" "$result" >>"$REPORT"
}
# A row that reports without judging (not counted), and the section that shows them.
info_row() { printf '| %s | %s |\n' "$1" "$2" >>"$INFO"; }
info_section() {
  section "Informational (not counted)"
  printf '| row | measured |\n| --- | --- |\n' >>"$REPORT"
  cat "$INFO" >>"$REPORT"
}
# Runs a script that prints check rows (compare_logits.py, serve_check.py): its rows go to the report, and a run that
# failed without printing a failing row, or printed fewer rows than it owes, adds a failing row saying so.
checks_from() {  # name, rows owed, command...
  local name=$1 owed=$2 rows status
  shift 2
  rows=$("$@" 2>>"$LOG")
  status=$?
  [ -z "$rows" ] || echo "$rows" >>"$REPORT"
  if [ "$(echo -n "$rows" | grep -c '^|')" -lt "$owed" ]; then
    check_row "$name" "printed $(echo -n "$rows" | grep -c '^|') of $owed rows (exit $status): see the log" "$owed rows" 0
  elif [ $status != 0 ] && ! echo "$rows" | grep -q 'FAIL'; then
    check_row "$name" "exit $status without a failing row: see the log" "exit 0" 0
  fi
}
# Counts the "## Checks" section's rows (each counted once whoever wrote it), appends the "## Result" line and
# returns 0 only when every check ran and passed.
check_result() {
  local checks passed failed not_run
  checks=$(sed -n '/^## Checks/,/^## /p' "$REPORT")
  passed=$(echo "$checks" | grep -c '| pass |$')
  failed=$(echo "$checks" | grep -c '| \*\*FAIL\*\* |$')
  not_run=$(echo "$checks" | grep -c '| not run |$')
  section "Result"
  echo "$passed passed, $failed failed, $not_run not run" >>"$REPORT"
  [ "$failed" = 0 ] && [ "$not_run" = 0 ] && [ "$passed" -gt 0 ]
}
