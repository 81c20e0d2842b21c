package main_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardpool/shardpool/checkpoint"
	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/coordinator/plan"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/testenv"
	"github.com/shardpool/shardpool/worker"
	"github.com/shardpool/shardpool/worker/probe"
)

// TestEveryOutputEmptyIsSaid: a command that wrote its result into its
// working directory (the spec's) instead of {out} completed, each shard
// overwriting the last one's file, and nothing said that no output held
// anything. COMPLETE's reason now says so where every output is empty,
// and stays as it was where one shard wrote into {out}.
func TestEveryOutputEmptyIsSaid(t *testing.T) {
	for _, tc := range []struct {
		name, script, want string
	}{
		{"elsewhere", "echo hi > result.txt", "every output verified at the destination, and all 3 are empty: the command wrote nothing into {out}"},
		{"one", `if [ "$SHARDPOOL_SHARD_ID" = s0001 ]; then echo hi > "$SHARDPOOL_OUT/r.txt"; fi`, ""},
	} {
		data := t.TempDir()
		spec := testenv.WriteJob(t, testenv.Job{Name: tc.name, Shards: 3, Command: []string{"sh", "-c", tc.script}})
		p := testenv.Start(t, "run", "--data", data, "--slots", "2", spec)
		if code := p.Wait(t, 60*time.Second); code != 0 {
			t.Fatalf("%s: exit %d, want 0\n%s", tc.name, code, p.Output())
		}
		reason := regexp.MustCompile(`(?m)^reason: (.*)$`).FindStringSubmatch(p.Output())
		switch {
		case reason == nil:
			t.Errorf("%s: no reason printed:\n%s", tc.name, p.Output())
		case tc.want != "" && !strings.Contains(reason[1], tc.want):
			t.Errorf("%s: reason %q, want it to contain %q", tc.name, reason[1], tc.want)
		case tc.want == "" && reason[1] != "every output verified at the destination":
			t.Errorf("%s: reason %q, want no note with one output that holds a file", tc.name, reason[1])
		}
	}
}

// TestRunNamesItsTail: once no shard is pending, run's progress names
// the shards whose command still runs, so that a run at 2/3 for minutes
// says which shard it waits for; the line comes even though no record
// changes while that shard runs.
func TestRunNamesItsTail(t *testing.T) {
	spec := testenv.WriteJob(t, testenv.Job{Name: "tail", Shards: 3, Command: []string{"sh", "-c", `[ "$0" != s0001 ] || sleep 4`, "{id}"}})
	p := testenv.Start(t, "run", "--data", t.TempDir(), "--slots", "3", spec)
	if code := p.Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("run: exit %d, want 0\n%s", code, p.Output())
	}
	if !strings.Contains(p.Output(), "RUNNING 2/3 validated, 1 running: s0001, 0 failed, 0 pending") {
		t.Errorf("run's progress does not name the shard it waits for:\n%s", p.Output())
	}
}

// TestStatusSaysHowFastARunGoes: status of a running run gives the pace
// its coordinator measured and the time left, as run's progress does,
// and what the shards validated so far took.
func TestStatusSaysHowFastARunGoes(t *testing.T) {
	data := t.TempDir()
	spec := testenv.WriteJob(t, testenv.Job{Name: "pace", Shards: 80, Command: []string{"sleep", "0.3"}})
	p := testenv.Start(t, "run", "--data", data, "--slots", "2", spec)
	pace := regexp.MustCompile(`(?m)^pace: shards end at [0-9.]+/(s|min|h), about [0-9hms]+ left$`)
	soFar := regexp.MustCompile(`(?m)^pace: shards validated so far, \d+ timed: 0\.\d\ds p50, `)
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		st := testenv.Start(t, "status", "--data", data, "pace")
		st.Wait(t, 10*time.Second)
		return pace.MatchString(st.Output()) && soFar.MatchString(st.Output()) && strings.Contains(st.Output(), "RUNNING"),
			"status of the running run, want its pace and what its validated shards took so far:\n" + st.Output()
	})
	if code := p.Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("run: exit %d\n%s", code, p.Output())
	}
}

func TestRunExitCodes(t *testing.T) {
	data := t.TempDir()
	ok := testenv.WriteJob(t, testenv.Job{Name: "good", Shards: 3, Command: []string{"cp", "{input}", "{out}/"}})
	p := testenv.Start(t, "run", "--data", data, "--slots", "2", ok)
	if code := p.Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("run of a good job: exit %d, want 0\n%s", code, p.Output())
	}
	for _, want := range []string{"COMPLETE", "outputs:", "evidence: " + filepath.Join(data, "runs", "good"), "shardpool status --data " + data + " good"} {
		if !strings.Contains(p.Output(), want) {
			t.Errorf("run output lacks %q:\n%s", want, p.Output())
		}
	}
	if strings.Contains(p.Output(), "one shard at a time") {
		t.Errorf("--slots 2 run says it runs one shard at a time:\n%s", p.Output())
	}
	// What the shards took: each in final.json, summarized there and in
	// the verdict's shards: line.
	// cp in no cgroup (no memory declared) stays far below run's own peak
	// RSS: its peak is unknown, and said to be, not a zero or a figure of
	// the run's own.
	if !regexp.MustCompile(`(?m)^shards:   3 timed: \d+\.\d+m?s p50, \d+\.\d+m?s p95, \d+\.\d+m?s max \(s000[0-2]\); peak memory not measured \(`).MatchString(p.Output()) {
		t.Errorf("run output lacks the shards' timing line, with peak memory not measured:\n%s", p.Output())
	}
	if f, err := coordinator.ReadFinal(filepath.Join(data, "runs", "good")); err != nil || f.Timing == nil || f.Timing.Shards != 3 || f.Timing.Seconds.Max <= 0 || f.Timing.PeakMemory != nil ||
		!slices.ContainsFunc(f.Shards, func(s coordinator.FinalShard) bool {
			return s.ID == f.Timing.Seconds.MaxShard && s.Seconds == f.Timing.Seconds.Max
		}) {
		t.Errorf("final.json: %+v, %v; want the timing of 3 shards, its slowest named with its time, and no peak memory", f, err)
	}
	// status of the stopped run reads it from final.json.
	if st := testenv.Start(t, "status", "--data", data, "good"); st.Wait(t, 30*time.Second) != 0 || !strings.Contains(st.Output(), "\ngood: shards 3 timed: ") {
		t.Errorf("status from the evidence of a COMPLETE run does not say what its shards took:\n%s", st.Output())
	}
	// The same spec from another state directory finds every output
	// committed: nothing ran, nothing is timed, and no line says otherwise.
	again := testenv.Start(t, "run", "--data", t.TempDir(), ok)
	if code := again.Wait(t, 60*time.Second); code != 0 || strings.Contains(again.Output(), "shards:   ") {
		t.Errorf("run of committed outputs from another state directory: exit %d, want 0 and no shards: line\n%s", code, again.Output())
	}
	// `ckpt verify` of a committed output reads it back against its marker.
	out0 := filepath.Join(filepath.Dir(ok), "out", "s0000")
	v := testenv.Start(t, "ckpt", "verify", out0)
	if code := v.Wait(t, 30*time.Second); code != 0 || !strings.Contains(v.Output(), "output "+out0+" ok: 1 file(s)") {
		t.Fatalf("ckpt verify of a committed output: exit %d\n%s", code, v.Output())
	}
	// A copy, changed: the run's own outputs stay as they are for below.
	changed := filepath.Join(t.TempDir(), "s0000")
	if out, err := exec.Command("cp", "-a", out0, changed).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	if err := os.WriteFile(filepath.Join(changed, "s0000.txt"), []byte("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	v = testenv.Start(t, "ckpt", "verify", changed)
	if code := v.Wait(t, 30*time.Second); code != 4 || !strings.Contains(v.Output(), "failed verification") || !strings.Contains(v.Output(), "s0000.txt") {
		t.Fatalf("ckpt verify of a changed output: exit %d, want 4 naming the file\n%s", code, v.Output())
	}
	// A deleted output of a COMPLETE run is redone by running it again,
	// not reported verified.
	if err := os.RemoveAll(filepath.Join(filepath.Dir(ok), "out", "s0001")); err != nil {
		t.Fatal(err)
	}
	p = testenv.Start(t, "run", "--data", data, ok)
	if code := p.Wait(t, 60*time.Second); code != 0 || !strings.Contains(p.Output(), "queued again: s0001") {
		t.Fatalf("run after an output was deleted: exit %d, want 0 and the shard queued again\n%s", code, p.Output())
	}
	// Under --slots auto a class with no memory peak runs one shard at a
	// time; the user is told so up front, with the ways out: a profile
	// into this run's state directory among them.
	if !strings.Contains(p.Output(), "slots: class cpu runs one shard at a time") || !strings.Contains(p.Output(), "shardpool profile --data "+data+" ") {
		t.Fatalf("auto run of a class without a memory peak does not say it runs one at a time:\n%s", p.Output())
	}
	// Its admission log says the same, not that 0B was declared.
	if b, _ := os.ReadFile(filepath.Join(data, "runs", "good", "admission.log")); !strings.Contains(string(b), "; peak memory neither declared nor measured: fetch 1") || strings.Contains(string(b), "peak 0B") {
		t.Errorf("admission.log of a class without a memory peak, want its admit line to say none is known:\n%s", b)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(ok), "out", "s0001", "COMPLETE")); err != nil {
		t.Fatalf("deleted output not redone: %v", err)
	}
	// The job fails until the flag file exists: the same command (and
	// fingerprint) succeeds once the cause is fixed.
	flag := filepath.Join(t.TempDir(), "fixed")
	bad := testenv.WriteJob(t, testenv.Job{Name: "bad", Shards: 2, Retries: 0, Command: []string{"test", "-e", flag}})
	p = testenv.Start(t, "run", "--data", data, bad)
	if code := p.Wait(t, 60*time.Second); code != 3 {
		t.Fatalf("run of a failing job: exit %d, want 3 (BLOCKED)\n%s", code, p.Output())
	}
	if !strings.Contains(p.Output(), "BLOCKED") || !strings.Contains(p.Output(), "--retry-failed") {
		t.Fatalf("blocked run output lacks the state or the retry command:\n%s", p.Output())
	}
	resume, err := os.ReadFile(filepath.Join(data, "runs", "bad", "resume.txt"))
	if err != nil || !strings.Contains(string(resume), "--retry-failed") {
		t.Fatalf("resume.txt: got %q (%v), want the retry command", resume, err)
	}
	// Retrying right after the fix runs the failed shards: the BLOCKED
	// record from before the retry must not end the run at once.
	if err := os.WriteFile(flag, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	p = testenv.Start(t, "run", "--data", data, "--retry-failed", bad)
	if code := p.Wait(t, 60*time.Second); code != 0 || !strings.Contains(p.Output(), "COMPLETE  (2 validated, 0 failed of 2)") ||
		!strings.Contains(p.Output(), "retried 2 failed shard(s)") {
		log, _ := os.ReadFile(filepath.Join(data, "runs", "bad", "admission.log"))
		t.Fatalf("run --retry-failed after the fix: exit %d, want 0, COMPLETE with both shards and how many were retried\n%s\nadmission log:\n%s", code, p.Output(), log)
	}
	p = testenv.Start(t, "run", "--data", data, "--retry-failed", bad)
	if code := p.Wait(t, 60*time.Second); code != 1 || !strings.Contains(p.Output(), "no failed shards") {
		t.Fatalf("run --retry-failed with nothing failed: exit %d, want 1 and the reason\n%s", code, p.Output())
	}
	// Two runs of different names share one --data at the same time (a
	// store each); a second run of the same name is refused while the
	// first holds its store.
	slow := testenv.WriteJob(t, testenv.Job{Name: "slow", Shards: 1, Command: []string{"sleep", "2"}})
	p1 := testenv.Start(t, "run", "--data", data, slow)
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		return strings.Contains(p1.Output(), "RUNNING"), "first run not running yet: " + p1.Output()
	})
	p = testenv.Start(t, "run", "--data", data, slow)
	if code := p.Wait(t, 30*time.Second); code != 1 || !strings.Contains(p.Output(), "in use by another coordinator") || !strings.Contains(p.Output(), "stores/slow") ||
		!strings.Contains(p.Output(), "to follow it: shardpool status --data "+data+" slow") {
		t.Fatalf("the same run twice: exit %d, want 1 naming the held store and how to follow the run\n%s", code, p.Output())
	}
	p = testenv.Start(t, "run", "--data", data, "--slots", "2", ok)
	if code := p.Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("another run beside it: exit %d, want 0\n%s", code, p.Output())
	}
	if code := p1.Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("first run: exit %d, want 0\n%s", code, p1.Output())
	}
	// A command that cannot start here is refused before anything is
	// queued, naming the spec and the field.
	missing := testenv.WriteJob(t, testenv.Job{Name: "missing", Shards: 2, Command: []string{"./no-such-program", "{id}"}})
	p = testenv.Start(t, "run", "--data", data, missing)
	if code := p.Wait(t, 30*time.Second); code != 1 || !strings.Contains(p.Output(), missing+`:4: field "command"`) || !strings.Contains(p.Output(), "no-such-program: not found") {
		t.Fatalf("run of a missing program: exit %d, want 1 naming the spec, field and program\n%s", code, p.Output())
	}
	if _, err := os.Stat(filepath.Join(data, "runs", "missing")); !os.IsNotExist(err) {
		t.Fatalf("a refused run left evidence: %v", err)
	}
	// An output directory that cannot be made (here under a regular file)
	// is refused before anything runs, naming the field: every shard
	// would have run only to fail at its commit.
	blocked := testenv.WriteJob(t, testenv.Job{Name: "noout", Shards: 2, Command: []string{"true"}})
	if err := os.WriteFile(filepath.Join(filepath.Dir(blocked), "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(blocked)
	if err := os.WriteFile(blocked, []byte(strings.Replace(string(b), `output = "out"`, `output = "file/out"`, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	p = testenv.Start(t, "run", "--data", data, blocked)
	if code := p.Wait(t, 30*time.Second); code != 1 || !regexp.MustCompile(regexp.QuoteMeta(blocked)+`:\d+: field "output"`).MatchString(p.Output()) || !strings.Contains(p.Output(), "not a directory") {
		t.Fatalf("run with an output that cannot be made: exit %d, want 1 naming the spec, its line and the field\n%s", code, p.Output())
	}
	if _, err := os.Stat(filepath.Join(data, "runs", "noout")); !os.IsNotExist(err) {
		t.Fatalf("a refused run left evidence: %v", err)
	}
	p = testenv.Start(t, "run", "--bogus", ok)
	if code := p.Wait(t, 10*time.Second); code != 2 {
		t.Fatalf("bad flag: exit %d, want 2", code)
	}
	p = testenv.Start(t, "run", "--help")
	if code := p.Wait(t, 10*time.Second); code != 0 || !strings.Contains(p.Output(), "--slots") {
		t.Fatalf("--help: exit %d, output %q; want 0 and the flags", code, p.Output())
	}
}

// waitForDecisions waits until a run's admission.log holds n lines of
// decision.
func waitForDecisions(t *testing.T, log, decision string, n int) {
	t.Helper()
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		b, _ := os.ReadFile(log)
		return strings.Count(string(b), "decision="+decision) >= n, "admission log:\n" + string(b)
	})
}

// TestInterruptedRunResumesAtOnce interrupts `shardpool run` with SIGINT
// while shards run, then runs the resume command it printed, as printed:
// the interrupted shards come back at once, not after the ack wait (30 s
// by default), which is what a plain Nak left them to once the embedded
// coordinator had stopped. The command keeps the flags the run was given
// (it once dropped all but --data, so a resumed run lost its scratch and
// its slots).
func TestInterruptedRunResumesAtOnce(t *testing.T) {
	data := t.TempDir()
	// The first run's shards wait for a gate the test opens only after the
	// interrupt, so that it finds them running however slow the host.
	gate := testenv.NewGate(t)
	spec := testenv.WriteJob(t, testenv.Job{Name: "intr", Shards: 4,
		Command: []string{"sh", "-c", `while [ ! -e "$3" ]; do sleep 0.1; done; sleep 1; cp "$1" "$2/"`, "sh", "{input}", "{out}", gate.Path}})
	log := filepath.Join(data, "runs", "intr", "admission.log")
	scratch := filepath.Join(t.TempDir(), "my scratch")
	p := testenv.Start(t, "run", "--data", data, "--slots", "2", "--halt", "0", "-v", "--scratch", scratch, spec)
	waitForDecisions(t, log, "admit", 2)
	p.SignalMain(syscall.SIGINT)
	want := fmt.Sprintf("resume with: shardpool run --data %s --slots 2 --scratch '%s' --halt 0 %s\n", data, scratch, spec)
	if code := p.Wait(t, 30*time.Second); code != 130 || !strings.Contains(p.Output(), want) {
		t.Fatalf("interrupted run: exit %d, want 130 and %q\n%s", code, want, p.Output())
	}
	if b, err := os.ReadFile(filepath.Join(data, "runs", "intr", "resume.txt")); err != nil || string(b) != strings.TrimPrefix(want, "resume with: ") {
		t.Fatalf("resume.txt: %q (%v), want %q", b, err, strings.TrimPrefix(want, "resume with: "))
	}
	b, _ := os.ReadFile(log)
	if !strings.Contains(string(b), "decision=requeue worker shutting down") {
		t.Fatalf("no shard was requeued by the interrupt; admission log:\n%s", b)
	}
	gate.Open()
	start := time.Now()
	line := strings.TrimSuffix(strings.TrimPrefix(want, "resume with: "), "\n")
	p = testenv.StartCmd(t, "sh", "-c", `shardpool() { "$0" "$@"; }; `+line, testenv.Binary(t))
	if code := p.Wait(t, 90*time.Second); code != 0 || !strings.Contains(p.Output(), "COMPLETE  (4 validated, 0 failed of 4)") {
		t.Fatalf("resumed run: exit %d, want 0 and COMPLETE\n%s", code, p.Output())
	}
	// Four shards of 1 s on 2 slots: about 2 s of work, 4 at most if the
	// interrupt came before any shard finished.
	if d := time.Since(start); d > 12*time.Second {
		b, _ := os.ReadFile(log)
		t.Fatalf("resumed run took %s, want the interrupted shards back at once\nadmission log:\n%s", d.Round(time.Millisecond), b)
	}
	for i := range 4 {
		if _, err := checkpoint.Verify(filepath.Join(filepath.Dir(spec), "out", fmt.Sprintf("s%04d", i))); err != nil {
			t.Errorf("output s%04d: %v", i, err)
		}
	}
}

// TestSameRunFromAnotherStateDirectoryIsRefused: a run of the same spec
// from a second state directory while the first runs (two terminals, one
// with --data) has a store and queue of its own and would run every shard
// again. It is refused, naming the first run's state directory and how to
// follow it; a run of another name into the same output goes on beside
// it; once the first ends, the second runs and redoes nothing.
func TestSameRunFromAnotherStateDirectoryIsRefused(t *testing.T) {
	first, second := t.TempDir(), t.TempDir()
	gate := testenv.NewGate(t)
	ran := filepath.Join(t.TempDir(), "ran")
	spec := testenv.WriteJob(t, testenv.Job{Name: "twice", Shards: 3,
		Command: []string{"sh", "-c", `echo "$4" >> "$3"; while [ ! -e "$5" ]; do sleep 0.1; done; cp "$1" "$2/"`, "sh", "{input}", "{out}", ran, "{id}", gate.Path}})
	p1 := testenv.Start(t, "run", "--data", first, "--slots", "1", spec)
	waitForDecisions(t, filepath.Join(first, "runs", "twice", "admission.log"), "admit", 1)

	p := testenv.Start(t, "run", "--data", second, spec)
	if code := p.Wait(t, 30*time.Second); code != 1 || !strings.Contains(p.Output(), "run twice is running already into "+filepath.Join(filepath.Dir(spec), "out")) ||
		!strings.Contains(p.Output(), "state directory "+first) || !strings.Contains(p.Output(), "to follow it: shardpool status --data "+first+" twice") {
		t.Fatalf("the same run from a second state directory: exit %d, want 1 naming the first one's and how to follow it\n%s", code, p.Output())
	}
	// Another run (another name) into the same output is not held back.
	other := filepath.Join(filepath.Dir(spec), "other.toml")
	b, err := os.ReadFile(spec)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(other, []byte(strings.Replace(string(b), `name = "twice"`, `name = "other"`, 1)), 0o644)
	p = testenv.Start(t, "run", "--data", second, "--slots", "3", other)
	gate.Open()
	if code := p.Wait(t, 60*time.Second); code != 0 || !strings.Contains(p.Output(), "COMPLETE") {
		t.Fatalf("a run of another name into the same output: exit %d, want 0\n%s", code, p.Output())
	}
	if code := p1.Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("first run: exit %d, want 0\n%s", code, p1.Output())
	}
	if left := leftovers(t, filepath.Join(filepath.Dir(spec), "out")); len(left) > 0 {
		t.Errorf("the runs left %v in the output directory, want their claims removed as they ended", left)
	}
	before, _ := os.ReadFile(ran)
	p = testenv.Start(t, "run", "--data", second, spec)
	if code := p.Wait(t, 60*time.Second); code != 0 || !strings.Contains(p.Output(), "COMPLETE  (3 validated, 0 failed of 3)") {
		t.Fatalf("the same run from the second state directory after the first ended: exit %d, want 0 and COMPLETE\n%s", code, p.Output())
	}
	if after, _ := os.ReadFile(ran); string(after) != string(before) {
		t.Fatalf("the second run ran shards the first had committed:\nbefore %q\nafter  %q", before, after)
	}
}

// TestRunDrainsOnSIGUSR1: `shardpool run` in a Slurm job that asks for a
// warning signal (--signal=USR1@SECONDS) finishes the shards it runs,
// starts no more, and exits 130 with the resume command; when the running
// shards were the run's last, it ends COMPLETE and exits 0.
func TestRunDrainsOnSIGUSR1(t *testing.T) {
	for _, c := range []struct {
		shards, code int
		says         string
	}{
		{4, 130, "drained (SIGUSR1) at 2/4 validated: the running shards ended, the rest stay queued"},
		{2, 0, "COMPLETE  (2 validated, 0 failed of 2)"},
	} {
		t.Run(fmt.Sprintf("%d shards", c.shards), func(t *testing.T) {
			data := t.TempDir()
			gate := testenv.NewGate(t)
			spec := testenv.WriteJob(t, testenv.Job{Name: "usr1", Shards: c.shards,
				Command: gate.ThenCopy()})
			log := filepath.Join(data, "runs", "usr1", "admission.log")
			p := testenv.Start(t, "run", "--data", data, "--slots", "2", spec)
			waitForDecisions(t, log, "admit", 2)
			p.SignalMain(syscall.SIGUSR1)
			testenv.Eventually(t, 10*time.Second, func() (bool, string) {
				return strings.Contains(p.Output(), "SIGUSR1: draining"), "run output: " + p.Output()
			})
			gate.Open()
			if code := p.Wait(t, 30*time.Second); code != c.code || !strings.Contains(p.Output(), c.says) {
				t.Fatalf("drained run: exit %d, want %d and %q\n%s", code, c.code, c.says, p.Output())
			}
			b, _ := os.ReadFile(log)
			if n := strings.Count(string(b), "decision=admit"); n != 2 {
				t.Fatalf("%d shards admitted, want only the 2 running at the signal; admission log:\n%s", n, b)
			}
			if c.code == 0 {
				return
			}
			if !strings.Contains(p.Output(), "resume with: shardpool run --data "+data) {
				t.Fatalf("no resume command:\n%s", p.Output())
			}
			p = testenv.Start(t, "run", "--data", data, "--slots", "2", spec)
			if code := p.Wait(t, 60*time.Second); code != 0 || !strings.Contains(p.Output(), "COMPLETE  (4 validated, 0 failed of 4)") {
				t.Fatalf("resumed run: exit %d, want 0 and COMPLETE\n%s", code, p.Output())
			}
			b, _ = os.ReadFile(log)
			if n := strings.Count(string(b), "decision=validated"); n != 4 {
				t.Fatalf("%d validations, want each of the 4 shards once; admission log:\n%s", n, b)
			}
		})
	}
}

// TestInterruptWhileStagingStopsTheCopy: Ctrl-C while a large input is
// being staged (here at 1 MiB/s, 20 s for the whole input) stops the copy
// and exits at once, and the shard (retries = 0) runs on resume.
func TestInterruptWhileStagingStopsTheCopy(t *testing.T) {
	data := t.TempDir()
	spec := testenv.WriteJob(t, testenv.Job{Name: "stg", Shards: 1, InputSize: 20 << 20, Extra: "stage = true\n",
		Command: []string{"cp", "{input}", "{out}/"}})
	log := filepath.Join(data, "runs", "stg", "admission.log")
	p := testenv.Start(t, "run", "--data", data, "--slots", "1", "--stage-bwlimit", "1MiB", spec)
	waitForDecisions(t, log, "admit", 1)
	time.Sleep(500 * time.Millisecond) // into the copy
	start := time.Now()
	p.SignalMain(syscall.SIGINT)
	if code := p.Wait(t, 30*time.Second); code != 130 {
		t.Fatalf("interrupted run: exit %d, want 130\n%s", code, p.Output())
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("run took %s to stop after SIGINT, want the copy stopped at once", d.Round(time.Millisecond))
	}
	b, _ := os.ReadFile(log)
	if !strings.Contains(string(b), "decision=requeue worker shutting down while staging the inputs") || strings.Contains(string(b), "stage-failed") {
		t.Fatalf("admission log after the interrupt: want the shard requeued while staging, no staging failure\n%s", b)
	}
	p = testenv.Start(t, "run", "--data", data, "--slots", "1", spec)
	if code := p.Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("resumed run: exit %d, want 0\n%s", code, p.Output())
	}
}

