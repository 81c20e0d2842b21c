#!/bin/sh
# A training-style job that survives being killed: it runs STEPS steps,
# commits a checkpoint generation after each one with `shardpool ckpt
# commit`, and on start resumes from the newest generation that verifies
# (`shardpool ckpt latest` skips a corrupt or partial one).
#
# Usage (argv from shardpool.toml): train.sh OUTDIR
# Uses SHARDPOOL_PARAM_STEPS (default 10), SHARDPOOL_CKPT_DIR,
# SHARDPOOL_SCRATCH and SHARDPOOL_BIN, which shardpool sets.
set -eu
out=$1
steps=${SHARDPOOL_PARAM_STEPS:-10}
sp=${SHARDPOOL_BIN:-shardpool}
ckpt=${SHARDPOOL_CKPT_DIR:?run me through shardpool}
work=${SHARDPOOL_SCRATCH:?run me through shardpool}
step=0
state=1
if latest=$("$sp" ckpt latest "$ckpt"); then
	step=$(cat "$latest/step")
	state=$(cat "$latest/state")
	echo "resumed from $(basename "$latest") at step $step"
else
	echo "starting fresh"
fi
while [ "$step" -lt "$steps" ]; do
	step=$((step + 1))
	sleep "${STEP_SECONDS:-0.2}"
	# The "model": a deterministic update, so a resumed run ends exactly
	# where an uninterrupted one does.
	state=$(( (state * 31 + step) % 1000003 ))
	echo "$step" > "$work/step"
	echo "$state" > "$work/state"
	"$sp" ckpt commit --retain 3 "$ckpt" "$work/step" "$work/state" > /dev/null
	echo "step $step state $state committed"
done
echo "$state" > "$out/final-state"
echo "trained $steps steps" > "$out/summary"
