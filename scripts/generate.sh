#!/usr/bin/env bash
# Everything built from the rule pack and the code, written again (after adding or changing
# a rule: docs/adding-a-rule.md). The tests fail when one of these is out of date.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
"$python" scripts/gen_pack_cache.py    # rules/compiled.json
"$python" scripts/gen_rules_doc.py     # docs/rules.md
"$python" scripts/gen_alerts.py        # Prometheus and Kubernetes alert rules
"$python" scripts/gen_runbooks.py      # docs/runbooks/: a page per rule, the alerts' runbook_url
"$python" scripts/gen_dashboard.py     # the Grafana dashboard
"$python" scripts/gen_completion.py    # bash, zsh and fish completion (packaging/completion/)
"$python" scripts/gen_manpages.py      # a man page per command (packaging/man/)
"$python" scripts/gen_samples.py       # the samples of the docs