// TestStagingLongerThanTheLeaseKeepsIt: staging ran before the attempt's
// heartbeat, so a copy longer than the lease's TTL let the message come
// back meanwhile (here to the same worker, which found its own lease
// held; to another worker, the lease would have expired under the copy).
// The attempt now beats while it stages: one delivery, one attempt.
func TestStagingLongerThanTheLeaseKeepsIt(t *testing.T) {
	data := t.TempDir()
	spec := testenv.WriteJob(t, testenv.Job{Name: "slow", Shards: 1, InputSize: 5 << 20, Extra: "stage = true\n",
		Command: []string{"cp", "{input}", "{out}/"}})
	p := testenv.Start(t, "run", "--data", data, "--slots", "1", "--lease-ttl", "2s", "--stage-bwlimit", "1MiB", spec)
	if code := p.Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("exit %d, want 0\n%s", code, p.Output())
	}
	b, _ := os.ReadFile(filepath.Join(data, "runs", "slow", "admission.log"))
	if n := strings.Count(string(b), "decision=admit"); n != 1 || strings.Contains(string(b), "decision=defer") {
		t.Fatalf("admission log: %d admit(s), want one delivery admitted and none deferred on its own lease\n%s", n, b)
	}
	if staged := regexp.MustCompile(`validated attempt 1 in`).Find(b); staged == nil {
		t.Fatalf("admission log: want attempt 1 validated\n%s", b)
	}
}

// TestAFullScratchIsNamed: a command that fills the scratch file system
// fails in its own words ("No space left on device"), which do not say
// that the scratch was full or that its class declares no scratch to
// reserve. The failure says both now; a class that declares its scratch
// gets no advice to.
func TestAFullScratchIsNamed(t *testing.T) {
	scratch := filepath.Join(t.TempDir(), "scratch")
	testenv.SmallTmpfs(t, scratch, "16m")
	for _, c := range []struct {
		name, class string
		advice      bool
	}{{"undeclared", "", true}, {"declared", "[class.cpu]\nscratch = \"8MiB\"\n", false}} {
		data := t.TempDir()
		spec := testenv.WriteJob(t, testenv.Job{Name: c.name, Shards: 1, Retries: 0, Extra: c.class,
			Command: []string{"sh", "-c", `head -c 20000000 /dev/zero > "$0/big"`, "{out}"}})
		p := testenv.Start(t, "run", "--data", data, "--slots", "1", "--scratch", scratch, spec)
		if code := p.Wait(t, 60*time.Second); code != 3 {
			t.Fatalf("%s: exit %d, want 3 (BLOCKED)\n%s", c.name, code, p.Output())
		}
		b, err := os.ReadFile(filepath.Join(data, "runs", c.name, "admission.log"))
		if err != nil {
			t.Fatal(err)
		}
		failed := regexp.MustCompile(`(?m)^.* decision=failed .*$`).FindString(string(b))
		for _, want := range []string{"No space left on device", "; the scratch file system of " + scratch + " was full when the command ended ("} {
			if !strings.Contains(failed, want) {
				t.Errorf("%s: the failed attempt lacks %q:\n%s", c.name, want, b)
			}
		}
		if advice := strings.Contains(failed, "; declare the class's scratch (room for its {out} and {scratch})"); advice != c.advice {
			t.Errorf("%s: advice to declare the class's scratch %v, want %v:\n%s", c.name, advice, c.advice, failed)
		}
	}
}

// TestFullStoreStopsTheRunAndItResumes: the file system of --data fills up
// while a run goes on (here another file takes the rest of a small tmpfs):
// `run` stops within seconds (6.6 s here), says the store is full and where, and after
// space is freed the printed command resumes it to COMPLETE. A manifest too
// large for the store's space fails at submit with the same reason.
func TestFullStoreStopsTheRunAndItResumes(t *testing.T) {
	data := filepath.Join(t.TempDir(), "state")
	testenv.SmallTmpfs(t, data, "32m")
	spec := testenv.WriteJob(t, testenv.Job{Name: "full", Shards: 60, Retries: 2,
		Command: []string{"sh", "-c", `sleep 0.2; cp "$1" "$2/"`, "sh", "{input}", "{out}"}})
	log := filepath.Join(data, "runs", "full", "admission.log")
	p := testenv.Start(t, "run", "--data", data, "--slots", "2", spec)
	waitForDecisions(t, log, "validated", 2)
	filler := filepath.Join(data, "filler")
	_ = exec.Command("sh", "-c", `head -c 64M /dev/zero > "$1"`, "sh", filler).Run() // stops at the tmpfs's end
	filled := time.Now()
	code := p.Wait(t, 60*time.Second)
	took := time.Since(filled)
	t.Logf("run stopped %s after the file system filled", took.Round(time.Millisecond))
	// 5 s of a full store, then the way out. That way took 12 s more
	// (18 s in all) while each write the worker and the tracker still
	// made waited out its request's 2 or 5 s (StoreRefusesWrites).
	if took > 14*time.Second {
		t.Errorf("run stopped %s after its store's file system filled, want within 14s", took.Round(time.Millisecond))
	}
	if code != 1 || !strings.Contains(p.Output(), "store is full: the file system of "+filepath.Join(data, "stores", "full")) ||
		!strings.Contains(p.Output(), "resume with: shardpool run --data "+data) {
		t.Fatalf("run on a full store: exit %d, want 1 naming the store and the resume command\n%s", code, p.Output())
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	p = testenv.Start(t, "run", "--data", data, "--slots", "2", spec)
	if code := p.Wait(t, 60*time.Second); code != 0 || !strings.Contains(p.Output(), "COMPLETE  (60 validated, 0 failed of 60)") {
		t.Fatalf("resumed run after freeing space: exit %d, want 0 and COMPLETE\n%s", code, p.Output())
	}

	// 3,000 shards of 2 KB each do not fit in a 4 MiB store: submit stops
	// with the reason instead of a bare "insufficient resources".
	small := filepath.Join(t.TempDir(), "small")
	testenv.SmallTmpfs(t, small, "4m")
	big := testenv.WriteJob(t, testenv.Job{Name: "big", Shards: 3000, Command: []string{"true"},
		Line: func(i int, in string) string {
			return fmt.Sprintf(`{"id":"s%04d","params":{"blob":%q}}`, i, strings.Repeat("x", 2000))
		}})
	p = testenv.Start(t, "run", "--data", small, big)
	if code := p.Wait(t, 60*time.Second); code != 1 || !strings.Contains(p.Output(), "the coordinator's store is out of space") {
		t.Fatalf("run whose manifest outgrows the store: exit %d, want 1 and the reason\n%s", code, p.Output())
	}
}

// TestRunStopsWhenItsStoreCannotBeWritten: the ext4 under --data meets
// an error mid-run and refuses every write, with free space left and its
// mount still listed rw (Linux 6.12 and later): `run` stops as on a full
// store, but says the store cannot be written and what to do about that,
// not to free space.
func TestRunStopsWhenItsStoreCannotBeWritten(t *testing.T) {
	efs := testenv.NewErrorFS(t, 64<<20) // first: unmounted after the run's process ends
	data := filepath.Join(efs.Dir, "state")
	spec := testenv.WriteJob(t, testenv.Job{Name: "ro", Shards: 60, Retries: 2,
		Command: []string{"sh", "-c", `sleep 0.2; cp "$1" "$2/"`, "sh", "{input}", "{out}"}})
	p := testenv.Start(t, "run", "--data", data, "--slots", "2", spec)
	waitForDecisions(t, filepath.Join(data, "runs", "ro", "admission.log"), "validated", 2)
	efs.Fail()
	code := p.Wait(t, 60*time.Second)
	out := p.Output()
	if code != 1 || !strings.Contains(out, "stopped: the coordinator's store cannot be written: the file system of "+filepath.Join(data, "stores", "ro")) ||
		!strings.Contains(out, "make its file system writable again") || !strings.Contains(out, "then resume with: shardpool run --data "+data) ||
		strings.Contains(out, "free space there") {
		t.Fatalf("run on a store that refuses writes: exit %d, want 1 with the reason, what to do and the resume command\n%s", code, out)
	}
}

// TestBadInputNamesFileLineFieldAndPublishesNothing submits broken specs
// and manifests to a live coordinator: each is refused with the file, the
// line and the field, and the stream stays empty.
func TestBadInputNamesFileLineFieldAndPublishesNothing(t *testing.T) {
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	cmd := []string{"cp", "{input}", "{out}/"}
	cases := []struct {
		name string
		spec func(t *testing.T) string
		want []string
	}{
		{"malformed toml", func(t *testing.T) string {
			p := testenv.WriteJob(t, testenv.Job{Shards: 1, Command: cmd})
			appendTo(t, p, "retries = = 3\n")
			return p
		}, []string{"shardpool.toml:7"}},
		{"unknown spec field", func(t *testing.T) string {
			p := testenv.WriteJob(t, testenv.Job{Shards: 1, Command: cmd})
			appendTo(t, p, "[class.cpu]\ncpus = 1\nmemroy = \"1GiB\"\n")
			return p
		}, []string{"shardpool.toml:9", `"class.cpu.memroy"`, "unknown field"}},
		{"bad size", func(t *testing.T) string {
			p := testenv.WriteJob(t, testenv.Job{Shards: 1, Command: cmd})
			appendTo(t, p, "[class.cpu]\nmemory = \"12 parsecs\"\n")
			return p
		}, []string{"shardpool.toml:8", `"class.cpu.memory"`, "unknown unit"}},
		{"malformed jsonl", func(t *testing.T) string {
			return testenv.WriteJob(t, testenv.Job{Shards: 3, Command: cmd, Line: func(i int, in string) string {
				if i == 1 {
					return `{"id": "x", "inputs": [`
				}
				return `{"id":"a` + string(rune('0'+i)) + `","inputs":["` + in + `"]}`
			}})
		}, []string{"manifest.jsonl:2", "not a JSON object"}},
		{"unknown manifest field", func(t *testing.T) string {
			return testenv.WriteJob(t, testenv.Job{Shards: 2, Command: cmd, Line: func(i int, in string) string {
				if i == 1 {
					return `{"id":"b","inputs":["` + in + `"],"priority":3}`
				}
				return `{"id":"a","inputs":["` + in + `"]}`
			}})
		}, []string{"manifest.jsonl:2", `field "priority"`, "unknown field"}},
		{"duplicate id", func(t *testing.T) string {
			return testenv.WriteJob(t, testenv.Job{Shards: 3, Command: cmd, Line: func(i int, in string) string {
				return `{"id":"same","inputs":["` + in + `"]}`
			}})
		}, []string{"manifest.jsonl:2", `field "id"`, "duplicate shard id", "first on line 1"}},
		{"forbidden id", func(t *testing.T) string {
			return testenv.WriteJob(t, testenv.Job{Shards: 1, Command: cmd, Line: func(i int, in string) string {
				return `{"id":"../../etc","inputs":["` + in + `"]}`
			}})
		}, []string{"manifest.jsonl:1", `field "id"`, "output directory"}},
		{"missing input", func(t *testing.T) string {
			return testenv.WriteJob(t, testenv.Job{Shards: 2, Command: cmd, Line: func(i int, in string) string {
				if i == 1 {
					return `{"id":"b","inputs":["in/nope.txt"]}`
				}
				return `{"id":"a","inputs":["` + in + `"]}`
			}})
		}, []string{"manifest.jsonl:2", `field "inputs"`, "no such file"}},
		{"undeclared class", func(t *testing.T) string {
			return testenv.WriteJob(t, testenv.Job{Shards: 1, Command: cmd, Line: func(i int, in string) string {
				return `{"id":"a","inputs":["` + in + `"],"class":"gpu"}`
			}})
		}, []string{"manifest.jsonl:1", `field "class"`, "not declared"}},
		{"bad run name", func(t *testing.T) string {
			return testenv.WriteJob(t, testenv.Job{Name: "Bad Name", Shards: 1, Command: cmd})
		}, []string{"shardpool.toml:1", `field "name"`}},
		{"missing manifest", func(t *testing.T) string {
			p := testenv.WriteJob(t, testenv.Job{Shards: 1, Command: cmd})
			os.Remove(filepath.Join(filepath.Dir(p), "manifest.jsonl"))
			return p
		}, []string{"shardpool.toml:2", `field "manifest"`, "no such file"}},
		{"{input} with two inputs", func(t *testing.T) string {
			return testenv.WriteJob(t, testenv.Job{Shards: 1, Command: []string{"cat", "{input}"}, Line: func(i int, in string) string {
				return `{"id":"a","inputs":["` + in + `","` + in + `"]}`
			}})
		}, []string{"manifest.jsonl:1", "{input}", "{inputs}"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			spec := tc.spec(t)
			p := testenv.Start(t, "submit", "--server", env.URL, spec)
			code := p.Wait(t, 30*time.Second)
			if code != 1 {
				t.Fatalf("exit: got %d, want 1\n%s", code, p.Output())
			}
			for _, w := range tc.want {
				if !strings.Contains(p.Output(), w) {
					t.Errorf("error output lacks %q:\n%s", w, p.Output())
				}
			}
		})
	}
	s, err := env.JS.Stream(context.Background(), stream.StreamShards)
	if err != nil {
		t.Fatal(err)
	}
	info, _ := s.Info(context.Background())
	if info.State.Msgs != 0 {
		t.Fatalf("stream holds %d messages after only bad submissions, want 0", info.State.Msgs)
	}
}

// TestRunRefusesACommandItCannotFind: `run` checks on its own host that
// the command is there before it queues anything: besides a missing
// relative path (TestRunExitCodes), a name not on PATH and a file that is
// not executable. Each is exit 1 naming the spec's line and field, and no
// run is started.
//
// submit, whose workers run the command on their own hosts, refuses what
// fails on every host (the script's own #! line) and warns of what this
// host lacks; it checked nothing before.
func TestRunRefusesACommandItCannotFind(t *testing.T) {
	// The program file, beside the spec.
	type program struct {
		name, body string
		mode       os.FileMode
	}
	cases := []struct {
		name    string
		command []string
		file    *program
		want    string
		// everywhere: submit refuses it too; else it warns and queues.
		everywhere bool
	}{
		{"not on PATH", []string{"no-such-program-here", "{input}"}, nil, "no-such-program-here is not an executable on this host's PATH", false},
		{"not executable", []string{"./job.sh", "{input}"}, &program{"job.sh", "#!/bin/sh\n", 0o644}, "job.sh: not an executable file", true},
		// Scripts the kernel would not run: every attempt failed with
		// "exec format error", or "no such file or directory" of a file
		// that is there.
		{"no #! line", []string{"./job.sh", "{input}"}, &program{"job.sh", "cat \"$1\"\n", 0o755},
			"job.sh is a text file with no #! line, so the kernel cannot run it", true},
		{"Windows line ends", []string{"./job.sh", "{input}"}, &program{"job.sh", "#!/bin/sh\r\ncat \"$1\"\r\n", 0o755},
			`job.sh has Windows line ends: its #! line ends in a carriage return, so the kernel looks for an interpreter named "/bin/sh\r"`, true},
		{"interpreter missing", []string{"./job.py", "{input}"}, &program{"job.py", "#!/no/such/python3 -u\nprint(1)\n", 0o755},
			"job.py names the interpreter /no/such/python3 on its #! line, which is not on this host", false},
		{"env finds no interpreter", []string{"./job.py", "{input}"}, &program{"job.py", "#!/usr/bin/env no-such-python\nprint(1)\n", 0o755},
			"job.py runs with #!/usr/bin/env no-such-python, and no-such-python is not on this host's PATH", false},
	}
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			name := fmt.Sprintf("cmd%d", i) // one coordinator takes every case's submission
			spec := testenv.WriteJob(t, testenv.Job{Name: name, Shards: 1, Command: tc.command})
			if f := tc.file; f != nil {
				if err := os.WriteFile(filepath.Join(filepath.Dir(spec), f.name), []byte(f.body), f.mode); err != nil {
					t.Fatal(err)
				}
			}
			data := t.TempDir()
			p := testenv.Start(t, "run", "--data", data, spec)
			if code := p.Wait(t, 30*time.Second); code != 1 {
				t.Fatalf("exit %d, want 1\n%s", code, p.Output())
			}
			if out := p.Output(); !strings.Contains(out, "shardpool.toml:4: field \"command\"") || !strings.Contains(out, tc.want) {
				t.Fatalf("output lacks the spec's line 4, field \"command\" and %q:\n%s", tc.want, out)
			}
			if _, err := os.Stat(filepath.Join(data, "runs", name)); !os.IsNotExist(err) {
				t.Fatalf("a run was started (its evidence folder: %v)", err)
			}
			p = testenv.Start(t, "submit", "--server", env.URL, spec)
			code := p.Wait(t, 30*time.Second)
			_, rerr := env.Run(name)
			switch {
			case tc.everywhere && (code != 1 || !strings.Contains(p.Output(), tc.want) || rerr == nil):
				t.Fatalf("submit: exit %d (run record: %v), want 1 with %q and nothing queued\n%s", code, rerr, tc.want, p.Output())
			case !tc.everywhere && (code != 0 || !strings.Contains(p.Output(), "warning: ") || !strings.Contains(p.Output(), tc.want) ||
				!strings.Contains(p.Output(), "checked on this host only") || rerr != nil):
				t.Fatalf("submit: exit %d (run record: %v), want 0 with a warning of %q, checked on this host only, and the run queued\n%s", code, rerr, tc.want, p.Output())
			}
		})
	}
}

