#!/usr/bin/env bash
# Retrain, then promote the new version only if it passes the gate.
#
# Needs SHAMAL_URL (the server) and SHAMAL_TOKEN (a service account's token; see README.md).
# Exits 0 when @champion now names the new version, 1 when the gate refused it (or on an
# error); gate.xml holds the result as JUnit XML either way, for the CI system to show.
set -euo pipefail

: "${SHAMAL_URL:?set SHAMAL_URL to the Shamal server, e.g. https://shamal.example.com}"
: "${SHAMAL_TOKEN:?set SHAMAL_TOKEN to the CI service account token}"
MODEL="${MODEL:-churn}"
JUNIT="${JUNIT:-gate.xml}"

# 1. Run the pipeline and wait for it: it trains, logs the run (metrics, the dataset
#    versions it read), registers the model as a new version and points @candidate at it.
shamal pipeline run pipeline.py:retrain --wait

# 2. The gate: @champion moves to @candidate's version only if every rule holds. With no
#    champion yet (the first promotion), rules comparing against champion.* pass.
shamal models promote "$MODEL" --from candidate --to champion \
  --require 'metrics.f1 >= champion.metrics.f1 - 0.01' \
  --require "data.validation == 'passed'" \
  --junit "$JUNIT"
