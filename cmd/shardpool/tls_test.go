package main_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/testenv"
)

// TestTLSCoordinatorAndItsClients: a coordinator that workers on other
// hosts reach sent every byte in the clear, the token with it: anyone on
// the path could take the token and then run commands as this user.
// `shardpool coordinator --tls on` (the default for a listener beyond
// loopback) serves TLS with its store's own certificate authority and says
// which files clients need. A client without the authority is told to
// pass --tls-ca; with it, a worker (started first, waiting for the
// coordinator and its files) and a submit run a job to COMPLETE;
// resume.txt names the file; `status --data` finds it; the stock nats CLI
// gets in with --tlsca. A client given --tls-ca for a coordinator without
// TLS is told so instead of sending its token in the clear. A client
// whose token file has ca.pem beside it pins that one when the
// coordinator asks for TLS.
func TestTLSCoordinatorAndItsClients(t *testing.T) {
	c := newCluster(t)
	ca := filepath.Join(c.data, "jetstream", coordinator.CAName)
	// A worker started before its coordinator (by a scheduler) waits for
	// the authority's file as it waits for the token.
	w := c.worker("w1", "--slots", "cpu=2", "--tls-ca", ca, "--connect-wait", "60s")
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		return strings.Contains(w.Output(), "waiting up to"), "worker output: " + w.Output()
	})
	c.coord = testenv.Start(t, "coordinator", "--data", c.data, "--listen", c.addr, "--http", "", "--tls", "on")
	// Its log's "coordinator ready" can come before the lines for people,
	// which follow it on the other stream: wait for those.
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		out := c.coord.Output()
		return strings.Contains(out, "--tls-ca "+ca) && strings.Contains(out, "tls://"),
			"the coordinator does not say it serves TLS and where its authority is:\n" + out
	})
	spec := testenv.WriteJob(t, testenv.Job{Name: "sealed", Shards: 4, Command: []string{"cp", "{input}", "{out}/"}})

	// The token copied alone: the client is told where the authority is.
	alone := filepath.Join(t.TempDir(), coordinator.TokenName)
	b, err := os.ReadFile(c.token())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(alone, b, 0o600); err != nil {
		t.Fatal(err)
	}
	p := testenv.Start(t, "submit", "--server", c.url, "--token-file", alone, spec)
	if code := p.Wait(t, 30*time.Second); code != 1 || !strings.Contains(p.Output(), "pass --tls-ca FILE") {
		t.Fatalf("submit without the authority: exit %d, want 1 and the way to it\n%s", code, p.Output())
	}
	p = testenv.Start(t, "submit", "--server", c.url, "--token-file", alone, "--tls-ca", ca, spec)
	if code := p.Wait(t, 30*time.Second); code != 0 || !strings.Contains(p.Output(), "published 4 of 4") {
		t.Fatalf("submit with the authority: exit %d\n%s", code, p.Output())
	}
	// The token with ca.pem beside it (a copy of both, or the store
	// itself): the authority is found there once the coordinator asks for
	// TLS.
	p = testenv.Start(t, "submit", "--server", c.url, "--token-file", c.token(), spec)
	if code := p.Wait(t, 30*time.Second); code != 0 || !strings.Contains(p.Output(), "published 0 of 4") {
		t.Fatalf("submit with ca.pem beside the token: exit %d\n%s", code, p.Output())
	}
	natsBin := natsCLI(t)
	tok, err := coordinator.ReadToken(c.token())
	if err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "NATS_URL=nats://"+tok+"@"+c.addr)
	// The last submit pinned the authority it found: the command it
	// recorded to resume the run names it, as the one before did with
	// --tls-ca given. (resume.txt holds one of the two, as the run
	// completed before or after the last submit.)
	cmd := exec.Command(natsBin, "--tlsca", ca, "kv", "get", stream.BucketRuns, "sealed", "--raw")
	cmd.Env = env
	if b, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(b), "--token-file "+c.token()+" --tls-ca "+ca) {
		t.Fatalf("the run record's resume command does not name the authority the last submit pinned: %v\n%s", err, b)
	}
	if b, err := os.ReadFile(filepath.Join(c.data, "runs", "sealed", "resume.txt")); err != nil || !strings.Contains(string(b), "--tls-ca "+ca) {
		t.Fatalf("resume.txt does not name the authority: %v\n%s", err, b)
	}
	testenv.Eventually(t, 60*time.Second, func() (bool, string) {
		st := testenv.Start(t, "status", "--data", c.data, "sealed")
		code := st.Wait(t, 30*time.Second)
		return code == 0 && regexpMatch(`sealed\s+COMPLETE\s+4`, st.Output()), "status --data:\n" + st.Output()
	})

	cmd = exec.Command(natsBin, "--tlsca", ca, "stream", "info", stream.StreamShards, "--json")
	cmd.Env = env
	if b, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(b), `"name": "SHARDS"`) {
		t.Fatalf("nats CLI with --tlsca: %v\n%s", err, b)
	}
	cmd = exec.Command(natsBin, "stream", "info", stream.StreamShards)
	cmd.Env = env
	if b, err := cmd.CombinedOutput(); err == nil {
		t.Fatalf("nats CLI without the authority got in:\n%s", b)
	}

	// --tls-ca for a coordinator that serves no TLS: refused, not sent in
	// the clear.
	plain := startCluster(t, "30s")
	p = testenv.Start(t, "status", "--server", plain.url, "--token-file", plain.token(), "--tls-ca", ca)
	if code := p.Wait(t, 30*time.Second); code != 1 || !strings.Contains(p.Output(), "does not serve TLS") {
		t.Fatalf("status --tls-ca against a coordinator without TLS: exit %d\n%s", code, p.Output())
	}
}