func appendTo(t *testing.T, path, text string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.WriteString(text)
}

// natsCLI is the stock nats CLI's path (`make tools` installs it).
func natsCLI(t *testing.T) string {
	t.Helper()
	natsBin, err := exec.LookPath("nats")
	if err != nil {
		if gp, e := exec.Command("go", "env", "GOPATH").Output(); e == nil {
			cand := filepath.Join(strings.TrimSpace(string(gp)), "bin", "nats")
			if _, e := os.Stat(cand); e == nil {
				natsBin, err = cand, nil
			}
		}
	}
	if err != nil {
		t.Fatalf("the nats CLI is not installed; run: go install github.com/nats-io/natscli/nats@v0.5.0")
	}
	return natsBin
}

// TestNatsCLIAgreesWithStatus runs the stock nats CLI (natscli v0.5.0)
// against a live coordinator and compares what it reads with shardpool
// status --json.
func TestNatsCLIAgreesWithStatus(t *testing.T) {
	natsBin := natsCLI(t)
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	spec := testenv.WriteJob(t, testenv.Job{Shards: 4, Command: []string{"cp", "{input}", "{out}/"}})
	env.Submit(spec, coordinator.SubmitOptions{})
	natsJSON := func(args ...string) map[string]any {
		t.Helper()
		out, err := exec.Command(natsBin, append(append([]string{"-s", env.URL}, args...), "--json")...).CombinedOutput()
		if err != nil {
			t.Fatalf("nats %v: %v\n%s", args, err, out)
		}
		var v map[string]any
		if err := json.Unmarshal(out, &v); err != nil {
			t.Fatalf("nats %v: not JSON: %s", args, out)
		}
		return v
	}
	// Queued, nothing running: the stream holds every shard.
	si := natsJSON("stream", "info", stream.StreamShards)
	if msgs := si["state"].(map[string]any)["messages"].(float64); msgs != 4 {
		t.Fatalf("nats stream info: %v messages, want 4", msgs)
	}
	out, err := exec.Command(natsBin, "-s", env.URL, "consumer", "ls", stream.StreamShards, "--names").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "cpu" {
		t.Fatalf("nats consumer ls: got %q (%v), want the cpu consumer", out, err)
	}
	env.StartWorker("", map[string]int{"cpu": 2})
	env.WaitState("t", 30*time.Second, stream.RunComplete)
	si = natsJSON("stream", "info", stream.StreamShards)
	if msgs := si["state"].(map[string]any)["messages"].(float64); msgs != 0 {
		t.Fatalf("nats stream info after completion: %v messages, want 0 (work queue)", msgs)
	}
	raw, err := exec.Command(natsBin, "-s", env.URL, "kv", "get", stream.BucketShards, "t.s0002", "--raw").CombinedOutput()
	if err != nil {
		t.Fatalf("nats kv get: %v\n%s", err, raw)
	}
	var rec stream.ShardRecord
	if err := stream.Decode(raw, &rec); err != nil {
		t.Fatalf("nats kv get value: %v\n%s", err, raw)
	}
	p := testenv.Start(t, "status", "--server", env.URL, "--json", "t")
	if code := p.Wait(t, 20*time.Second); code != 0 {
		t.Fatalf("status: exit %d\n%s", code, p.Output())
	}
	var st coordinator.Status
	if err := json.Unmarshal([]byte(p.Output()), &st); err != nil {
		t.Fatalf("status --json: %v\n%s", err, p.Output())
	}
	if len(st.Runs) != 1 || st.Runs[0].State != stream.RunComplete || st.Runs[0].Counts.Validated != 4 {
		t.Fatalf("status: got %+v, want t COMPLETE with 4 validated", st.Runs)
	}
	// With the verdict, what the shards took: in the run record, which
	// the nats CLI reads as status does, and on status's text.
	if tm := st.Runs[0].Timing; tm == nil || tm.Shards != 4 || tm.Seconds.Max <= 0 || tm.Seconds.MaxShard == "" {
		t.Fatalf("status --json: timing %+v, want that of 4 shards", tm)
	}
	raw, err = exec.Command(natsBin, "-s", env.URL, "kv", "get", stream.BucketRuns, "t", "--raw").CombinedOutput()
	var run stream.RunRecord
	if err != nil || stream.Decode(raw, &run) != nil || !reflect.DeepEqual(run.Timing, st.Runs[0].Timing) {
		t.Fatalf("nats kv get %s t: timing %+v (%v), status says %+v\n%s", stream.BucketRuns, run.Timing, err, st.Runs[0].Timing, raw)
	}
	if p := testenv.Start(t, "status", "--server", env.URL, "t"); p.Wait(t, 20*time.Second) != 0 || !strings.Contains(p.Output(), "\nt: shards 4 timed: ") {
		t.Fatalf("status of a COMPLETE run does not say what its shards took:\n%s", p.Output())
	}
	if c := st.Coordinator; c == nil || c.Sync != stream.SyncGroup || c.BootID != stream.BootID("/proc") {
		t.Fatalf("status coordinator: got %+v, want this host's boot with group sync", c)
	}
	if rec.State != stream.ShardValidated || rec.Fingerprint != st.Runs[0].Fingerprint {
		t.Fatalf("nats kv get says %s/%s, status says validated/%s", rec.State, rec.Fingerprint, st.Runs[0].Fingerprint)
	}
	kvInfo := natsJSON("stream", "info", "KV_"+stream.BucketLeases)
	if ttl, ok := kvInfo["config"].(map[string]any)["max_age"].(float64); !ok || ttl != float64(3*time.Second) {
		t.Fatalf("nats kv info %s: max_age %v, want the 3s lease TTL", stream.BucketLeases, kvInfo["config"])
	}
}

// TestImpossibleShardBlocksBeforeQueuing: a class that needs more memory
// than this host has makes `run` BLOCKED before anything is queued.
func TestImpossibleShardBlocksBeforeQueuing(t *testing.T) {
	data := t.TempDir()
	spec := testenv.WriteJob(t, testenv.Job{Shards: 3, Command: []string{"true"},
		Extra: "[class.huge]\ncpus = 1\nmemory = \"64TiB\"\n",
		Line: func(i int, in string) string {
			if i == 1 {
				return `{"id":"giant","inputs":["` + in + `"],"class":"huge"}`
			}
			return `{"id":"s` + string(rune('0'+i)) + `","inputs":["` + in + `"]}`
		}})
	p := testenv.Start(t, "run", "--data", data, spec)
	if code := p.Wait(t, 30*time.Second); code != 3 {
		t.Fatalf("exit %d, want 3 (BLOCKED)\n%s", code, p.Output())
	}
	for _, want := range []string{"BLOCKED before queuing", "giant", "memory", "no worker here can ever run it"} {
		if !strings.Contains(p.Output(), want) {
			t.Errorf("output lacks %q:\n%s", want, p.Output())
		}
	}
	if n := strings.Count(p.Output(), "no worker here can ever run it"); n != 1 {
		t.Errorf("the reason appears %d times on one pipe, want once (the plan's line; the error points to it):\n%s", n, p.Output())
	}
	if _, err := os.Stat(filepath.Join(data, "runs", "t", "plan.json")); err != nil {
		t.Errorf("plan.json: %v", err)
	}
	for _, store := range []string{filepath.Join(data, "stores"), filepath.Join(data, "jetstream")} {
		if _, err := os.Stat(store); err == nil {
			t.Errorf("a JetStream store was created (%s): something was queued", store)
		}
	}
}

// TestScratchNoDiskHoldsBlocksBeforeQueuing: a class declaring more
// scratch than the whole file system of the scratch directory would fail
// every attempt unrun; `run` says so before anything is queued, as for
// a memory no host here has.
func TestScratchNoDiskHoldsBlocksBeforeQueuing(t *testing.T) {
	data, scratch := t.TempDir(), t.TempDir()
	spec := testenv.WriteJob(t, testenv.Job{Shards: 2, Command: []string{"true"}, Extra: "[class.cpu]\nscratch = \"4096TiB\"\n"})
	p := testenv.Start(t, "run", "--data", data, "--scratch", scratch, spec)
	if code := p.Wait(t, 30*time.Second); code != 3 {
		t.Fatalf("exit %d, want 3 (BLOCKED)\n%s", code, p.Output())
	}
	for _, want := range []string{"BLOCKED before queuing", "shard s0000 (class cpu) declares 4.0PiB of scratch, more than the whole file system of its scratch directory holds (", "statfs " + scratch + "):", "no worker here can ever run it"} {
		if !strings.Contains(p.Output(), want) {
			t.Errorf("output lacks %q:\n%s", want, p.Output())
		}
	}
	if _, err := os.Stat(filepath.Join(data, "stores")); err == nil {
		t.Errorf("a JetStream store was created: something was queued")
	}
}

// TestSubmitBlocksWhatNoLiveWorkerCanRun: submit judges classes against the
// hard limits live workers report, not the submitting host: their memory,
// and the size of their scratch file system for a class's declared
// scratch (which the worker would otherwise fail unrun at every attempt).
func TestSubmitBlocksWhatNoLiveWorkerCanRun(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		st, err := coordinator.ReadStatus(context.Background(), env.JS, "")
		return err == nil && len(st.Workers) == 1 && st.Workers[0].Headroom["memory_hard"].Value > 0 && st.Workers[0].Headroom["scratch_hard"].Value > 0,
			"no worker report with hard limits and a scratch size yet"
	})
	for _, c := range []struct{ class, want string }{
		{"[class.huge]\ncpus = 1\nmemory = \"64TiB\"\n", "of memory"},
		{"[class.huge]\ncpus = 1\nscratch = \"4096TiB\"\n", "declares 4.0PiB of scratch, more than the whole file system of its scratch directory holds ("},
	} {
		spec := testenv.WriteJob(t, testenv.Job{Shards: 2, Command: []string{"true"}, Extra: c.class,
			Line: func(i int, in string) string {
				return fmt.Sprintf(`{"id":"x%d","inputs":[%q],"class":"huge"}`, i, in)
			}})
		p := testenv.Start(t, "submit", "--server", env.URL, spec)
		if code := p.Wait(t, 30*time.Second); code != 3 {
			t.Fatalf("%sexit %d, want 3\n%s", c.class, code, p.Output())
		}
		if !strings.Contains(p.Output(), "fits no live worker: w1: ") || !strings.Contains(p.Output(), c.want) {
			t.Fatalf("%soutput lacks the reason per worker (%q):\n%s", c.class, c.want, p.Output())
		}
		s, _ := env.JS.Stream(context.Background(), stream.StreamShards)
		if info, _ := s.Info(context.Background()); info.State.Msgs != 0 {
			t.Fatalf("%s%d messages queued for a blocked run", c.class, info.State.Msgs)
		}
	}
	st := testenv.Start(t, "status", "--server", env.URL)
	if code := st.Wait(t, 30*time.Second); code != 0 || !regexp.MustCompile(`scratch [0-9.]+[KMGTP]?i?B free of [0-9.]+[KMGTP]?i?B \(statfs /`).MatchString(st.Output()) {
		t.Fatalf("status: exit %d; want the worker's scratch room and size:\n%s", code, st.Output())
	}
}

// TestRunSaysWhyItsShardsWait: a run whose shards wait with none running
// says why in its progress, in the worker's words: here another run holds
// the whole host's CPUs.
func TestRunSaysWhyItsShardsWait(t *testing.T) {
	pf := testenv.Start(t, "preflight", "--json")
	if code := pf.Wait(t, 30*time.Second); code != 0 {
		t.Fatalf("preflight: exit %d\n%s", code, pf.Output())
	}
	var snap probe.Snapshot
	if err := json.Unmarshal([]byte(pf.Output()), &snap); err != nil {
		t.Fatalf("preflight --json: %v", err)
	}
	// At least one: on a loaded machine (others' CPU use counts against
	// the budget) the effective budget can be under a CPU, which a spec
	// cannot declare.
	cpus := max(snap.Budget.CPU.Effective.N/1000, 1)
	// The first run's shard holds the host until the test opens its gate,
	// once the second run has said why it waits (it slept 12 s, which a
	// slow machine could outlast before the second run's first line).
	gate := testenv.NewGate(t)
	whole := testenv.WriteJob(t, testenv.Job{Name: "whole", Shards: 1, Command: gate.Wait(),
		Extra: fmt.Sprintf("[class.cpu]\ncpus = %d\nmemory = \"64MiB\"\n", cpus)})
	first := testenv.Start(t, "run", "--data", t.TempDir(), whole)
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		return strings.Contains(first.Output(), "1 running"), first.Output()
	})
	small := testenv.WriteJob(t, testenv.Job{Name: "small", Shards: 1, Command: []string{"true"}, Extra: "[class.cpu]\ncpus = 1\nmemory = \"64MiB\"\n"})
	second := testenv.Start(t, "run", "--data", t.TempDir(), small)
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		return strings.Contains(second.Output(), "waiting: "), "second run, want a line saying it waits for the host the first run holds:\n" + second.Output()
	})
	if second.Exited() {
		t.Fatalf("the second run ended while the first held the host:\n%s", second.Output())
	}
	gate.Open()
	if code := second.Wait(t, 60*time.Second); code != 0 || !strings.Contains(second.Output(), "shared with") {
		t.Fatalf("second run: exit %d, want 0 once the first run's shard ended, and its wait naming the host's share\n%s", code, second.Output())
	}
	if code := first.Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("first run: exit %d\n%s", code, first.Output())
	}
}

