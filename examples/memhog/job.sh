#!/bin/sh
# A synthetic memory-heavy shard: holds SHARDPOOL_PARAM_MIB mebibytes of
# touched memory while it burns one CPU for SHARDPOOL_PARAM_SECONDS, then
# writes a result. Usage (argv from shardpool.toml): job.sh OUTDIR
set -eu
out=$1
mib=${SHARDPOOL_PARAM_MIB:-100}
secs=${SHARDPOOL_PARAM_SECONDS:-1}
# tail keeps the one endless line in memory until the pipe closes; the
# CPU burn runs while it is held.
( head -c "${mib}M" /dev/zero; timeout "$secs" sh -c 'while :; do :; done' || true ) | tail -n 1 | wc -c > "$out/held-bytes"
# A pipeline's status is its last command's: check that tail really held
# everything (the OOM killer may have taken it) instead of trusting it.
held=$(cat "$out/held-bytes")
if [ "$held" -ne $((mib * 1048576)) ]; then
	echo "held only $held of $((mib * 1048576)) bytes (killed?)" >&2
	exit 1
fi
echo "held ${mib} MiB for ${secs}s" > "$out/result"
