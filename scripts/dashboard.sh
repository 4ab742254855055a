#!/usr/bin/env bash
# Install what is needed and open the dashboard on the bundled demo experiments.
# Extra arguments go to `python -m app serve` (e.g. --port 8600, --db my.duckdb).
# Says what it is doing at each step: pip's own progress while it installs (the first time
# downloads torch and friends, a few minutes), and on the first start what the demo ingest
# skipped, with the whole file list kept in .venv/qkvscope-first-start.log.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf 'qkvscope [%s] %s\n' "$1" "$2" >&2; }

stamp=.venv/.qkvscope-requirements.txt   # what the last successful install installed
if [ -x .venv/bin/python ] && cmp -s requirements.txt "$stamp"; then
  say 1/3 "requirements.txt is installed in .venv (unchanged since; delete $stamp to reinstall)"
else
  [ -x .venv/bin/python ] || say 1/3 "creating .venv with $(${PYTHON:-python3} --version 2>&1)"
  say 1/3 "installing requirements.txt into .venv with pip (the first time downloads ~2 GB: torch, transformers, streamlit, duckdb; pip's progress follows)"
  # setup.sh runs pip with -q; PIP_VERBOSE=1 cancels it (pip's verbosity is verbose - quiet),
  # so pip prints what it collects and its download bars.
  PIP_VERBOSE=1 PIP_PROGRESS_BAR=on bash scripts/setup.sh
  cp requirements.txt "$stamp"
  say 1/3 "installed"
fi

db=${QKVSCOPE_DB:-data/qkvscope.duckdb}
case " $* " in
  *" --db"*|*" --no-demo "*) ;;                     # serve decides; no demo ingest here
  *)
    if [ ! -e "$db" ] && [ -d data/demo ]; then
      log=.venv/qkvscope-first-start.log
      say 2/3 "first start: ingesting the bundled demo (data/demo) into $db"
      if .venv/bin/python -m app ingest data/demo --db "$db" >"$log"; then :; else
        say 2/3 "the demo ingest reported errors: see $log"
      fi
      say 2/3 "$(tail -n 1 "$log")"
      # what was skipped, by reason ("skipped  unknown  PATH (reason)")
      grep '^skipped' "$log" | sed -E 's/.*\((.*)\)$/\1/' | sort | uniq -c \
        | while read -r n reason; do say 2/3 "  $n skipped: $reason"; done
      say 2/3 "every file and what became of it: $log"
    else
      say 2/3 "database $db"
    fi
    ;;
esac

say 3/3 "starting the dashboard (python -m app serve $*); Ctrl-C stops it"
exec .venv/bin/python -m app serve "$@"