// TestJobsGetTheBinaryUnderAnyName: SHARDPOOL_BIN names the running
// binary even when it is installed under another name and is not on PATH,
// so that a job's "$SHARDPOOL_BIN ckpt commit" runs this shardpool.
func TestJobsGetTheBinaryUnderAnyName(t *testing.T) {
	b, err := os.ReadFile(testenv.Binary(t))
	if err != nil {
		t.Fatal(err)
	}
	renamed := filepath.Join(t.TempDir(), "shardpool-1.4")
	if err := os.WriteFile(renamed, b, 0o755); err != nil {
		t.Fatal(err)
	}
	spec := testenv.WriteJob(t, testenv.Job{Shards: 1,
		Command: []string{"sh", "-c", `echo "$SHARDPOOL_BIN" > "$1/bin"; "$SHARDPOOL_BIN" ckpt commit "$1/ckpt" "$1/bin" > /dev/null`, "sh", "{out}"}})
	p := testenv.StartCmd(t, "env", "PATH=/usr/bin:/bin", renamed, "run", "--quiet", "--data", t.TempDir(), spec)
	if code := p.Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("run under another name: exit %d\n%s", code, p.Output())
	}
	got, err := os.ReadFile(filepath.Join(filepath.Dir(spec), "out", "s0000", "bin"))
	if err != nil || strings.TrimSpace(string(got)) != renamed {
		t.Fatalf("SHARDPOOL_BIN: %q, %v; want %s", got, err, renamed)
	}
}

// TestEditedJobIsANewGenerationAndSaysSo: the natural next step after a
// BLOCKED run is to fix the job script and retry the failed shards. An
// edited script is a new generation, which would run every shard again:
// `run --retry-failed` refuses (exit 1, naming the file) and changes
// nothing; `run` without the flag starts the new generation and says what
// it replaces, why, and that committed outputs are made again.
func TestEditedJobIsANewGenerationAndSaysSo(t *testing.T) {
	data, dir := t.TempDir(), t.TempDir()
	job := filepath.Join(dir, "job.sh")
	write := func(body string) {
		if err := os.WriteFile(job, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write(`case "$1" in *bad*) exit 3;; esac; echo ok > "$2/r"`)
	os.WriteFile(filepath.Join(dir, "manifest.jsonl"), []byte("{\"id\":\"good\"}\n{\"id\":\"bad\"}\n"), 0o644)
	spec := filepath.Join(dir, "shardpool.toml")
	os.WriteFile(spec, []byte("name = \"edit\"\nmanifest = \"manifest.jsonl\"\noutput = \"out\"\ncommand = [\"./job.sh\", \"{id}\", \"{out}\"]\nretries = 0\ncode_rev = \"x\"\n"), 0o644)
	p := testenv.Start(t, "run", "--data", data, "--slots", "2", spec)
	if code := p.Wait(t, 60*time.Second); code != 3 {
		t.Fatalf("first run: exit %d, want 3 (BLOCKED)\n%s", code, p.Output())
	}
	good := filepath.Join(dir, "out", "good", checkpoint.MarkerName)
	before, err := checkpoint.ReadMarker(filepath.Dir(good))
	if err != nil {
		t.Fatalf("the good shard's output: %v", err)
	}

	write(`echo ok > "$2/r"`)
	p = testenv.Start(t, "run", "--data", data, "--slots", "2", "--retry-failed", spec)
	if code := p.Wait(t, 60*time.Second); code != 1 || !strings.Contains(p.Output(), "changed: file ./job.sh") ||
		!strings.Contains(p.Output(), "leave out --retry-failed") {
		t.Fatalf("retry with an edited job: exit %d, want 1 and the refusal naming the file\n%s", code, p.Output())
	}
	if mk, err := checkpoint.ReadMarker(filepath.Dir(good)); err != nil || mk.Fingerprint != before.Fingerprint {
		t.Fatalf("the refused retry touched a committed output: %+v (%v)", mk, err)
	}

	p = testenv.Start(t, "run", "--data", data, "--slots", "2", spec)
	if code := p.Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("run of the new generation: exit %d, want 0\n%s", code, p.Output())
	}
	for _, want := range []string{"replaces " + before.Fingerprint + "; changed: file ./job.sh",
		"every shard runs again: the 1 output(s) committed by generation " + before.Fingerprint + " are made again"} {
		if !strings.Contains(p.Output(), want) {
			t.Fatalf("new generation's run does not say %q:\n%s", want, p.Output())
		}
	}
	if mk, err := checkpoint.ReadMarker(filepath.Dir(good)); err != nil || mk.Fingerprint == before.Fingerprint {
		t.Fatalf("the good shard was not made again under the new generation: %+v (%v)", mk, err)
	}
}

// TestAnotherJobOfTheSameNameIsRefused: two projects whose runs are both
// named "eval", run with one state directory (the default one, most
// often). The second used to be taken as a new generation of the first:
// it said the first's outputs would be made again (nothing touched them,
// in the other project's directory) and took over the run's records and
// evidence. It is refused before anything is queued, naming the other
// job and where each has its outputs, and the first run's evidence is
// left as it was.
func TestAnotherJobOfTheSameNameIsRefused(t *testing.T) {
	data := t.TempDir()
	first := testenv.WriteJob(t, testenv.Job{Name: "eval", Shards: 2, Command: []string{"cp", "{input}", "{out}/copy"}})
	p := testenv.Start(t, "run", "--data", data, "--slots", "2", first)
	if code := p.Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("the first project's run: exit %d\n%s", code, p.Output())
	}
	evidence := filepath.Join(data, "runs", "eval")
	read := func() map[string]string {
		files := map[string]string{}
		for _, name := range []string{"plan.json", "final.json", "resume.txt"} {
			b, err := os.ReadFile(filepath.Join(evidence, name))
			if err != nil {
				t.Fatalf("the first run's evidence: %v", err)
			}
			files[name] = string(b)
		}
		return files
	}
	before := read()

	second := testenv.WriteJob(t, testenv.Job{Name: "eval", Shards: 3, Command: []string{"cat", "{input}"}})
	p = testenv.Start(t, "run", "--data", data, "--slots", "2", second)
	code := p.Wait(t, 60*time.Second)
	firstOut, secondOut := filepath.Join(filepath.Dir(first), "out"), filepath.Join(filepath.Dir(second), "out")
	for _, want := range []string{second + `:3: field "output"`, "run eval is generation", "of " + first, "outputs in " + firstOut,
		"names " + secondOut, "Give this run another name"} {
		if code != 1 || !strings.Contains(p.Output(), want) {
			t.Fatalf("another project's run of the same name: exit %d, want 1 and %q\n%s", code, want, p.Output())
		}
	}
	if strings.Contains(p.Output(), "made again") {
		t.Fatalf("the refused run says outputs are made again:\n%s", p.Output())
	}
	for name, was := range before {
		if now := read()[name]; now != was {
			t.Fatalf("the refused run rewrote the first run's %s:\nwas %s\nnow %s", name, was, now)
		}
	}
	ents, _ := os.ReadDir(secondOut)
	for _, e := range ents {
		if e.Name() != ".shardpool" { // the lock of a run of the name in this directory, left as others are
			t.Fatalf("the refused run left %s in its output directory", e.Name())
		}
	}
	// profile and plan of the second project would write into the same
	// evidence: profile is refused before it measures anything, plan shows
	// its plan and keeps the first run's plan.json.
	p = testenv.Start(t, "profile", "--data", data, second)
	if code := p.Wait(t, 60*time.Second); code != 1 || !strings.Contains(p.Output(), "is another job's: its outputs are in "+firstOut) ||
		!strings.Contains(p.Output(), "shardpool forget --data "+data+" eval") || strings.Contains(p.Output(), "SAMPLE") {
		t.Fatalf("profile of another job of the name: exit %d, want 1 naming the first job's output and forget, before any sample\n%s", code, p.Output())
	}
	p = testenv.Start(t, "plan", "--data", data, second)
	if code := p.Wait(t, 60*time.Second); code != 0 || !strings.Contains(p.Output(), "plan.json not written: ") || !strings.Contains(p.Output(), "CLASS") {
		t.Fatalf("plan of another job of the name: exit %d, want 0 with the plan, saying plan.json was not written\n%s", code, p.Output())
	}
	for name, was := range before {
		if now := read()[name]; now != was {
			t.Fatalf("profile or plan of the other job rewrote the first run's %s:\nwas %s\nnow %s", name, was, now)
		}
	}
	// The first project's run goes on as its own: run again, it verifies
	// its outputs and is COMPLETE.
	p = testenv.Start(t, "run", "--data", data, "--slots", "2", first)
	if code := p.Wait(t, 60*time.Second); code != 0 || !strings.Contains(p.Output(), "0 published") {
		t.Fatalf("the first project's run again: exit %d, want 0 with nothing published\n%s", code, p.Output())
	}
	// Forgotten, as the refusals advise: the evidence says so (status
	// --data), and the name is free for the second project.
	p = testenv.Start(t, "forget", "--data", data, "eval")
	if code := p.Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("forget: exit %d\n%s", code, p.Output())
	}
	p = testenv.Start(t, "status", "--data", data)
	if code := p.Wait(t, 30*time.Second); code != 0 || !strings.Contains(p.Output(), "eval: forgotten ") {
		t.Fatalf("status --data of a forgotten run: exit %d, want 0 saying it was forgotten\n%s", code, p.Output())
	}
	p = testenv.Start(t, "status", "--data", data, "--json")
	var doc coordinator.Status
	if code := p.Wait(t, 30*time.Second); code != 0 || json.Unmarshal([]byte(p.Output()), &doc) != nil || len(doc.Runs) != 1 || doc.Runs[0].Forgotten.IsZero() {
		t.Fatalf("status --data --json of a forgotten run: exit %d, want its run with \"forgotten\"\n%s", code, p.Output())
	}
	p = testenv.Start(t, "plan", "--data", data, second)
	if code := p.Wait(t, 60*time.Second); code != 0 || strings.Contains(p.Output(), "not written") {
		t.Fatalf("plan of the second job once the name is forgotten: exit %d, want 0 and plan.json written\n%s", code, p.Output())
	}
	p = testenv.Start(t, "run", "--data", data, "--slots", "2", second)
	if code := p.Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("the second project's run once the name is forgotten: exit %d\n%s", code, p.Output())
	}
	if _, err := os.Stat(filepath.Join(evidence, coordinator.ForgottenName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s stayed in the evidence of the run that took the name (%v)", coordinator.ForgottenName, err)
	}
}

// TestStatusFindsTheRunFromItsData: a `shardpool run` serves its
// coordinator on a port of its own choosing. `status --data DIR` finds it
// while it runs, and reports the run's last verdict from its evidence
// once it has ended; a run killed before any verdict is reported as such,
// with its resume command.
func TestStatusFindsTheRunFromItsData(t *testing.T) {
	data := t.TempDir()
	// Retries: the attempt the SIGKILL below cuts short counts.
	slow := testenv.WriteJob(t, testenv.Job{Name: "slow", Shards: 4, Retries: 2, Command: []string{"sleep", "3"}})
	status := func(args ...string) (int, string) {
		p := testenv.Start(t, append([]string{"status", "--data", data}, args...)...)
		return p.Wait(t, 30*time.Second), p.Output()
	}
	p := testenv.Start(t, "run", "--data", data, "--slots", "1", slow)
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		code, out := status("slow")
		return code == 0 && strings.Contains(out, "RUNNING"), fmt.Sprintf("status --data of a live run: exit %d\n%s", code, out)
	})
	if code, out := status("--json"); code != 0 || !strings.Contains(out, `"name": "slow"`) {
		t.Fatalf("status --data --json of a live run: exit %d, want 0 and the status document\n%s", code, out)
	}
	if code, out := status("--server", "nats://127.0.0.1:1"); code != 2 {
		t.Fatalf("status with --data and --server: exit %d, want 2\n%s", code, out)
	}
	killRunning(t, p, data, "slow")
	code, out := status()
	if code != 0 || !strings.Contains(out, "slow: no verdict recorded: stopped while RUNNING") || !regexpMatch(`slow\s+stopped\s+4\s+0\s+0\s`, out) ||
		!strings.Contains(out, "resume with: shardpool run --data "+data) {
		t.Fatalf("status --data of a killed run: exit %d, want 0, no verdict, its last counts (stopped, 4 shards, none validated) and the resume command\n%s", code, out)
	}
	code, out = status("--json")
	var doc coordinator.Status
	if err := json.Unmarshal([]byte(out), &doc); code != 0 || err != nil || doc.From != "evidence" || len(doc.NoVerdict) != 1 ||
		doc.NoVerdict[0].Name != "slow" || !strings.Contains(doc.NoVerdict[0].Resume, "shardpool run --data "+data) ||
		doc.NoVerdict[0].State != stream.RunRunning || doc.NoVerdict[0].Counts == nil || doc.NoVerdict[0].Counts.Total != 4 {
		t.Fatalf("status --data --json of a killed run: exit %d (%v), want 0 and a document from evidence naming the run without a verdict, its state and counts when last recorded and its resume command\n%s", code, err, out)
	}
	first := doc.NoVerdict[0].Fingerprint
	p = testenv.Start(t, "run", "--data", data, "--slots", "4", slow)
	if code := p.Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("resumed run: exit %d\n%s", code, p.Output())
	}
	code, out = status("slow")
	if code != 0 || !strings.Contains(out, "no coordinator serves") || !regexpMatch(`slow\s+COMPLETE\s+4\s+4\s+0`, out) {
		t.Fatalf("status --data of a finished run: exit %d, want 0 and COMPLETE 4 of 4 from final.json\n%s", code, out)
	}
	code, out = status("slow", "--json")
	doc = coordinator.Status{}
	if err := json.Unmarshal([]byte(out), &doc); code != 0 || err != nil || len(doc.Runs) != 1 || doc.Runs[0].State != stream.RunComplete ||
		doc.Runs[0].Counts.Validated != 4 || len(doc.NoVerdict) != 0 {
		t.Fatalf("status --data --json of a finished run: exit %d (%v), want run slow COMPLETE with 4 validated\n%s", code, err, out)
	}
	if code, out := status("other"); code != 1 || !strings.Contains(out, "no evidence of run other") {
		t.Fatalf("status --data of an unknown run: exit %d, want 1\n%s", code, out)
	}

	// A new generation of the finished run, killed: its final.json is the
	// old generation's COMPLETE, which must not be reported as the run's.
	// (Beside the spec, with the same output: a new generation elsewhere
	// is refused.)
	body, err := os.ReadFile(slow)
	if err != nil || !strings.Contains(string(body), `["sleep","3"]`) {
		t.Fatalf("the spec of run slow lacks its command: %v\n%s", err, body)
	}
	edited := filepath.Join(filepath.Dir(slow), "edited.toml")
	if err := os.WriteFile(edited, []byte(strings.Replace(string(body), `["sleep","3"]`, `["sleep","2"]`, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	p = testenv.Start(t, "run", "--data", data, "--slots", "1", edited)
	killRunning(t, p, data, "slow")
	code, out = status("slow")
	if code != 0 || regexpMatch(`slow\s+COMPLETE`, out) || !regexpMatch(`slow\s+stopped\s+4\s`, out) ||
		!strings.Contains(out, "final.json holds the verdict of generation "+first+", which this one replaced: COMPLETE 4/4") {
		t.Fatalf("status --data of a killed new generation: exit %d, want 0, the run stopped and the older verdict named as another generation's\n%s", code, out)
	}
	code, out = status("slow", "--json")
	doc = coordinator.Status{}
	if err := json.Unmarshal([]byte(out), &doc); code != 0 || err != nil || len(doc.Runs) != 0 || len(doc.NoVerdict) != 1 ||
		doc.NoVerdict[0].Previous == nil || doc.NoVerdict[0].Previous.State != stream.RunComplete ||
		doc.NoVerdict[0].Previous.Fingerprint != first || doc.NoVerdict[0].Fingerprint == first {
		t.Fatalf("status --data --json of a killed new generation: exit %d (%v), want no verdict, and the previous one of generation %s\n%s", code, err, first, out)
	}
}

// killRunning SIGKILLs the `run` p once its coordinator has recorded run
// `name` RUNNING in the run's progress.json.
func killRunning(t *testing.T, p *testenv.Proc, data, name string) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		pr, err := coordinator.ReadProgress(filepath.Join(data, "runs", name))
		return err == nil && pr != nil && pr.State == stream.RunRunning, fmt.Sprintf("progress.json of %s: %+v, %v", name, pr, err)
	})
	p.Signal(syscall.SIGKILL)
	p.Wait(t, 10*time.Second)
}

// TestInterruptedRunTellsWhereItStood: a `run` stopped with SIGINT leaves
// in progress.json the counts of what its worker finished before it
// stopped, and `status --data` reports them: as many validated as there
// are committed outputs, none running. The run's own last lines say them
// too.
func TestInterruptedRunTellsWhereItStood(t *testing.T) {
	data := t.TempDir()
	spec := testenv.WriteJob(t, testenv.Job{Name: "brief", Shards: 40, Command: []string{"sleep", "0.1"}})
	p := testenv.Start(t, "run", "--data", data, "--slots", "2", spec)
	evidence := filepath.Join(data, "runs", "brief")
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		pr, err := coordinator.ReadProgress(evidence)
		return err == nil && pr != nil && pr.Counts.Validated >= 4, fmt.Sprintf("progress.json: %+v, %v", pr, err)
	})
	p.Signal(syscall.SIGINT)
	if code := p.Wait(t, 30*time.Second); code != 130 {
		t.Fatalf("interrupted run: exit %d, want 130\n%s", code, p.Output())
	}
	markers, err := filepath.Glob(filepath.Join(filepath.Dir(spec), "out", "*", checkpoint.MarkerName))
	if err != nil {
		t.Fatal(err)
	}
	st := testenv.Start(t, "status", "--data", data, "--json", "brief")
	code := st.Wait(t, 30*time.Second)
	var doc coordinator.Status
	if err := json.Unmarshal([]byte(st.Output()), &doc); code != 0 || err != nil || len(doc.NoVerdict) != 1 || doc.NoVerdict[0].Counts == nil {
		t.Fatalf("status --data --json of an interrupted run: exit %d (%v), want its last counts\n%s", code, err, st.Output())
	}
	c := doc.NoVerdict[0].Counts
	if c.Validated != len(markers) || c.Running != 0 || c.Validated+c.Pending != 40 || len(markers) == 40 {
		t.Fatalf("interrupted run: recorded %+v with %d committed outputs, want as many validated as outputs, none running, some pending", *c, len(markers))
	}
	if want := fmt.Sprintf("interrupted at %d/40 validated; state is kept in %s", len(markers), data); !strings.Contains(p.Output(), want) {
		t.Fatalf("interrupted run: want %q, the counts status --data gives\n%s", want, p.Output())
	}
}

