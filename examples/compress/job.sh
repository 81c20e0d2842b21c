#!/bin/sh
# One shard: compress an input file and record checksums of both forms.
# Called as: job.sh INPUT OUTDIR (argv from shardpool.toml, never a shell string).
set -eu
in=$1
out=$2
name=$(basename "$in")
gzip -9 -c "$in" > "$out/$name.gz"
sha256sum "$in" | cut -d' ' -f1 > "$out/$name.sha256"
gzip -t "$out/$name.gz"
printf '%s %s\n' "$(wc -c < "$in")" "$(wc -c < "$out/$name.gz")" > "$out/$name.sizes"
