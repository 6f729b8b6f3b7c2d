#!/usr/bin/env bash
# Checks that a built library defines exactly the dynamic symbols of its list:
# name@@VERSION (default version) or name@VERSION (non-default), one per line.
#
#   exports.sh LIBRARY EXPECTED
#
# The lists are Debian's libibverbs.so.1.14.44.0 and librdmacm.so.1.3.44.0
# (docs/compatibility.md says which names and why) plus the OFED 1.5 legacy
# XRC calls. A name that is missing is a load failure for a BIND_NOW binary
# that imports it; one that is extra or under another version is an ABI the
# real library does not have.
set -euo pipefail
lib=$1 expected=$2
command -v objdump >/dev/null || { echo "exports.sh: objdump (binutils) not found" >&2; exit 1; }
actual=$(objdump -T "$lib" | awk '
  / D[FO] / && !/\*UND\*/ && !/\*ABS\*/ {
    v = $(NF - 1); n = $NF
    if (v ~ /^\(/) { gsub(/[()]/, "", v); print n "@" v } else print n "@@" v
  }' | LC_ALL=C sort)
if differences=$(diff <(LC_ALL=C sort "$expected") <(printf '%s\n' "$actual")); then
  echo "$(basename "$lib"): $(printf '%s\n' "$actual" | wc -l) exports as listed"
  exit 0
fi
echo "$(basename "$lib"): exports differ from $(basename "$expected") ('<' listed only, '>' built only):"
grep '^[<>]' <<<"$differences"
exit 1