// TestSecondInterruptEndsTheDrainAtOnce: an interrupted run drains (its
// children get SIGTERM and --grace to end). Before, it printed nothing
// until the grace was over, and a second Ctrl-C did nothing; with a child
// that ignores SIGTERM that was the whole grace period of silence. Now
// the first interrupt says what happens and how to cut it short, and the
// second kills the children at once. The killed attempt is not charged:
// with retries = 0, the resumed run completes.
func TestSecondInterruptEndsTheDrainAtOnce(t *testing.T) {
	data, dir := t.TempDir(), t.TempDir()
	spec := testenv.WriteJob(t, testenv.Job{Name: "stubborn", Shards: 1, Retries: 0,
		Command: []string{"sh", "-c", `if [ -f "$1/ran" ]; then echo ok > "$2/r"; exit 0; fi; echo $$ > "$1/ran"; trap "" TERM; sleep 60`, "sh", dir, "{out}"}})
	p := testenv.Start(t, "run", "--data", data, "--slots", "1", "--grace", "60s", spec)
	ran := filepath.Join(dir, "ran")
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		_, err := os.Stat(ran)
		return err == nil, "the shard has not started"
	})
	p.SignalMain(syscall.SIGINT)
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		out := p.Output()
		return strings.Contains(out, "stopping: 1 running shard(s) get SIGTERM and 1m0s to end") && strings.Contains(out, "interrupt again to kill them now"),
			"no word of the drain after the first interrupt:\n" + out
	})
	start := time.Now()
	p.SignalMain(syscall.SIGINT)
	if code := p.Wait(t, 30*time.Second); code != 130 {
		t.Fatalf("exit %d, want 130\n%s", code, p.Output())
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("the second interrupt took %s to end the run, want it at once", d)
	}
	b, _ := os.ReadFile(ran)
	if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err != nil || syscall.Kill(pid, 0) == nil {
		t.Fatalf("the shard's process %q (%v) outlived the run", b, err)
	}
	if !strings.Contains(p.Output(), "stopping now") {
		t.Fatalf("output lacks the second interrupt's line:\n%s", p.Output())
	}
	again := testenv.Start(t, "run", "--data", data, "--slots", "1", spec)
	if code := again.Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("resume: exit %d, want 0 (the killed attempt not charged)\n%s", code, again.Output())
	}
}

func regexpMatch(re, s string) bool { return regexp.MustCompile(re).MatchString(s) }

// TestStatusWithNoFlagsFindsARunningRun: `shardpool run job.toml` in one
// terminal and `shardpool status` in another, no flags: nothing listens at
// the default URL, so status asks the coordinator serving the default
// state directory.
func TestStatusWithNoFlagsFindsARunningRun(t *testing.T) {
	t.Setenv("XDG_STATE_HOME", t.TempDir())
	slow := testenv.WriteJob(t, testenv.Job{Name: "slow", Shards: 2, Command: []string{"sleep", "3"}})
	testenv.Start(t, "run", "--slots", "1", slow)
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		p := testenv.Start(t, "status")
		code := p.Wait(t, 30*time.Second)
		return code == 0 && regexpMatch(`slow\s+RUNNING`, p.Output()), fmt.Sprintf("status with no flags: exit %d\n%s", code, p.Output())
	})
}

// TestStatusAndForgetWithNoFlagsAfterTheRunEnded: once `shardpool run
// job.toml` has ended, `shardpool status` with no flags reports the
// default state directory's evidence (as --data would) instead of failing
// on the default URL, and `shardpool forget RUN` with no flags forgets the
// run in its store there.
func TestStatusAndForgetWithNoFlagsAfterTheRunEnded(t *testing.T) {
	state := t.TempDir()
	t.Setenv("XDG_STATE_HOME", state)
	job := testenv.WriteJob(t, testenv.Job{Name: "ended", Shards: 2, Command: []string{"cp", "{input}", "{out}/"}})
	if p := testenv.Start(t, "run", "--slots", "2", job); p.Wait(t, 60*time.Second) != 0 {
		t.Fatalf("run: %s", p.Output())
	}
	p := testenv.Start(t, "status")
	if code := p.Wait(t, 30*time.Second); code != 0 || !regexpMatch(`ended\s+COMPLETE\s+2\s+2\s+0`, p.Output()) ||
		!strings.Contains(p.Output(), "no coordinator serves "+filepath.Join(state, "shardpool")) {
		t.Fatalf("status with no flags after the run: exit %d, want 0 and the run's verdict from the default state directory\n%s", code, p.Output())
	}
	p = testenv.Start(t, "status", "--json", "ended")
	code := p.Wait(t, 30*time.Second)
	var st coordinator.Status
	if err := json.Unmarshal([]byte(p.Output()), &st); code != 0 || err != nil || st.From != "evidence" || len(st.Runs) != 1 || st.Runs[0].State != stream.RunComplete {
		t.Fatalf("status --json RUN with no flags after the run: exit %d (%v), want the run's verdict from its evidence\n%s", code, err, p.Output())
	}
	p = testenv.Start(t, "forget", "ended")
	if code := p.Wait(t, 30*time.Second); code != 0 || !strings.Contains(p.Output(), "forgotten: 2 shard record(s), 2 commit record(s)") {
		t.Fatalf("forget with no flags after the run: exit %d, want 0 and the records removed\n%s", code, p.Output())
	}
	p = testenv.Start(t, "forget", "ended")
	if code := p.Wait(t, 30*time.Second); code != 1 || !strings.Contains(p.Output(), "forget ended: run not found") {
		t.Fatalf("forget with no flags again: exit %d, want 1 and run not found\n%s", code, p.Output())
	}
	p = testenv.Start(t, "forget", "never")
	if code := p.Wait(t, 30*time.Second); code != 1 || !strings.Contains(p.Output(), "no coordinator answers at") {
		t.Fatalf("forget with no flags of a run that never ran: exit %d, want 1 and that nothing answers\n%s", code, p.Output())
	}
}

// TestStatusWithNoFlagsLooksPastAnotherUsersCoordinator: with a
// coordinator of someone else at the default URL (it asks for a token this
// user does not have), `shardpool status` with no flags still finds this
// user's `shardpool run` instead of failing on the refusal.
func TestStatusWithNoFlagsLooksPastAnotherUsersCoordinator(t *testing.T) {
	theirs, err := coordinator.New(coordinator.Config{DataDir: t.TempDir(), Listen: strings.TrimPrefix(nats.DefaultURL, "nats://"), Auth: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := theirs.Start(context.Background()); err != nil {
		if errors.Is(err, coordinator.ErrConfig) && strings.Contains(err.Error(), "in use") {
			t.Skipf("the default URL's port is taken on this host: %v", err)
		}
		t.Fatal(err)
	}
	defer theirs.Close()
	t.Setenv("XDG_STATE_HOME", t.TempDir())
	slow := testenv.WriteJob(t, testenv.Job{Name: "mine", Shards: 1, Command: []string{"sleep", "5"}})
	testenv.Start(t, "run", slow)
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		p := testenv.Start(t, "status")
		code := p.Wait(t, 30*time.Second)
		return code == 0 && regexpMatch(`mine\s+RUNNING`, p.Output()), fmt.Sprintf("status with no flags: exit %d\n%s", code, p.Output())
	})
}

// TestRunLeavesItsHostsPreflightInTheEvidence: the worker of a run writes
// the host's whole preflight snapshot, the run's storage probed, to
// runs/<run>/preflight/<host>-<time>.json (DESIGN.md, "Evidence").
func TestRunLeavesItsHostsPreflightInTheEvidence(t *testing.T) {
	data := t.TempDir()
	spec := testenv.WriteJob(t, testenv.Job{Name: "pf", Shards: 2, Command: []string{"true"}})
	p := testenv.Start(t, "run", "--data", data, "--slots", "1", spec)
	if code := p.Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("run: exit %d\n%s", code, p.Output())
	}
	files, _ := filepath.Glob(filepath.Join(data, "runs", "pf", "preflight", "*.json"))
	if len(files) != 1 {
		t.Fatalf("preflight snapshots in the evidence: %v, want one", files)
	}
	host, _ := os.Hostname()
	if !strings.HasPrefix(filepath.Base(files[0]), host+"-") {
		t.Fatalf("snapshot %s is not named after the host %s", files[0], host)
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	var snap probe.Snapshot
	if err := json.Unmarshal(b, &snap); err != nil {
		t.Fatalf("%s: %v", files[0], err)
	}
	probed := map[string]string{}
	for _, s := range snap.Storage {
		probed[s.Name] = s.Path
	}
	out := filepath.Join(filepath.Dir(spec), "out")
	if snap.Hostname != host || snap.UsersSec <= 0 || probed["output"] != out || probed["inputs"] != filepath.Join(filepath.Dir(spec), "in") ||
		probed["state"] != data || probed["scratch"] == "" {
		t.Fatalf("snapshot of %s: users scanned %.3fs, storage %v; want this host, other users' load, and the run's output, inputs, state and scratch", snap.Hostname, snap.UsersSec, probed)
	}
}

// TestAnotherRunsOutputsAreNotReplaced: a second run given the first's
// output directory, with shard IDs in common and another command, does
// not replace the first run's outputs: those shards fail at once (no
// attempt, no retry) naming the other run, and the run is BLOCKED with
// the retry command. Once the user removes them, the retry completes.
func TestAnotherRunsOutputsAreNotReplaced(t *testing.T) {
	data := t.TempDir()
	a := testenv.WriteJob(t, testenv.Job{Name: "ra", Shards: 3, Retries: 2, Command: []string{"cp", "{input}", "{out}/copy"}})
	out := filepath.Join(filepath.Dir(a), "out")
	p := testenv.Start(t, "run", "--data", data, "--slots", "2", a)
	if code := p.Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("run ra: exit %d\n%s", code, p.Output())
	}
	before, err := os.ReadFile(filepath.Join(out, "s0001", "copy"))
	if err != nil {
		t.Fatal(err)
	}
	// Run rb: the same manifest and output, another command.
	b := filepath.Join(filepath.Dir(a), "b.toml")
	spec, _ := os.ReadFile(a)
	spec = []byte(strings.Replace(strings.Replace(string(spec), `name = "ra"`, `name = "rb"`, 1), `"cp"`, `"cat"`, 1))
	spec = []byte(strings.Replace(string(spec), `"{out}/copy"`, `"{input}"`, 1))
	if err := os.WriteFile(b, spec, 0o644); err != nil {
		t.Fatal(err)
	}
	p = testenv.Start(t, "run", "--data", data, "--slots", "2", b)
	if code := p.Wait(t, 60*time.Second); code != 3 {
		t.Fatalf("run rb over run ra's outputs: exit %d, want 3 (BLOCKED)\n%s", code, p.Output())
	}
	if out := p.Output(); !strings.Contains(out, "holds the output of run ra") || !strings.Contains(out, "--retry-failed") {
		t.Fatalf("run rb: output lacks the other run's name and the retry command\n%s", out)
	}
	after, err := os.ReadFile(filepath.Join(out, "s0001", "copy"))
	if err != nil || string(after) != string(before) {
		t.Fatalf("run ra's output after run rb: %q, %v; want it as ra left it", after, err)
	}
	final, err := coordinator.ReadFinal(filepath.Join(data, "runs", "rb"))
	if err != nil || final == nil || len(final.Shards) != 3 {
		t.Fatalf("run rb's final.json: %+v, %v; want 3 shards", final, err)
	}
	for _, sh := range final.Shards {
		if sh.State != stream.ShardFailed || sh.Attempts != 0 {
			t.Fatalf("rb's shard %s: %s after %d attempt(s), want failed without running", sh.ID, sh.State, sh.Attempts)
		}
	}
	// The user hands the directory over: the failed shards then run.
	for _, id := range []string{"s0000", "s0001", "s0002"} {
		os.RemoveAll(filepath.Join(out, id))
	}
	p = testenv.Start(t, "run", "--data", data, "--retry-failed", b)
	if code := p.Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("run rb --retry-failed after the outputs were removed: exit %d\n%s", code, p.Output())
	}
}

// TestRunRefusesAScratchItCannotUse: a scratch directory the worker cannot
// use is named before anything is queued, with the way out. Before, a
// user whose default scratch (in a shared /tmp) another user had made
// first saw every shard fail on "permission denied" after its retries.
func TestRunRefusesAScratchItCannotUse(t *testing.T) {
	tmp := t.TempDir()
	file := filepath.Join(tmp, "file")
	os.WriteFile(file, nil, 0o644)
	theirs, err := worker.DefaultScratchFor(probe.Policy{}, worker.DefaultName()) // under TMPDIR, set below for the child
	if err != nil {
		t.Fatal(err)
	}
	theirs = filepath.Join(tmp, filepath.Base(theirs))
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"given, a file", []string{"--scratch", file}, file},
		{"the default, another user's", nil, theirs + " belongs to uid 65534"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.args == nil {
				testenv.RequireRoot(t)
				os.Mkdir(theirs, 0o777)
				if err := os.Chown(theirs, 65534, 65534); err != nil {
					t.Fatal(err)
				}
				t.Setenv("TMPDIR", tmp)
			}
			spec := testenv.WriteJob(t, testenv.Job{Name: "scr", Shards: 1, Command: []string{"true"}})
			data := t.TempDir()
			p := testenv.Start(t, append(append([]string{"run", "--data", data}, tc.args...), spec)...)
			if code := p.Wait(t, 30*time.Second); code != 1 {
				t.Fatalf("exit %d, want 1\n%s", code, p.Output())
			}
			if out := p.Output(); !strings.Contains(out, tc.want) || !strings.Contains(out, "--scratch DIR") {
				t.Fatalf("output lacks %q and the way out (--scratch DIR):\n%s", tc.want, out)
			}
			if _, err := os.Stat(filepath.Join(data, "runs", "scr")); !os.IsNotExist(err) {
				t.Fatalf("a run was started (its evidence folder: %v)", err)
			}
		})
	}
}

// TestPolicyScratchIsWhereShardsRun: the policy file's scratch list was
// read and then used nowhere, so shards ran in $TMPDIR whatever it said.
// The first listed directory this host has holds the default scratch;
// a list of which this host has none refuses the run before anything is
// queued, rather than falling back to the /tmp the user meant to avoid.
func TestPolicyScratchIsWhereShardsRun(t *testing.T) {
	cfg := t.TempDir()
	local := t.TempDir()
	policy := filepath.Join(cfg, "shardpool", "policy.toml")
	os.MkdirAll(filepath.Dir(policy), 0o755)
	t.Setenv("XDG_CONFIG_HOME", cfg)
	missing := filepath.Join(local, "absent")

	os.WriteFile(policy, []byte(fmt.Sprintf("scratch = [%q, %q, \"/tmp\"]\n", missing, local)), 0o644)
	spec := testenv.WriteJob(t, testenv.Job{Name: "pol", Shards: 2, Command: []string{"sh", "-c", `echo "$1" > "$1/where"`, "sh", "{out}"}})
	data := t.TempDir()
	p := testenv.Start(t, "run", "--data", data, "--slots", "1", spec)
	if code := p.Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("exit %d, want 0\n%s", code, p.Output())
	}
	want := fmt.Sprintf("scratch: %s (from the scratch list of %s)", filepath.Join(local, fmt.Sprintf("shardpool-%s-%d", worker.DefaultName(), os.Getuid())), policy)
	if !strings.Contains(p.Output(), want) {
		t.Errorf("run does not say where its scratch is (%q):\n%s", want, p.Output())
	}
	out := filepath.Join(filepath.Dir(spec), "out")
	for _, id := range []string{"s0000", "s0001"} {
		b, err := os.ReadFile(filepath.Join(out, id, "where"))
		if err != nil {
			t.Fatal(err)
		}
		want := filepath.Join(local, fmt.Sprintf("shardpool-%s-%d", worker.DefaultName(), os.Getuid()), "pol") + "/"
		if got := strings.TrimSpace(string(b)); !strings.HasPrefix(got, want) {
			t.Errorf("%s ran in %s, want under %s (the policy's first scratch directory this host has)", id, got, want)
		}
	}

	os.WriteFile(policy, []byte(fmt.Sprintf("scratch = [%q]\n", missing)), 0o644)
	spec = testenv.WriteJob(t, testenv.Job{Name: "pol2", Shards: 1, Command: []string{"true"}})
	p = testenv.Start(t, "run", "--data", data, "--slots", "1", spec)
	if code := p.Wait(t, 30*time.Second); code != 1 {
		t.Fatalf("exit %d, want 1\n%s", code, p.Output())
	}
	if o := p.Output(); !strings.Contains(o, policy) || !strings.Contains(o, missing+" does not exist") || !strings.Contains(o, "--scratch DIR") {
		t.Fatalf("output lacks the policy, the missing directory and the way out:\n%s", o)
	}
	if _, err := os.Stat(filepath.Join(data, "runs", "pol2")); !os.IsNotExist(err) {
		t.Fatalf("a run was started (its evidence folder: %v)", err)
	}
}

// TestForgetCommand: `shardpool forget` removes a COMPLETE run from the
// coordinator's store and says what it removed and what it kept; the run
// is then unknown (exit 1), a missing name is a usage error (exit 2), and
// a submission right after publishes the shards again under IDs of their
// own, saying so, and completes.
func TestForgetCommand(t *testing.T) {
	env := testenv.New(t, testenv.Options{Slots: map[string]int{"cpu": 2}})
	spec := testenv.WriteJob(t, testenv.Job{Shards: 2, Command: []string{"cp", "{input}", "{out}/"}})
	env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("t", 30*time.Second, stream.RunComplete)

	p := testenv.Start(t, "forget", "--server", env.URL, "t")
	if code := p.Wait(t, 20*time.Second); code != 0 || !strings.Contains(p.Output(), "run t (COMPLETE") ||
		!strings.Contains(p.Output(), "forgotten: 2 shard record(s), 2 commit record(s)") || !strings.Contains(p.Output(), "kept: outputs "+filepath.Join(filepath.Dir(spec), "out")) {
		t.Fatalf("forget: exit %d, want 0 with what was removed and kept\n%s", code, p.Output())
	}
	p = testenv.Start(t, "forget", "--server", env.URL, "--json", "t")
	if code := p.Wait(t, 20*time.Second); code != 1 || !strings.Contains(p.Output(), "forget t: run not found") {
		t.Fatalf("forget again: exit %d, want 1 and run not found\n%s", code, p.Output())
	}
	p = testenv.Start(t, "forget", "--server", env.URL)
	if code := p.Wait(t, 20*time.Second); code != 2 {
		t.Fatalf("forget without a run: exit %d, want 2\n%s", code, p.Output())
	}
	p = testenv.Start(t, "submit", "--server", env.URL, spec)
	if code := p.Wait(t, 30*time.Second); code != 0 || !strings.Contains(p.Output(), "2 unfinished shard(s) had no queued message (a run forgotten and submitted again") {
		t.Fatalf("submit after forget: exit %d, want 0 and the shards published again\n%s", code, p.Output())
	}
	env.WaitState("t", 30*time.Second, stream.RunComplete)
}

