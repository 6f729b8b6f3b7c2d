#!/usr/bin/env bash
# Fails when a C++ file is not formatted as .clang-format says.
set -euo pipefail
cd "$(dirname "$0")/.."
find src tests -name '*.cpp' -o -name '*.h' | xargs clang-format --dry-run --Werror
