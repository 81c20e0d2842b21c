#!/bin/bash
# The GPU check on a machine with NVIDIA GPUs and PyTorch (make test-gpu runs
# it): preflight against nvidia-smi, a foreign GPU process seen as busy,
# profile's peak VRAM, plan, a run to COMPLETE with each shard on an
# admitted GPU, and a SIGKILLed run whose GPU children must die with it so
# that the resumed run finds the GPU free. Exit 0 only if every check passed.
#
# Usage: check.sh [RESULTS_DIR]   (SHARDPOOL names the binary; default: bin/shardpool)
set -u
cd "$(dirname "$0")"
sp=${SHARDPOOL:-$(cd ../.. && pwd)/bin/shardpool}
res=${1:-$(mktemp -d)}
data=$(mktemp -d)
mkdir -p "$res"
fails=0
ok()   { echo "PASS $*"; }
bad()  { echo "FAIL $*"; fails=$((fails + 1)); }
jq_py() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); $2" "$1"; }

echo "== nvidia-smi"
nvidia-smi -L || { echo "FAIL nvidia-smi: no NVIDIA driver here"; exit 1; }
ngpu=$(nvidia-smi -L | grep -c '^GPU ')
python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "PyTorch sees no CUDA device")' ||
	{ echo "FAIL the example job needs python3 with PyTorch and CUDA"; exit 1; }

echo "== preflight"
"$sp" preflight | tee "$res/preflight.txt" | sed -n '/GPU/,+6p'
"$sp" preflight --json > "$res/preflight.json"
got=$(jq_py "$res/preflight.json" 'g=d["gpus"]; print(g["count"].get("value"), g["usable"].get("value"), sum(1 for x in g["devices"] if x["uuid"].startswith("GPU-")))')
[ "$got" = "$ngpu $ngpu $ngpu" ] && ok "preflight sees $ngpu GPU(s), all usable, with UUIDs" || bad "preflight count/usable/uuids '$got', nvidia-smi says $ngpu"

echo "== a foreign process on GPU 0"
CUDA_VISIBLE_DEVICES=0 python3 -c '
import torch, time, sys
x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda"); x.fill_(1); torch.cuda.synchronize()
open(sys.argv[1], "w").write("up"); time.sleep(120)' "$data/hog.up" &
hog=$!
for _ in $(seq 120); do [ -e "$data/hog.up" ] && break; sleep 0.5; done
"$sp" preflight --json > "$res/preflight-busy.json"
kill $hog; wait $hog 2>/dev/null
got=$(jq_py "$res/preflight-busy.json" 'x=d["gpus"]["devices"][0]; print(x["usable"], any(p["pid"]=='$hog' for p in x["processes"]), x.get("why",""))')
case $got in "False True "*) ok "GPU 0 with pid $hog on it is not usable: ${got#False True }";; *) bad "foreign process not seen: '$got'";; esac

echo "== profile"
"$sp" profile --data "$data" --json shardpool.toml > "$res/profile.json"; rc=$?
[ $rc = 0 ] && ok "profile exit 0" || bad "profile exit $rc"
jq_py "$res/profile.json" '
for s in d["samples"]: print(s["kind"], s["id"], s["outcome"], "peak_vram", s["peak_vram"], "gpu_duty", s["gpu_duty"], "peak_mem", s["peak_memory"], s["seconds"])
print("classes", d["classes"])'
got=$(jq_py "$res/profile.json" '
v=[s for s in d["samples"] if s["id"]=="large"]
print(v and str(v[0]["peak_vram"]).isdigit() and int(v[0]["peak_vram"]) >= 12<<30)')
[ "$got" = True ] && ok "profile measured the large shard's VRAM above the 12 GiB it holds" || bad "profile peak VRAM of 'large' not measured: $got"

echo "== plan"
"$sp" plan --data "$data" shardpool.toml | tee "$res/plan.txt"

echo "== run"
rm -rf out
"$sp" run --data "$data" shardpool.toml > "$res/run.txt" 2>&1; rc=$?
tail -5 "$res/run.txt"
[ $rc = 0 ] && ok "run COMPLETE" || bad "run exit $rc"
uuids=$(jq_py "$res/preflight.json" 'print(" ".join(x["uuid"] for x in d["gpus"]["devices"]))')
for id in small medium-a medium-b large; do
	v=$(jq_py "out/$id/result.json" 'print(d["visible"], d["held_bytes"], d["tflops"])' 2>/dev/null)
	case " $uuids " in *" ${v%% *} "*) ok "$id ran on admitted GPU ${v%% *} ($v)";; *) bad "$id: CUDA_VISIBLE_DEVICES '${v%% *}' is not one of $uuids";; esac
done
"$sp" run --data "$data" shardpool.toml > "$res/rerun.txt" 2>&1; rc=$?
[ $rc = 0 ] && grep -q ', 0 published' "$res/rerun.txt" && ok "second run publishes nothing" || { bad "second run exit $rc"; cat "$res/rerun.txt"; }

echo "== SIGKILL of run mid-shard, then resume"
rm -rf out
sed 's/"seconds":"3"/"seconds":"8"/' manifest.jsonl > "$data/manifest-long.jsonl"
sed -e 's/^name = .*/name = "gpu-kill"/' -e "s#^manifest = .*#manifest = \"$data/manifest-long.jsonl\"#" -e "s#^output = .*#output = \"$data/out-kill\"#" shardpool.toml > spec-kill.toml
"$sp" run --data "$data" spec-kill.toml > "$res/kill.txt" 2>&1 &
run=$!
for _ in $(seq 120); do nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -q . && break; sleep 0.5; done
sleep 3
kids=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader | tr -d ' ' | tr '\n' ' ')
kill -KILL $run; wait $run 2>/dev/null
echo "run $run killed; GPU processes before: $kids"
left=
for _ in $(seq 40); do left=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader | tr -d ' '); [ -z "$left" ] && break; sleep 0.5; done
[ -n "$kids" ] && [ -z "$left" ] && ok "the GPU child ($kids) died with run" || bad "GPU processes after SIGKILL of run: '$left' (before: '$kids')"
timeout 300 "$sp" run --data "$data" spec-kill.toml > "$res/resume.txt" 2>&1; rc=$?
tail -3 "$res/resume.txt"
[ $rc = 0 ] && ok "resumed run COMPLETE" || bad "resumed run exit $rc"
n=$(ls "$data"/out-kill/*/result.json 2>/dev/null | wc -l)
[ "$n" = 4 ] && ok "4 of 4 outputs after resume" || bad "$n of 4 outputs after resume"
rm -f spec-kill.toml

cp -r "$data/runs" "$res/evidence" 2>/dev/null
echo "== $fails check(s) failed"
[ $fails = 0 ]
