#!/usr/bin/env bash
# `make demo`: the whole pipeline on synthetic MIMIC-IV-format data, on a fresh machine, no credentials.
#   synthetic MIMIC-IV v3.1 (full default scale) -> ETL (230 careunit-by-year centers) -> a short sweep
#   (FedAvg, ABPS, ABPS-X, ABPS with the diversity goal; 2 seeds; configs/demo.yaml) -> report
#   (Table 1 + Figure 3) -> prints the table and the next commands (abps train --goal diversity,
#   abps runs, abps ui). The ETL records the cohort as the project's default (.abps/state.json).
# Usage: bash scripts/demo.sh [DIR]   (default demo_out; run from the repository root)
# Idempotent: existing synthetic data / cohort are reused, finished sweep cells are skipped.
# MLflow store: sqlite:///mlflow/mlflow.db (the default of every abps command), experiment "demo".
set -euo pipefail

DIR="${1:-demo_out}"
ABPS="${ABPS:-.venv/bin/abps}"          # overridable for development only
WORKERS="${DEMO_WORKERS:-2}"
START=$(date +%s)

stamp() { printf '[demo %4ds] %s\n' "$(( $(date +%s) - START ))" "$*"; }

if [[ ! -x "${ABPS%% *}" && "$ABPS" == .venv/bin/abps ]]; then
  echo "error: $ABPS not found; run 'make install' first (make demo does it)" >&2
  exit 2
fi
mkdir -p "$DIR"

if [[ -f "$DIR/mimic/synth_manifest.json" ]]; then
  stamp "synthetic MIMIC-IV data already in $DIR/mimic (skipped)"
else
  stamp "writing synthetic MIMIC-IV v3.1 data -> $DIR/mimic"
  $ABPS synth mimic --out "$DIR/mimic"
fi

# skipped only when the cohort exists AND is this project's recorded default (.abps/state.json,
# written by `abps etl`), so that `abps train --goal diversity` afterwards trains on it
COHORT_ABS="$(cd "$DIR" && pwd -P)/cohort"
if [[ -f "$DIR/cohort/cohort.parquet" && -f "$DIR/cohort/centers.parquet" ]] \
   && grep -qF "\"$COHORT_ABS\"" .abps/state.json 2>/dev/null; then
  stamp "cohort already in $DIR/cohort (skipped)"
else
  stamp "ETL -> $DIR/cohort"
  $ABPS etl --mimic-dir "$DIR/mimic" --out "$DIR/cohort"
fi

stamp "sweep configs/demo.yaml (FedAvg, ABPS, ABPS-X, ABPS diversity goal x 2 seeds), $WORKERS workers"
$ABPS sweep --config configs/demo.yaml --cohort "$DIR/cohort" --executor local --workers "$WORKERS"

stamp "report -> $DIR/report"
$ABPS report --experiment demo --out "$DIR/report"

echo
echo "Table 1 (demo sweep; figures in $DIR/report/fig3.png, everything in $DIR/report/report.md):"
echo
cat "$DIR/report/table1.md"
echo
stamp "done"
echo "Next: train the goal-aware ABPS on this cohort, list the runs, open the MLflow UI:"
echo "  .venv/bin/abps train --goal diversity   # MLflow experiment \"cohort\", named after the cohort's folder"
echo "  .venv/bin/abps runs                      # that experiment's runs (--experiment demo: the sweep's)"
echo "  .venv/bin/abps ui                        # http://127.0.0.1:5000"
