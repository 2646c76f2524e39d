#!/usr/bin/env bash
# Regenerate the chart's CRD from operator/ninfer_operator/crd.py (tests/operator checks they agree).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
"$PY" -c 'import sys; sys.path.insert(0, "operator")
from ninfer_operator.crd import render_crd_yaml
sys.stdout.write(render_crd_yaml())' > charts/ninfer-operator/crds/ninferdeployments.ninfer.io.yaml
echo "wrote charts/ninfer-operator/crds/ninferdeployments.ninfer.io.yaml"