// TestForgetWithDataOfARun: `forget --data DIR RUN` forgets a finished
// `shardpool run` whose process has ended by opening its store; it goes
// through the coordinator of a run that still runs (and is refused
// there), and refuses a run killed before its verdict. A run forgotten
// and run again reruns nothing committed.
func TestForgetWithDataOfARun(t *testing.T) {
	data := t.TempDir()
	forget := func(args ...string) (int, string) {
		p := testenv.Start(t, append([]string{"forget", "--data", data}, args...)...)
		return p.Wait(t, 30*time.Second), p.Output()
	}
	done := testenv.WriteJob(t, testenv.Job{Name: "done", Shards: 3, Command: []string{"cp", "{input}", "{out}/"}})
	p := testenv.Start(t, "run", "--data", data, "--slots", "2", done)
	if code := p.Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("run: exit %d\n%s", code, p.Output())
	}
	marker := filepath.Join(filepath.Dir(done), "out", "s0000", checkpoint.MarkerName)
	before, err := os.Stat(marker)
	if err != nil {
		t.Fatal(err)
	}

	// A run's store that no server has opened yet (a run starting now):
	// nothing to forget, and forget neither holds it nor makes a store
	// there. (It did, and a run starting at that moment failed as in use.)
	starting := filepath.Join(data, "stores", "slow")
	if err := os.MkdirAll(starting, 0o755); err != nil {
		t.Fatal(err)
	}
	if code, out := forget("slow"); code != 1 || !strings.Contains(out, "run not found") || !strings.Contains(out, "holds no records yet") {
		t.Fatalf("forget --data of a store not yet opened: exit %d, want 1 and no records yet\n%s", code, out)
	}
	if ents, err := os.ReadDir(starting); err != nil || len(ents) != 0 {
		t.Fatalf("forget --data of a store not yet opened wrote in it (%v): %v", err, ents)
	}

	slow := testenv.WriteJob(t, testenv.Job{Name: "slow", Shards: 2, Retries: 2, Command: []string{"sleep", "30"}})
	p = testenv.Start(t, "run", "--data", data, "--slots", "2", slow)
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		code, out := forget("slow")
		return code == 1 && strings.Contains(out, "it is RUNNING"), fmt.Sprintf("forget --data of a run that runs: exit %d, want 1 and refused as RUNNING\n%s", code, out)
	})
	killRunning(t, p, data, "slow")
	if code, out := forget("slow"); code != 1 || !strings.Contains(out, "it is RUNNING") {
		t.Fatalf("forget --data of a run killed while RUNNING: exit %d, want 1 and refused as RUNNING\n%s", code, out)
	}

	code, out := forget("done")
	if code != 0 || !strings.Contains(out, "run done (COMPLETE") || !strings.Contains(out, "forgotten: 3 shard record(s), 3 commit record(s)") ||
		!strings.Contains(out, "evidence "+filepath.Join(data, "runs", "done")) {
		t.Fatalf("forget --data of a finished run: exit %d, want 0 and what was removed and kept\n%s", code, out)
	}
	if code, out := forget("done"); code != 1 || !strings.Contains(out, "forget done: run not found") {
		t.Fatalf("forget --data again: exit %d, want 1 and run not found\n%s", code, out)
	}
	if code, out := forget("never"); code != 1 || !strings.Contains(out, "holds no store of it") {
		t.Fatalf("forget --data of a run never run there: exit %d, want 1 naming the stores looked for\n%s", code, out)
	}
	if code, out := forget("--server", "nats://127.0.0.1:1", "done"); code != 2 {
		t.Fatalf("forget with --data and --server: exit %d, want 2\n%s", code, out)
	}

	p = testenv.Start(t, "run", "--data", data, "--slots", "2", done)
	if code := p.Wait(t, 60*time.Second); code != 0 || !strings.Contains(p.Output(), "3 published") {
		t.Fatalf("run after forget: exit %d, want 0 with the shards published again\n%s", code, p.Output())
	}
	after, err := os.Stat(marker)
	if err != nil || !after.ModTime().Equal(before.ModTime()) {
		t.Fatalf("run after forget rewrote a committed output's marker (%v): %v then %v", err, before.ModTime(), after.ModTime())
	}
}

// TestBlockedReasonOnceOnOneScreen: a run that ends BLOCKED prints its
// reason in its summary on stdout; its error on stderr repeats the reason
// only where stderr is not where stdout goes (a terminal shows both, and
// the reason names up to a dozen shards). Separated, stderr alone says why.
func TestBlockedReasonOnceOnOneScreen(t *testing.T) {
	job := testenv.WriteJob(t, testenv.Job{Name: "fails", Shards: 1, Retries: 0, Command: []string{"sh", "-c", "echo broken input >&2; exit 3"}})
	data := t.TempDir()
	p := testenv.Start(t, "run", "--data", data, "--slots", "1", "--quiet", job)
	if code := p.Wait(t, 60*time.Second); code != 3 {
		t.Fatalf("run: exit %d, want 3 (BLOCKED)\n%s", code, p.Output())
	}
	if n := strings.Count(p.Output(), `last output: "broken input"`); n != 1 || !strings.Contains(p.Output(), "shardpool: run fails is BLOCKED (the reason is above)") {
		t.Fatalf("stdout and stderr on one pipe: the reason appears %d times, want once, and the error pointing to it\n%s", n, p.Output())
	}

	cmd := exec.Command(testenv.Binary(t), "run", "--data", data, "--slots", "1", "--quiet", "--retry-failed", job)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("run --retry-failed: %v, want exit 3\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	if !strings.Contains(stderr.String(), `is BLOCKED: 1 shard(s) failed: s0000 (after 1 attempt(s): exit status 3; last output: "broken input")`) {
		t.Fatalf("stderr apart from stdout lacks the reason:\n%s", stderr.String())
	}
}

// TestProfileNoteReachesPlanAndRun: a profile of shards of one cost says
// that its "largest" sample is no extreme, and plan, run and submit,
// which go by its peaks, repeat the note where they start.
func TestProfileNoteReachesPlanAndRun(t *testing.T) {
	data := t.TempDir()
	job := testenv.WriteJob(t, testenv.Job{Name: "sweep", Shards: 5, Command: []string{"sh", "-c", `echo "$SHARDPOOL_PARAM_N" > "$1/n"`, "job", "{out}"},
		Line: func(i int, in string) string {
			return fmt.Sprintf(`{"id":"s%d","inputs":[],"params":{"n":"%d"}}`, i, i)
		}})
	const note = `note: class cpu: its 5 shards have one cost (0: no input bytes and no "cost" in the manifest)`
	for _, args := range [][]string{{"profile"}, {"plan"}, {"run", "--slots", "auto"}} {
		p := testenv.Start(t, append(append(args, "--data", data), job)...)
		if code := p.Wait(t, 120*time.Second); code != 0 {
			t.Fatalf("%s: exit %d\n%s", args[0], code, p.Output())
		}
		want := note
		if args[0] != "profile" {
			want = "profile.json " + note
		}
		if !strings.Contains(p.Output(), want) {
			t.Errorf("%s output lacks %q:\n%s", args[0], want, p.Output())
		}
	}
	// submit, which passes its peaks to the workers, repeats it too.
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	p := testenv.Start(t, "submit", "--server", env.URL, "--profile", filepath.Join(data, "runs", "sweep", "profile.json"), job)
	if code := p.Wait(t, 30*time.Second); code != 0 || !strings.Contains(p.Output(), "profile.json "+note) {
		t.Errorf("submit: exit %d, want 0 with the profile's note\n%s", code, p.Output())
	}
}

// TestRunSaysWhenAShardOutgrewItsPeak: a profile that measured 4 MiB
// for a class whose shards hold 40 MiB for seconds (its samples missed
// them): run's verdict says so on a memory: line, as the worker warned.
func TestRunSaysWhenAShardOutgrewItsPeak(t *testing.T) {
	data := t.TempDir()
	job := testenv.WriteJob(t, testenv.Job{Name: "grow", Shards: 1, Command: []string{"sh", "-c", `{ head -c 40M /dev/zero; sleep 2.5; } | tail -n 1 > /dev/null`}})
	writeProfile(t, data, job, 4<<20)
	p := testenv.Start(t, "run", "--data", data, job)
	if code := p.Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("run: exit %d\n%s", code, p.Output())
	}
	if !regexp.MustCompile(`(?m)^memory:   shard s0000 of class cpu peaked at 4\d\.\dMiB, above the 4\.0MiB per shard its admission reserves \(measured \(profile\.json\)\): .* \(decision=peak-above in .*admission\.log\)$`).MatchString(p.Output()) {
		t.Errorf("run's verdict lacks the memory: line of a shard that outgrew its class's peak:\n%s", p.Output())
	}
	// Its worker (run's is in auto mode) learned the larger peak while
	// the shard ran, or at its end.
	runLog, _ := os.ReadFile(filepath.Join(data, "runs", "grow", "admission.log"))
	if !regexp.MustCompile(`shard=s0000 class=cpu decision=peak-learned admission on this worker reserves \d+\.\dMiB per shard of the class from now on \(learned from shard s0000, above the 4\.0MiB measured \(profile\.json\)\)`).Match(runLog) {
		t.Errorf("the run's admission.log lacks the peak its worker learned:\n%s", runLog)
	}
}

// TestResumedRunAdmitsByThePeakItSaw: a run profiled at 4 MiB whose
// shards hold 40 MiB, killed (SIGKILL) once its record has the peak one
// of them reached, and run again: the resumed worker's first decision
// reserves that peak, which the run record kept through the restart of
// coordinator and worker, not the profile's 4 MiB.
func TestResumedRunAdmitsByThePeakItSaw(t *testing.T) {
	data := t.TempDir()
	job := testenv.WriteJob(t, testenv.Job{Name: "grow", Shards: 6, Retries: 2, Command: []string{"sh", "-c", `{ head -c 40M /dev/zero; sleep 2; } | tail -n 1 > /dev/null`}})
	writeProfile(t, data, job, 4<<20)
	p := testenv.Start(t, "run", "--data", data, job)
	re := regexp.MustCompile(`nats: (nats://\S+), token in (\S+)`)
	var m []string
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		m = re.FindStringSubmatch(p.Output())
		return m != nil, "run has not printed its URL and token file:\n" + p.Output()
	})
	tok, err := coordinator.ReadToken(m[2])
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(m[1], nats.Token(tok))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	b, err := stream.WaitBuckets(context.Background(), mustJS(t, nc), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var seen stream.PeakSeen
	testenv.Eventually(t, 60*time.Second, func() (bool, string) {
		var r stream.RunRecord
		if e, err := b.Runs.Get(context.Background(), "grow"); err == nil && stream.Decode(e.Value(), &r) == nil {
			seen = r.PeaksSeen["cpu"]
		}
		return seen.Bytes > 0, "the run record has no peaks_seen yet"
	})
	nc.Close()
	p.Signal(syscall.SIGKILL)
	p.Wait(t, 30*time.Second)
	if seen.Bytes < 40<<20 {
		t.Fatalf("peaks_seen of class cpu: %s of %s, want 40 MiB or more", stream.FormatSize(seen.Bytes), seen.Shard)
	}
	hostLog := filepath.Join(data, "admission.log")
	if err := os.Rename(hostLog, hostLog+".first"); err != nil {
		t.Fatal(err)
	}
	again := testenv.Start(t, "run", "--data", data, job)
	if code := again.Wait(t, 90*time.Second); code != 0 {
		t.Fatalf("run again: exit %d\n%s", code, again.Output())
	}
	log, _ := os.ReadFile(hostLog)
	first := regexp.MustCompile(`(?m)^.* decision=fetch .*$`).FindString(string(log))
	if want := "(learned from shard " + seen.Shard + ", above the 4.0MiB measured (profile.json))"; !strings.Contains(first, want) {
		t.Errorf("the resumed run's first fetch decision lacks %q:\n%s", want, first)
	}
}

// writeProfile writes the profile.json of job's run under data, as
// `shardpool profile` would: class cpu measured at memory bytes.
func writeProfile(t *testing.T, data, job string, memory int64) {
	t.Helper()
	spec, _ := testenv.LoadJob(t, job)
	prof := fmt.Sprintf(`{"classes":{"cpu":{"cpu":1000,"memory":%d,"source":"measured (profile.json)"}},"job_fingerprint":%q}`, memory, plan.JobFingerprint(spec))
	dir := filepath.Join(data, "runs", spec.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "profile.json"), []byte(prof), 0o644); err != nil {
		t.Fatal(err)
	}
}

// mustJS is nc's JetStream.
func mustJS(t *testing.T, nc *nats.Conn) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// TestRunWaitsQuietlyForItsLastShard: `run`'s worker fetches with a short
// expiry so that it exits as soon as the run completes; while the last
// shard ran on and the queue stayed empty it asked 50 times a second,
// each time with an admission decision in admission.log. Now the fetches
// of a dry queue wait longer, and the same decision is logged once: a
// last shard of 3 s leaves a few fetch lines, not 150.
func TestRunWaitsQuietlyForItsLastShard(t *testing.T) {
	data := t.TempDir()
	job := testenv.WriteJob(t, testenv.Job{Name: "tail", Shards: 2, Extra: "[class.cpu]\ncpus = 1\nmemory = \"64MiB\"\n",
		Line: func(i int, in string) string {
			return fmt.Sprintf(`{"id":"s%d","inputs":[%q],"params":{"secs":"%d"}}`, i, in, []int{3, 0}[i])
		},
		Command: []string{"sh", "-c", `sleep "$SHARDPOOL_PARAM_SECS"`}})
	start := time.Now()
	p := testenv.Start(t, "run", "--data", data, job)
	if code := p.Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("run: exit %d\n%s", code, p.Output())
	}
	took := time.Since(start)
	log, err := os.ReadFile(filepath.Join(data, "admission.log"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(log), "decision=fetch"); n < 1 || n > 6 {
		t.Errorf("admission.log has %d fetch decisions for 2 shards, one of them 3 s alone; want a few:\n%s", n, log)
	}
	// It still exits soon after: the fetches wait at most a quarter of a second.
	if took > 12*time.Second {
		t.Errorf("run of a 3 s shard took %s", took.Round(time.Millisecond))
	}
}

