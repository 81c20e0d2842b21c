package main_test

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/testenv"
)

// TestSubmitAndStatusWaitForTheVerdict: `submit --wait` follows the run
// it submitted and exits as `run` does: 0 with the verdict once
// COMPLETE, 3 once BLOCKED, and again 3 after a --retry-failed whose
// shards fail again (the BLOCKED verdict from before the retry does not
// end the wait: every shard ran twice). `status --wait RUN` does the same
// for a run submitted before (with --json, the status document once it
// has its verdict), and for a `shardpool run` that has ended, by its
// last verdict. Interrupted, either stops waiting (130) and the run goes
// on to COMPLETE.
func TestSubmitAndStatusWaitForTheVerdict(t *testing.T) {
	env := testenv.New(t, testenv.Options{Slots: map[string]int{"cpu": 2}})
	ok := testenv.WriteJob(t, testenv.Job{Name: "ok", Shards: 3, Command: []string{"cp", "{input}", "{out}/"}})
	p := testenv.Start(t, "submit", "--server", env.URL, "--wait", ok)
	if code := p.Wait(t, 60*time.Second); code != 0 || !strings.Contains(p.Output(), "run ok: COMPLETE  (3 validated, 0 failed of 3)") {
		t.Fatalf("submit --wait of a run that completes: exit %d, want 0 and the verdict\n%s", code, p.Output())
	}

	bad := testenv.WriteJob(t, testenv.Job{Name: "bad", Shards: 2, Retries: 0, Command: []string{"sh", "-c", "echo boom >&2; exit 3"}})
	for _, extra := range [][]string{nil, {"--retry-failed"}} {
		args := append(append([]string{"submit", "--server", env.URL, "--wait", "--halt", "0"}, extra...), bad)
		p := testenv.Start(t, args...)
		if code := p.Wait(t, 60*time.Second); code != 3 || !strings.Contains(p.Output(), "run bad: BLOCKED  (0 validated, 2 failed of 2)") {
			t.Fatalf("submit --wait %v of a run whose shards fail: exit %d, want 3 and the verdict\n%s", extra, code, p.Output())
		}
	}
	for _, id := range []string{"s0000", "s0001"} {
		if rec, err := env.Shard("bad", id); err != nil || len(rec.Attempts) != 2 {
			t.Errorf("shard %s after a retry: %d attempt(s) (%v), want 2: the wait ended on the verdict from before the retry", id, len(rec.Attempts), err)
		}
	}

	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"ok"}, 0, "run ok: COMPLETE  (3 validated, 0 failed of 3)"},
		{[]string{"bad"}, 3, "run bad: BLOCKED  (0 validated, 2 failed of 2)"},
		{[]string{"--json", "ok"}, 0, `"state": "COMPLETE"`},
		{[]string{"nosuch"}, 1, "not found"},
		{nil, 2, "status --wait: name the RUN to wait for"},
	} {
		p := testenv.Start(t, append([]string{"status", "--server", env.URL, "--wait"}, c.args...)...)
		if code := p.Wait(t, 30*time.Second); code != c.code || !strings.Contains(p.Output(), c.want) {
			t.Errorf("status --wait %v: exit %d, want %d and %q\n%s", c.args, code, c.code, c.want, p.Output())
		}
	}
	data := t.TempDir()
	local := testenv.WriteJob(t, testenv.Job{Name: "ok", Shards: 1, Command: []string{"cp", "{input}", "{out}/"}})
	if code := testenv.Start(t, "run", "--data", data, "--slots", "1", local).Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("run: exit %d", code)
	}
	if p := testenv.Start(t, "status", "--data", data, "--wait", "ok"); p.Wait(t, 30*time.Second) != 0 {
		t.Errorf("status --data --wait of a run that ended COMPLETE: want exit 0 by its last verdict\n%s", p.Output())
	}

	gate := testenv.NewGate(t)
	gated := testenv.WriteJob(t, testenv.Job{Name: "gated", Shards: 2, Command: gate.NoteThenCopy()})
	p = testenv.Start(t, "submit", "--server", env.URL, "--wait", gated)
	gate.WaitStarted("s0000", "s0001")
	st := testenv.Start(t, "status", "--server", env.URL, "--wait", "gated")
	time.Sleep(300 * time.Millisecond) // into its wait
	for _, w := range []*testenv.Proc{p, st} {
		w.SignalMain(syscall.SIGINT)
		if code := w.Wait(t, 30*time.Second); code != 130 || !strings.Contains(w.Output(), "stopped waiting; the run goes on with its workers: shardpool status --server ") {
			t.Fatalf("--wait interrupted: exit %d, want 130 saying the run goes on\n%s", code, w.Output())
		}
	}
	gate.Open()
	env.WaitState("gated", 30*time.Second, stream.RunComplete)
}
