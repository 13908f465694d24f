#!/usr/bin/env bash
# Regenerate ravop/wire/plan_pb2.py from plan.proto (needs grpcio-tools, pinned in pyproject's dev extra).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m grpc_tools.protoc -I ravop/wire --python_out=ravop/wire ravop/wire/plan.proto
