#!/bin/sh
# Generates a small text corpus and its manifest with standard tools only.
# Usage: make-corpus.sh [N]   (default 40 files)
set -eu
cd "$(dirname "$0")"
n=${1:-40}
mkdir -p corpus
: > manifest.jsonl
i=1
while [ "$i" -le "$n" ]; do
	f=$(printf 'corpus/doc-%04d.txt' "$i")
	if [ ! -f "$f" ]; then
		# Deterministic content: repeated numbered lines compress well.
		seq -f "line %g of document $i: the quick brown fox jumps over the lazy dog" 1 $((200 * i)) > "$f"
	fi
	printf '{"id":"doc-%04d","inputs":["%s"]}\n' "$i" "$f" >> manifest.jsonl
	i=$((i + 1))
done
echo "wrote $n files and manifest.jsonl"