// TestProfileCommand: `shardpool profile` measures the smallest, median
// and largest shard, writes profile.json, and where the spec names no
// malformed input says how to add one; with one declared it runs it as
// the fourth sample and says nothing of the kind.
func TestProfileCommand(t *testing.T) {
	data := t.TempDir()
	line := func(i int, in string) string {
		return fmt.Sprintf(`{"id":"s%d","inputs":[%q],"cost":%d}`, i, in, (i+1)*100)
	}
	// The command refuses an input that is not a shard's (it lacks "shard").
	command := []string{"sh", "-c", `grep -q shard "$1" || { echo not a shard >&2; exit 2; }; cp "$1" "$2/"`, "job", "{input}", "{out}"}
	job := testenv.WriteJob(t, testenv.Job{Name: "prof", Shards: 5, Line: line, Command: command})
	p := testenv.Start(t, "profile", "--data", data, job)
	if code := p.Wait(t, 120*time.Second); code != 0 {
		t.Fatalf("profile: exit %d\n%s", code, p.Output())
	}
	for _, want := range []string{"smallest  s0", "median    s2", "largest   s4", "malformed: none declared", "[profile]\n  malformed = [\"PATH\"]", "profile.json: " + filepath.Join(data, "runs", "prof", "profile.json")} {
		if !strings.Contains(p.Output(), want) {
			t.Fatalf("profile output lacks %q:\n%s", want, p.Output())
		}
	}
	var rep worker.ProfileReport
	if b, err := os.ReadFile(filepath.Join(data, "runs", "prof", "profile.json")); err != nil || json.Unmarshal(b, &rep) != nil || len(rep.Samples) < 3 {
		t.Fatalf("profile.json: %v, %d sample(s), want 3 or more", err, len(rep.Samples))
	}

	dir := filepath.Dir(job)
	if err := os.WriteFile(filepath.Join(dir, "bad.txt"), []byte("garbage\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(job, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("\n[profile]\nmalformed = [\"bad.txt\"]\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	p = testenv.Start(t, "profile", "--data", data, job)
	if code := p.Wait(t, 120*time.Second); code != 0 || !strings.Contains(p.Output(), "malformed-0") || strings.Contains(p.Output(), "none declared") {
		t.Fatalf("profile with a malformed input declared: exit %d, want 0 with its sample and no hint\n%s", code, p.Output())
	}

	// An edited command: the profile measured another version, and both
	// plan and run say so with the profile command that writes where they
	// read (this --data, not the default state directory), run before its
	// class's one-at-a-time slots, which that explains.
	b, _ := os.ReadFile(job)
	if edited := strings.Replace(string(b), "grep -q shard", "grep -q -- shard", 1); edited == string(b) {
		t.Fatalf("the command to edit is not in the spec:\n%s", b)
	} else if err := os.WriteFile(job, []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	again := "profile.json is not used: it measured another version of this job: its command, env, classes, validator, code_rev or a file the command names changed since; run `shardpool profile --data " + data + " " + job + "` again"
	p = testenv.Start(t, "plan", "--data", data, job)
	if code := p.Wait(t, 60*time.Second); code != 0 || !strings.Contains(p.Output(), again) {
		t.Fatalf("plan of an edited job: exit %d, want 0 and %q\n%s", code, again, p.Output())
	}
	p = testenv.Start(t, "run", "--data", data, job)
	if code := p.Wait(t, 60*time.Second); code != 0 || !strings.Contains(p.Output(), again+"\nslots: class cpu runs one shard at a time") {
		t.Fatalf("run of an edited job: exit %d, want 0 and %q before its slots line\n%s", code, again, p.Output())
	}
}

// TestAddedShardsCanRunAlone: lines added to a finished run's manifest
// make a new generation that runs every shard again; the submission says
// so and how to run only the added shards. Following that advice runs
// nothing already committed: the manifest put back verifies and skips the
// committed outputs, and the added lines, as a run of their own with the
// same output, commit their shard alone.
func TestAddedShardsCanRunAlone(t *testing.T) {
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	orig := "{\"id\":\"a\"}\n{\"id\":\"b\"}\n"
	write("m.jsonl", orig)
	spec := write("job.toml", "name = \"grow\"\nmanifest = \"m.jsonl\"\noutput = \"out\"\ncommand = [\"sh\", \"-c\", \"echo $0 > $1/r\", \"{id}\", \"{out}\"]\ncode_rev = \"x\"\n")
	submit := func(path string) string {
		t.Helper()
		p := testenv.Start(t, "submit", "--server", env.URL, path)
		if code := p.Wait(t, 60*time.Second); code != 0 {
			t.Fatalf("submit %s: exit %d\n%s", path, code, p.Output())
		}
		return p.Output()
	}
	complete := func(run string) {
		t.Helper()
		env.StartWorker("w", map[string]int{"cpu": 2})
		env.WaitState(run, 60*time.Second, stream.RunComplete)
		if err := env.StopWorker("w"); err != nil {
			t.Fatal(err)
		}
	}
	submit(spec)
	complete("grow")
	marker := func(id string) checkpoint.Marker { return outputMarker(t, dir, id) }
	first := map[string]checkpoint.Marker{"a": marker("a"), "b": marker("b")}
	unchanged := func(when string) {
		t.Helper()
		for id, was := range first {
			if mk := marker(id); mk.Fingerprint != was.Fingerprint || !mk.Time.Equal(was.Time) {
				t.Fatalf("%s: %s was made again: committed %v under %s, first %v under %s", when, id, mk.Time, mk.Fingerprint, was.Time, was.Fingerprint)
			}
		}
	}

	write("m.jsonl", orig+"{\"id\":\"c\"}\n")
	out := submit(spec)
	for _, want := range []string{"changed: manifest content", "only the manifest changed", "put the manifest back as it was", "a run of their own (another name, the same output)"} {
		if !strings.Contains(out, want) {
			t.Fatalf("submission of an added line does not say %q:\n%s", want, out)
		}
	}

	write("m.jsonl", orig)
	if out := submit(spec); !strings.Contains(out, "replaces") || strings.Contains(out, "only the manifest changed") {
		t.Fatalf("the manifest put back: want a generation replaced and no advice (none of the other generation's outputs were made)\n%s", out)
	}
	complete("grow")
	unchanged("after the manifest was put back")
	write("add.jsonl", "{\"id\":\"c\"}\n")
	added := write("add.toml", "name = \"grow-added\"\nmanifest = \"add.jsonl\"\noutput = \"out\"\ncommand = [\"sh\", \"-c\", \"echo $0 > $1/r\", \"{id}\", \"{out}\"]\ncode_rev = \"x\"\n")
	submit(added)
	complete("grow-added")
	if b, err := os.ReadFile(filepath.Join(dir, "out", "c", "r")); err != nil || string(b) != "c\n" {
		t.Fatalf("the added shard's output: %q, %v", b, err)
	}
	unchanged("after the added lines' own run")
}

// TestChangedInputIsMadeAgain: a COMPLETE run run again redoes the shard
// whose input was rewritten in place since its output was made, and only
// it, saying why; so does a worker that finds the output committed under
// another state directory. Unchanged, nothing runs again.
func TestChangedInputIsMadeAgain(t *testing.T) {
	job := testenv.WriteJob(t, testenv.Job{Name: "inputs", Shards: 3, Command: []string{"cp", "{input}", "{out}/"}})
	dir := filepath.Dir(job)
	data := t.TempDir()
	run := func(data string) string {
		t.Helper()
		p := testenv.Start(t, "run", "--data", data, "--slots", "2", "--quiet", job)
		if code := p.Wait(t, 60*time.Second); code != 0 {
			t.Fatalf("run: exit %d\n%s", code, p.Output())
		}
		return p.Output()
	}
	marker := func(id string) checkpoint.Marker { return outputMarker(t, dir, id) }
	rewrite := func(id, body string, at time.Time) {
		t.Helper()
		in := filepath.Join(dir, "in", id+".txt")
		if err := os.WriteFile(in, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(in, at, at); err != nil {
			t.Fatal(err)
		}
	}
	run(data)
	first := map[string]checkpoint.Marker{"s0000": marker("s0000"), "s0002": marker("s0002")}
	if first["s0000"].Inputs == "" {
		t.Fatalf("the marker records no inputs stamp: %+v", first["s0000"])
	}
	same := func(when string) {
		t.Helper()
		for id, was := range first {
			if mk := marker(id); !mk.Time.Equal(was.Time) {
				t.Fatalf("%s: %s was made again (committed %v, first %v): its input did not change", when, id, mk.Time, was.Time)
			}
		}
	}

	rewrite("s0001", "shard 1, new data\n", time.Now().Add(time.Hour))
	out := run(data)
	if !strings.Contains(out, "1 committed output(s)") || !strings.Contains(out, "s0001 (an input changed since the output was made") {
		t.Fatalf("run after an input was rewritten does not say it redoes s0001 for it:\n%s", out)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "out", "s0001", "s0001.txt")); err != nil || string(b) != "shard 1, new data\n" {
		t.Fatalf("s0001's output after its input changed: %q, %v", b, err)
	}
	same("after s0001's input changed")
	if out := run(data); strings.Contains(out, "queued again") {
		t.Fatalf("run with nothing changed queued something again:\n%s", out)
	}

	// Another state directory: no records, only the committed outputs. The
	// worker skips those whose inputs are as they were and makes s0001
	// again.
	rewrite("s0001", "shard 1, newer data\n", time.Now().Add(2*time.Hour))
	other := t.TempDir()
	run(other)
	if b, err := os.ReadFile(filepath.Join(other, "runs", "inputs", "admission.log")); err != nil ||
		!strings.Contains(string(b), "shard=s0001 class=cpu decision=redo the output at") {
		t.Fatalf("admission.log under another state directory does not say why s0001 ran again (%v):\n%s", err, b)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "out", "s0001", "s0001.txt")); err != nil || string(b) != "shard 1, newer data\n" {
		t.Fatalf("s0001's output, committed under another state directory, after its input changed: %q, %v", b, err)
	}
	same("under another state directory")
}

// outputMarker is the marker of shard id's committed output under the
// job directory dir (output "out").
func outputMarker(t *testing.T, dir, id string) checkpoint.Marker {
	t.Helper()
	mk, err := checkpoint.ReadMarker(filepath.Join(dir, "out", id))
	if err != nil {
		t.Fatal(err)
	}
	return mk
}

// TestRunWarnsWhenEveryShardFails: with --halt 0, a command that fails
// for every shard ends BLOCKED only once every shard has failed; run warns
// as soon as several have failed and none succeeded, naming the command
// that shows their reasons. A run whose shards succeed says nothing of the
// kind. (By default the run halts instead: TestRunHaltsWhenEveryShardFails.)
func TestRunWarnsWhenEveryShardFails(t *testing.T) {
	data := t.TempDir()
	// Slow enough that the run's record is updated while shards remain
	// (a run over before its next update has no one to warn).
	bad := testenv.WriteJob(t, testenv.Job{Name: "bad", Shards: 20, Retries: 0, Command: []string{"sh", "-c", "sleep 0.3; exit 1"}})
	p := testenv.Start(t, "run", "--data", data, "--slots", "2", "--halt", "0", bad)
	if code := p.Wait(t, 60*time.Second); code != 3 || !strings.Contains(p.Output(), "(0 validated, 20 failed of 20)") {
		t.Fatalf("run --halt 0: exit %d, want 3 (BLOCKED) with every shard run\n%s", code, p.Output())
	}
	if n := strings.Count(p.Output(), "none succeeded: the command may fail for every shard"); n != 1 ||
		!strings.Contains(p.Output(), "Their reasons: shardpool status --data "+data+" bad") {
		t.Fatalf("a run whose every shard fails: the warning appears %d times, want once with the status command\n%s", n, p.Output())
	}
	good := testenv.WriteJob(t, testenv.Job{Name: "good", Shards: 12, Command: []string{"cp", "{input}", "{out}/"}})
	p = testenv.Start(t, "run", "--data", data, "--slots", "2", good)
	if code := p.Wait(t, 60*time.Second); code != 0 || strings.Contains(p.Output(), "may fail for every shard") {
		t.Fatalf("a run whose shards succeed: exit %d, want 0 and no warning\n%s", code, p.Output())
	}
}

// TestRetryWithChangedSettingsWaitsForItsVerdict: a BLOCKED run retried
// with a setting changed outside the fingerprint (retries) has its record
// rewritten by the submission before the tracker has seen the retry. That
// write is not a verdict: `run` used to take the stale BLOCKED for one and
// exit 3 at once, with the shards it had just requeued still to run.
func TestRetryWithChangedSettingsWaitsForItsVerdict(t *testing.T) {
	job := testenv.WriteJob(t, testenv.Job{Shards: 4, Retries: 0,
		Command: []string{"sh", "-c", `[ -e fixed ] || exit 4; cp "$0" "$1/"`, "{input}", "{out}"}})
	dir, data := filepath.Dir(job), t.TempDir()
	p := testenv.Start(t, "run", "--data", data, "--halt", "0", job)
	if code := p.Wait(t, 60*time.Second); code != 3 {
		t.Fatalf("run of a failing command: exit %d, want 3\n%s", code, p.Output())
	}
	if err := os.WriteFile(filepath.Join(dir, "fixed"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	spec, err := os.ReadFile(job)
	if err != nil {
		t.Fatal(err)
	}
	changed := strings.Replace(string(spec), "retries = 0", "retries = 1", 1)
	if changed == string(spec) {
		t.Fatalf("no retries line to change in the spec:\n%s", spec)
	}
	if err := os.WriteFile(job, []byte(changed), 0o644); err != nil {
		t.Fatal(err)
	}
	p = testenv.Start(t, "run", "--data", data, "--retry-failed", job)
	if code := p.Wait(t, 60*time.Second); code != 0 || !strings.Contains(p.Output(), "retries 0 -> 1") || !strings.Contains(p.Output(), "COMPLETE") {
		t.Fatalf("run --retry-failed with retries changed: exit %d, want 0 (COMPLETE) and the change named\n%s", code, p.Output())
	}
}

// TestRunHaltsWhenEveryShardFails: by default a run stops fetching once
// the first 5 shards to end have all failed, lets the running ones end,
// keeps the rest queued and says how to go on. After the fix, a plain run
// is judged on its own attempts, not halted at once by the failures
// recorded before it, and --retry-failed completes the run.
func TestRunHaltsWhenEveryShardFails(t *testing.T) {
	job := testenv.WriteJob(t, testenv.Job{Name: "broken", Shards: 20, Retries: 0,
		Command: []string{"sh", "-c", `[ -e fixed ] || { sleep 0.1; echo "tool missing" >&2; exit 1; }; cp "$0" "$1/"`, "{input}", "{out}"}})
	dir, data := filepath.Dir(job), t.TempDir()
	p := testenv.Start(t, "run", "--data", data, "--halt", "-1", job)
	if code := p.Wait(t, 30*time.Second); code != 2 || !strings.Contains(p.Output(), "--halt -1: want a number of shards") {
		t.Fatalf("run --halt -1: exit %d, want 2 (usage) naming the flag\n%s", code, p.Output())
	}
	p = testenv.Start(t, "run", "--data", data, "--slots", "2", job)
	if code := p.Wait(t, 60*time.Second); code != 3 {
		t.Fatalf("run of a command that fails for every shard: exit %d, want 3\n%s", code, p.Output())
	}
	out := p.Output()
	m := regexp.MustCompile(`halted: the first (\d+) shard\(s\) to end all failed after their retries and none succeeded`).FindStringSubmatch(out)
	if m == nil || !strings.Contains(out, "the rest stay queued") || !strings.Contains(out, "--retry-failed") ||
		!regexp.MustCompile(`(?m)^  s\d{4}: after 1 attempt\(s\): exit status 1; last output: "tool missing" \(log: /`).MatchString(out) {
		t.Fatalf("halted run: want the halt, the failed shards' reasons and logs, and how to go on\n%s", out)
	}
	if n, _ := strconv.Atoi(m[1]); n < 5 || n >= 20 {
		t.Fatalf("halted after %d failed shards, want at least 5 and fewer than 20\n%s", n, out)
	}
	// The halt is in the evidence: status --data says so once the run
	// has exited, with the shards that failed.
	st := testenv.Start(t, "status", "--data", data, "broken")
	if code := st.Wait(t, 30*time.Second); code != 0 || !strings.Contains(st.Output(), "stopped while RUNNING (halted: the first ") ||
		!regexp.MustCompile(`(?m)^broken: failed: s\d{4}: after 1 attempt\(s\): exit status 1`).MatchString(st.Output()) {
		t.Fatalf("status --data of the halted run: exit %d, want the halt and the failed shards\n%s", code, st.Output())
	}
	st = testenv.Start(t, "status", "--data", data, "--json", "broken")
	var doc coordinator.Status
	if code := st.Wait(t, 30*time.Second); code != 0 || json.Unmarshal([]byte(st.Output()), &doc) != nil || len(doc.NoVerdict) != 1 ||
		doc.NoVerdict[0].Counts == nil || !strings.HasPrefix(doc.NoVerdict[0].Stopped, "halted: ") || len(doc.NoVerdict[0].Failed) != 5 {
		t.Fatalf("status --data --json of the halted run: exit %d, want the halt, 5 failed shards named and the counts\n%s", code, st.Output())
	}
	failed := doc.NoVerdict[0].Counts.Failed
	if failed < 5 || failed > 10 || doc.NoVerdict[0].MoreFailed != failed-5 {
		t.Fatalf("after the halt %d shard(s) failed (%d more than named), want 5 to 10 (2 slots ending what they ran)\n%s", failed, doc.NoVerdict[0].MoreFailed, st.Output())
	}
	if err := os.WriteFile(filepath.Join(dir, "fixed"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	p = testenv.Start(t, "run", "--data", data, "--slots", "2", job)
	want := fmt.Sprintf("(%d validated, %d failed of 20)", 20-failed, failed)
	if code := p.Wait(t, 60*time.Second); code != 3 || strings.Contains(p.Output(), "halted") || !strings.Contains(p.Output(), want) {
		t.Fatalf("plain run after the fix: exit %d, want 3 (BLOCKED on the %d failed before), no halt, %s\n%s", code, failed, want, p.Output())
	}
	p = testenv.Start(t, "run", "--data", data, "--slots", "2", "--retry-failed", job)
	if code := p.Wait(t, 60*time.Second); code != 0 || !strings.Contains(p.Output(), "(20 validated, 0 failed of 20)") {
		t.Fatalf("run --retry-failed after the fix: exit %d, want 0 (COMPLETE)\n%s", code, p.Output())
	}
	if _, err := os.Stat(filepath.Join(data, "runs", "broken", coordinator.StoppedName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the halt's %s outlived the runs after it: %v", coordinator.StoppedName, err)
	}
}

// TestBlockedRunRemakesChangedInputs: a BLOCKED run retried is checked as
// a COMPLETE one is: a validated shard whose input was rewritten since is
// made again along with the failed shard's retry, not left stale until a
// run after the retry.
func TestBlockedRunRemakesChangedInputs(t *testing.T) {
	// s0000 fails until a file "fixed" exists beside the spec; the others
	// copy their input.
	job := testenv.WriteJob(t, testenv.Job{Name: "mixed", Shards: 3, Retries: 0,
		Command: []string{"sh", "-c", `[ "$0" != s0000 ] || [ -e fixed ] || exit 3; cp "$1" "$2/"`, "{id}", "{input}", "{out}"}})
	dir := filepath.Dir(job)
	data := t.TempDir()
	p := testenv.Start(t, "run", "--data", data, "--slots", "2", "--quiet", job)
	if code := p.Wait(t, 60*time.Second); code != 3 {
		t.Fatalf("first run: exit %d, want 3 (BLOCKED)\n%s", code, p.Output())
	}
	kept := outputMarker(t, dir, "s0002")
	in := filepath.Join(dir, "in", "s0001.txt")
	if err := os.WriteFile(in, []byte("rewritten\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(in, later, later); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "fixed"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	p = testenv.Start(t, "run", "--data", data, "--slots", "2", "--quiet", "--retry-failed", job)
	if code := p.Wait(t, 60*time.Second); code != 0 || !strings.Contains(p.Output(), "retried 1 failed shard(s)") ||
		!strings.Contains(p.Output(), "s0001 (an input changed since the output was made") {
		t.Fatalf("retry of a BLOCKED run with an input rewritten: exit %d, want 0, the failed shard retried and s0001 made again\n%s", code, p.Output())
	}
	if b, err := os.ReadFile(filepath.Join(dir, "out", "s0001", "s0001.txt")); err != nil || string(b) != "rewritten\n" {
		t.Fatalf("s0001's output: %q, %v; want the rewritten input's copy", b, err)
	}
	if mk := outputMarker(t, dir, "s0002"); !mk.Time.Equal(kept.Time) {
		t.Fatalf("s0002, whose input did not change, was made again: %v, first %v", mk.Time, kept.Time)
	}
}

// TestRunOutlivesItsReader: `shardpool run` whose standard output and
// error are a pipe nobody reads any more (`run | head`, a tee that died
// with its terminal) goes on to COMPLETE. Go's default killed it with
// SIGPIPE at its first line, mid-run, with no drain.
func TestRunOutlivesItsReader(t *testing.T) {
	job := testenv.WriteJob(t, testenv.Job{Name: "piped", Shards: 6, Command: []string{"sh", "-c", `sleep 0.2; cp "$0" "$1/"`, "{input}", "{out}"}})
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(testenv.Binary(t), "run", "--data", t.TempDir(), "--slots", "2", job)
	cmd.Env = append(os.Environ(), "SHARDPOOL_HOST_LEDGER="+testenv.LedgerDir(t))
	cmd.Stdout, cmd.Stderr = w, w
	r.Close() // the reader is gone before the first line
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("run with its reader gone: still running after 60 s")
	}
	if err != nil {
		t.Fatalf("run with its reader gone: %v (%s), want exit 0 (COMPLETE)", err, cmd.ProcessState)
	}
	for i := range 6 {
		outputMarker(t, filepath.Dir(job), fmt.Sprintf("s%04d", i)) // fails t where none is committed
	}
}

// TestNohupRunIgnoresHangup: a run started under nohup keeps running when
// its terminal hangs up (SIGHUP to its process group), as nohup means; one
// started plainly drains on SIGHUP (TestWorkerSIGTERMDrainsAndExitsZero).
// Go installed a handler for SIGHUP, ignored or not, and the run stopped.
func TestNohupRunIgnoresHangup(t *testing.T) {
	nohup, err := exec.LookPath("nohup")
	if err != nil {
		t.Fatalf("nohup (coreutils) is needed: %v", err)
	}
	job := testenv.WriteJob(t, testenv.Job{Name: "nohup", Shards: 4, Command: []string{"sh", "-c", `sleep 1; cp "$0" "$1/"`, "{input}", "{out}"}})
	p := testenv.StartCmd(t, nohup, testenv.Binary(t), "run", "--data", t.TempDir(), "--slots", "2", job)
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		return strings.Contains(p.Output(), "follow it from another terminal"), "the run has not started:\n" + p.Output()
	})
	time.Sleep(300 * time.Millisecond) // shards running
	p.Signal(syscall.SIGHUP)
	if code := p.Wait(t, 60*time.Second); code != 0 || strings.Contains(p.Output(), "stopping") {
		t.Fatalf("nohup run after a hangup: exit %d, want 0 (COMPLETE) and no drain\n%s", code, p.Output())
	}
	for i := range 4 {
		outputMarker(t, filepath.Dir(job), fmt.Sprintf("s%04d", i)) // fails t where none is committed
	}
}

// TestDaemonInTheMiddleOfAnExecIsFound: a command leaves a daemon outside
// its process group that does nothing but exec itself again, so that a
// worker looking at it as the command ends (no cgroup: no memory
// declared) often finds it between an exec's new memory map and its
// environment, which then reads empty. Each is killed with its attempt,
// and counted so. Before, such a daemon went unnoticed at its command's
// end (CI saw `exec sleep` do that once in TestRunSaysWhatItsCommandsLeftRunning),
// and was killed only by a later sweep, not charged to its attempt.
func TestDaemonInTheMiddleOfAnExecIsFound(t *testing.T) {
	const shards = 8
	pidDir, dir := t.TempDir(), t.TempDir()
	loop := filepath.Join(dir, "loop.sh")
	if err := os.WriteFile(loop, []byte("exec /bin/sh \"$0\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := testenv.WriteJob(t, testenv.Job{Name: "execs", Shards: shards, Command: []string{"sh", "-c", `f="$0/$SHARDPOOL_SHARD_ID"
setsid sh -c 'echo $$ > "$0.tmp" && mv "$0.tmp" "$0" && exec /bin/sh "$1"' "$f" "$1" </dev/null >/dev/null 2>&1 &
while [ ! -s "$f" ]; do sleep 0.01; done`, pidDir, loop}})
	pids := func() []int {
		var pids []int
		for i := range shards {
			if b, err := os.ReadFile(filepath.Join(pidDir, fmt.Sprintf("s%04d", i))); err == nil {
				if pid, _ := strconv.Atoi(strings.TrimSpace(string(b))); pid > 0 {
					pids = append(pids, pid)
				}
			}
		}
		return pids
	}
	t.Cleanup(func() {
		for _, pid := range pids() {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	p := testenv.Start(t, "run", "--data", t.TempDir(), "--slots", "1", spec)
	if code := p.Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("run: exit %d\n%s", code, p.Output())
	}
	if want := fmt.Sprintf("left running: %d attempt(s) left processes running", shards); !strings.Contains(p.Output(), want) {
		t.Errorf("run's summary does not say %q:\n%s", want, p.Output())
	}
	if got := pids(); len(got) != shards {
		t.Fatalf("%d daemons wrote their pid, want %d", len(got), shards)
	}
	for _, pid := range pids() {
		if probe.PIDAlive("/proc", pid) {
			t.Errorf("daemon %d still runs after the run ended", pid)
		}
	}
}

// TestRunSaysWhatItsCommandsLeftRunning: `run` ends with a line counting
// the attempts whose command left processes running (killed then), naming
// the first, and warns once when the first happens: a job that starts a
// daemon does it on every shard, and its author should learn it.
func TestRunSaysWhatItsCommandsLeftRunning(t *testing.T) {
	pidDir := t.TempDir()
	spec := testenv.WriteJob(t, testenv.Job{Name: "daemons", Shards: 2, Command: []string{"sh", "-c", `f="$0/$SHARDPOOL_SHARD_ID"
setsid sh -c 'echo $$ > "$0.tmp" && mv "$0.tmp" "$0" && exec sleep 300' "$f" </dev/null >/dev/null 2>&1 &
while [ ! -s "$f" ]; do sleep 0.01; done`, pidDir}})
	t.Cleanup(func() {
		for i := range 2 {
			if b, err := os.ReadFile(filepath.Join(pidDir, fmt.Sprintf("s%04d", i))); err == nil {
				if pid, _ := strconv.Atoi(strings.TrimSpace(string(b))); pid > 0 {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
	})
	data := t.TempDir()
	p := testenv.Start(t, "run", "--data", data, "--slots", "1", spec)
	if code := p.Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("run: exit %d\n%s", code, p.Output())
	}
	out := p.Output()
	if !strings.Contains(out, "left running: 2 attempt(s) left processes running when their command ended, killed then (the first, s000") ||
		!strings.Contains(out, filepath.Join(data, "runs", "daemons", "admission.log")) {
		t.Errorf("run's summary does not count the attempts that left processes running:\n%s", out)
	}
	if n := strings.Count(out, "a command left processes running outside its process group"); n != 1 {
		t.Errorf("%d warnings that a command left processes running, want 1 (the first of the run):\n%s", n, out)
	}
}

// TestRunDoesNotRemakeAnUnmountedOutputDirectory: a run whose output
// directory was on a file system that is no longer mounted (a FUSE
// mount, as sshfs or NFS would be) is refused before anything runs,
// naming both file systems, and nothing is made in the mount point; an
// output directory removed from the file system it was on is made again
// and its outputs redone.
func TestRunDoesNotRemakeAnUnmountedOutputDirectory(t *testing.T) {
	fuse := testenv.FuseDir(t)
	data := t.TempDir()
	spec := testenv.WriteJob(t, testenv.Job{Name: "mnt", Shards: 2, Command: []string{"cp", "{input}", "{out}/"}})
	out := filepath.Join(fuse, "out")
	testenv.SetOutput(t, spec, out)
	p := testenv.Start(t, "run", "--data", data, "--slots", "2", spec)
	if code := p.Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("run into the FUSE mount: exit %d\n%s", code, p.Output())
	}
	if o, err := exec.Command("umount", fuse).CombinedOutput(); err != nil {
		t.Fatalf("umount %s: %v %s", fuse, err, o)
	}
	p = testenv.Start(t, "run", "--data", data, "--slots", "2", spec)
	if code := p.Wait(t, 60*time.Second); code != 1 {
		t.Fatalf("run with its output's file system unmounted: exit %d, want 1\n%s", code, p.Output())
	}
	for _, want := range []string{"the output directory " + out + " does not exist, though this run committed 2 shard output(s) there, on fuse ",
		"mounted at " + fuse + "; made now, it would be on ", "mkdir -p " + out} {
		if !strings.Contains(p.Output(), want) {
			t.Errorf("refusal lacks %q:\n%s", want, p.Output())
		}
	}
	if ents, _ := os.ReadDir(fuse); len(ents) != 0 {
		t.Fatalf("the mount point got %s", ents[0].Name())
	}

	// The output directory the mount point itself: left empty by the
	// unmount, and refused; taken once its record is removed.
	fuse2 := testenv.FuseDir(t)
	spec2 := testenv.WriteJob(t, testenv.Job{Name: "mnt2", Shards: 2, Command: []string{"cp", "{input}", "{out}/"}})
	testenv.SetOutput(t, spec2, fuse2)
	p = testenv.Start(t, "run", "--data", data, "--slots", "2", spec2)
	if code := p.Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("run into the second FUSE mount: exit %d\n%s", code, p.Output())
	}
	if o, err := exec.Command("umount", fuse2).CombinedOutput(); err != nil {
		t.Fatalf("umount %s: %v %s", fuse2, err, o)
	}
	p = testenv.Start(t, "run", "--data", data, "--slots", "2", spec2)
	record := filepath.Join(data, "runs", "mnt2", "output-fs")
	if code := p.Wait(t, 60*time.Second); code != 1 || !strings.Contains(p.Output(), "the output directory "+fuse2+" is empty and on ") ||
		!strings.Contains(p.Output(), "remove "+record) {
		t.Fatalf("run with its output's mount point left empty: exit %d, want 1 naming the record to remove\n%s", code, p.Output())
	}
	if ents, _ := os.ReadDir(fuse2); len(ents) != 0 {
		t.Fatalf("the mount point got %s", ents[0].Name())
	}
	if err := os.Remove(record); err != nil {
		t.Fatal(err)
	}
	p = testenv.Start(t, "run", "--data", data, "--slots", "2", spec2)
	if code := p.Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("run with its output-fs removed: exit %d, want 0 (outputs made again here)\n%s", code, p.Output())
	}

	// Removed from the file system it was on: made again, outputs redone.
	local := testenv.WriteJob(t, testenv.Job{Name: "gone", Shards: 2, Command: []string{"cp", "{input}", "{out}/"}})
	for round := range 2 {
		p = testenv.Start(t, "run", "--data", data, "--slots", "2", local)
		if code := p.Wait(t, 60*time.Second); code != 0 {
			t.Fatalf("round %d of a run whose output directory was removed: exit %d\n%s", round, code, p.Output())
		}
		if _, err := checkpoint.Verify(filepath.Join(filepath.Dir(local), "out", "s0001")); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if err := os.RemoveAll(filepath.Join(filepath.Dir(local), "out")); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSubmitWarnsOfAnOutputOnItsOwnDisk: `submit` of a run whose output
// is on the submitting host's own disk warns when live workers run on
// other hosts (their shards would fail there, unless they see the
// directory on shared storage), and names them; a worker on this host is
// not named, and an output on a mount gets no warning. The other host's
// worker is its report in the workers bucket, as it would write it.
func TestSubmitWarnsOfAnOutputOnItsOwnDisk(t *testing.T) {
	fuse := testenv.FuseDir(t)
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	env.StartWorker("near", map[string]int{"cpu": 1})
	far, _ := stream.Encode(&stream.WorkerReport{Name: "far", Host: "node7", BootID: "another-boot", PID: 4242,
		Slots: map[string]int{"cpu": 1}, Started: time.Now().UTC(), Reported: time.Now().UTC()})
	if _, err := env.Buckets().Workers.Put(context.Background(), "far", far); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		st, err := coordinator.ReadStatus(context.Background(), env.JS, "")
		return err == nil && len(st.Workers) == 2, fmt.Sprintf("workers %+v (%v)", st, err)
	})
	for _, c := range []struct {
		name, out string
		warned    bool
	}{
		{"local", filepath.Join(t.TempDir(), "out"), true},
		{"mounted", filepath.Join(fuse, "out"), false},
	} {
		spec := testenv.WriteJob(t, testenv.Job{Name: c.name, Shards: 1, Command: []string{"true"}})
		testenv.SetOutput(t, spec, c.out)
		p := testenv.Start(t, "submit", "--server", env.URL, spec)
		if code := p.Wait(t, 30*time.Second); code != 0 {
			t.Fatalf("%s: submit exit %d\n%s", c.name, code, p.Output())
		}
		out := p.Output()
		warned := strings.Contains(out, "warning: the output directory "+c.out+" is on this host's own disk (") &&
			strings.Contains(out, "and worker(s) far (host node7) run on other hosts: they commit nothing there unless they see it on storage they share with this host")
		if warned != c.warned || strings.Contains(out, "near (host") {
			t.Errorf("%s: submit said (warning wanted: %v, naming far only):\n%s", c.name, c.warned, out)
		}
	}
}

// TestSubmitRecordsWhereTheOutputIs: `submit` of a run whose output
// directory is to be made on a mount (FUSE here, NFS in life) records
// that mount in the run record, so that a worker on a host without it
// does not make the directory on its local disk (the worker's tests);
// a submission from a host where the output is on a local disk records
// that disk with the host's boot ID, so that workers on other hosts
// commit nothing to their own disks.
func TestSubmitRecordsWhereTheOutputIs(t *testing.T) {
	fuse := testenv.FuseDir(t)
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	host, _ := os.Hostname()
	boot := stream.BootID("/proc")
	for _, c := range []struct {
		name, out string
		mount     string // "" for this host's disk
	}{
		{"fuse", filepath.Join(fuse, "results", "out"), fuse},
		{"local", filepath.Join(t.TempDir(), "out"), ""},
	} {
		spec := testenv.WriteJob(t, testenv.Job{Name: c.name, Shards: 1, Command: []string{"true"}})
		testenv.SetOutput(t, spec, c.out)
		p := testenv.Start(t, "submit", "--server", env.URL, spec)
		if code := p.Wait(t, 30*time.Second); code != 0 {
			t.Fatalf("%s: submit exit %d\n%s", c.name, code, p.Output())
		}
		r, err := env.Run(c.name)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case c.mount == "" && (r.OutputOn == nil || !r.OutputOn.Local || r.OutputOn.BootID != boot || r.OutputOn.Host != host):
			t.Errorf("%s: output_on %+v, want this host's local disk, boot %s", c.name, r.OutputOn, boot)
		case c.mount != "" && (r.OutputOn == nil || r.OutputOn.Local || r.OutputOn.BootID != "" || r.OutputOn.MountPoint != c.mount || r.OutputOn.Host != host || !strings.HasPrefix(r.OutputOn.Type, "fuse")):
			t.Errorf("%s: output_on %+v, want FUSE mounted at %s on %s", c.name, r.OutputOn, c.mount, host)
		}
	}
}

// TestSubmitPassesTheProfilesPeaks: `shardpool profile` then `shardpool
// submit`, the distributed form's steps, left the workers admitting by
// the declared memory: only `run` passed the measured peaks on. submit
// now reads the profile.json of this version of the job (in the default
// state directory, or --profile FILE) into the run record's
// measured_memory and says so; a profile of another version is not used,
// and said; a --profile that is not there is refused.
func TestSubmitPassesTheProfilesPeaks(t *testing.T) {
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	state := t.TempDir()
	xdg := []string{"XDG_STATE_HOME=" + state}
	spec := testenv.WriteJob(t, testenv.Job{Shards: 3, Command: []string{"cp", "{input}", "{out}/"}, Extra: "[class.cpu]\ncpus = 1\nmemory = \"512MiB\"\n"})
	if p := testenv.StartEnv(t, xdg, "profile", spec); p.Wait(t, 60*time.Second) != 0 {
		t.Fatalf("profile:\n%s", p.Output())
	}
	prof := filepath.Join(state, "shardpool", "runs", "t", "profile.json")

	p := testenv.StartEnv(t, xdg, "submit", "--server", env.URL, "--profile", filepath.Join(state, "nothing.json"), spec)
	if code := p.Wait(t, 30*time.Second); code != 2 || !strings.Contains(p.Output(), "no such file") {
		t.Fatalf("submit --profile of a missing file: exit %d, want 2 saying so\n%s", code, p.Output())
	}
	if _, err := env.Run("t"); err == nil {
		t.Fatal("a refused submit published the run")
	}

	p = testenv.StartEnv(t, xdg, "submit", "--server", env.URL, spec)
	if code := p.Wait(t, 30*time.Second); code != 0 || !strings.Contains(p.Output(), "measured peaks ("+prof+"), which the workers admit by: cpu ") {
		t.Fatalf("submit after profile: exit %d, want 0 naming the measured peaks\n%s", code, p.Output())
	}
	r, err := env.Run("t")
	if err != nil || r.MeasuredMemory["cpu"] <= 0 || r.MeasuredMemory["cpu"] >= 512<<20 {
		t.Fatalf("run record's measured_memory %v (%v); want the profile's peak of class cpu, under the declared 512MiB", r.MeasuredMemory, err)
	}

	// An edited job: its profile measured another version.
	b, _ := os.ReadFile(spec)
	if err := os.WriteFile(spec, []byte(strings.Replace(string(b), `["cp",`, `["/bin/cp",`, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	p = testenv.StartEnv(t, xdg, "submit", "--server", env.URL, spec)
	if code := p.Wait(t, 30*time.Second); code != 0 || !strings.Contains(p.Output(), prof+" is not used: it measured another version of this job") ||
		!strings.Contains(p.Output(), "; run `shardpool profile "+spec+"` again") {
		t.Fatalf("submit of an edited job: exit %d, want 0 saying its profile is not used\n%s", code, p.Output())
	}
	if r, err := env.Run("t"); err != nil || len(r.MeasuredMemory) != 0 {
		t.Fatalf("the edited job's run record: measured_memory %v (%v), want none", r.MeasuredMemory, err)
	}
}

// TestSlotsOfAClassServeItsOutliers: run moves the shards far costlier
// than their class's median into a class of their own (cpu-outlier),
// which a user who gave --slots cpu=N never named: it gets cpu's slots,
// and the run completes (it waited for good: "no live worker serves
// class cpu-outlier"). Slots that leave a class of the manifest without
// one (cpu=0, a class misspelt, its outliers given 0) are refused
// before anything is queued, naming the class and its shards.
func TestSlotsOfAClassServeItsOutliers(t *testing.T) {
	line := func(i int, input string) string {
		cost := 1
		if i == 5 {
			cost = 100
		}
		return fmt.Sprintf(`{"id":"s%d","inputs":[%q],"cost":%d}`, i, input, cost)
	}
	spec := testenv.WriteJob(t, testenv.Job{Name: "ol", Shards: 6, Command: []string{"cp", "{input}", "{out}/"}, Line: line})
	data := t.TempDir()
	p := testenv.Start(t, "run", "--data", data, "--slots", "cpu=2", spec)
	if code := p.Wait(t, 60*time.Second); code != 0 || !strings.Contains(p.Output(), "COMPLETE  (6 validated") {
		t.Fatalf("run --slots cpu=2 with an outlier shard: exit %d, want 0 and COMPLETE\n%s", code, p.Output())
	}
	for _, tc := range []struct{ slots, want string }{
		{"cpu=0", "gives no slot to 5 shard(s) of class cpu and 1 shard(s) of class cpu-outlier of "},
		{"cpux=2", "gives no slot to 5 shard(s) of class cpu and 1 shard(s) of class cpu-outlier of "},
		{"cpu=1,cpu-outlier=0", "gives no slot to 1 shard(s) of class cpu-outlier of "},
	} {
		fresh := t.TempDir()
		p := testenv.Start(t, "run", "--data", fresh, "--slots", tc.slots, spec)
		code := p.Wait(t, 30*time.Second)
		if code != 2 || !strings.Contains(p.Output(), tc.want) || !strings.Contains(p.Output(), "this run's worker would never run them") {
			t.Errorf("run --slots %s: exit %d, want 2 with %q\n%s", tc.slots, code, tc.want, p.Output())
		}
		if _, err := os.Stat(filepath.Join(fresh, "stores")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("run --slots %s: a store was made (%v), want nothing queued", tc.slots, err)
		}
	}
}

// TestSbatchSizesByThePeaksSeen: a second `sbatch` for a run under way
// asks each node for the memory its shards were seen to reach (the run
// record's peaks_seen), where that is well above the declared 64 MiB,
// and says so; with no coordinator answering it sizes by the spec and
// says why.
func TestSbatchSizesByThePeaksSeen(t *testing.T) {
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	job := testenv.WriteJob(t, testenv.Job{Shards: 3, Command: []string{"true"}, Extra: "[class.cpu]\ncpus = 1\nmemory = \"64MiB\"\n"})
	env.Submit(job, coordinator.SubmitOptions{})
	ctx := context.Background()
	b := env.Buckets()
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		e, err := b.Runs.Get(ctx, "t")
		if err != nil {
			return false, err.Error()
		}
		var r stream.RunRecord
		if err := stream.Decode(e.Value(), &r); err != nil {
			return false, err.Error()
		}
		r.PeaksSeen = map[string]stream.PeakSeen{"cpu": {Bytes: 512 << 20, Shard: "s0001"}}
		data, _ := stream.Encode(&r)
		_, err = b.Runs.Update(ctx, "t", data, e.Revision())
		return err == nil, fmt.Sprintf("update the run record: %v", err)
	})
	p := testenv.Start(t, "sbatch", "--server", env.URL, "--data", t.TempDir(), "--slots", "2", "--dry-run", job)
	if code := p.Wait(t, 30*time.Second); code != 0 {
		t.Fatalf("sbatch --dry-run: exit %d\n%s", code, p.Output())
	}
	// 2 x 512 MiB, and the worker's 256 MiB.
	for _, want := range []string{"--mem=1280M", "class cpu: sized by the 512.0MiB its shard s0001 reached in this run (the run record's peaks_seen), above the 64.0MiB declared"} {
		if !strings.Contains(p.Output(), want) {
			t.Errorf("sbatch --dry-run lacks %q:\n%s", want, p.Output())
		}
	}
	gone := testenv.Start(t, "sbatch", "--server", "nats://"+testenv.FreePort(t), "--data", t.TempDir(), "--slots", "2", "--dry-run", job)
	if code := gone.Wait(t, 30*time.Second); code != 0 || !strings.Contains(gone.Output(), "--mem=384M") ||
		!strings.Contains(gone.Output(), "sbatch: the run's record could not be read") {
		t.Errorf("sbatch --dry-run with no coordinator: exit %d, want 0, 2 x 64 MiB + 256 MiB and why\n%s", code, gone.Output())
	}
}
