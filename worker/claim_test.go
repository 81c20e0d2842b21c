package worker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker/probe"
)

// workerOnServer starts a real coordinator (closed at cleanup) and returns
// a worker of cfg connected to it with its buckets open, not running.
func workerOnServer(t *testing.T, cfg Config) *Worker {
	t.Helper()
	c, err := coordinator.New(coordinator.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cfg.JetStream, cfg.Name, cfg.Slots = c.JetStream(), "w", map[string]int{"cpu": 1}
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if w.b, err = stream.OpenBuckets(context.Background(), c.JetStream()); err != nil {
		t.Fatal(err)
	}
	return w
}

// TestConcurrentCommitClaimsExactlyOneWins races eight attempts of one
// shard for its commit record on a real JetStream server.
func TestConcurrentCommitClaimsExactlyOneWins(t *testing.T) {
	ctx := context.Background()
	w := workerOnServer(t, Config{})
	w.ttl, w.boot, w.host, w.pid = 30*time.Second, "boot", "host", 1
	dst := t.TempDir() + "/out"
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := &attemptState{m: stream.ShardMsg{Run: "r", ID: "s1", Fingerprint: "fp"}, key: "r.s1", attempt: i + 1}
			// Owners on another host: never provably gone from here.
			errs[i] = w.claimCommit(ctx, a, stream.Owner{Worker: fmt.Sprint("w", i), Host: "elsewhere", Attempt: i + 1}, fmt.Sprintf("sum%d", i), dst)
		}()
	}
	wg.Wait()
	wins := 0
	for i, err := range errs {
		switch {
		case err == nil:
			wins++
		case errors.Is(err, errCommitPending):
		default:
			t.Fatalf("claim %d: %v, want a win or errCommitPending", i, err)
		}
	}
	if wins != 1 {
		t.Fatalf("winners: got %d, want exactly 1", wins)
	}
	hist, err := w.b.Checkpoints.History(ctx, "r.s1")
	if err != nil {
		t.Fatal(err)
	}
	if len(hist) != 1 {
		t.Fatalf("history has %d commit records, want 1", len(hist))
	}
}

// TestAClaimIsAgedByTheStore: a committed claim of another host (its
// owner not provably gone) whose clock is an hour behind is still
// pending while it is fresh, and one whose clock is an hour ahead is
// taken over once older than a lease TTL: the age is the store's stamp's,
// not the claimant's own time. Before, the first was taken over at once
// (a second publish while the first may be under way) and the second
// held the shard's commit for an hour.
func TestAClaimIsAgedByTheStore(t *testing.T) {
	ctx := context.Background()
	w := workerOnServer(t, Config{})
	w.ttl, w.boot, w.host, w.pid = 500*time.Millisecond, "boot", "host", 1
	dst := t.TempDir() + "/out"
	for _, c := range []struct {
		id   string
		skew time.Duration
	}{{"behind", -time.Hour}, {"ahead", time.Hour}} {
		a := &attemptState{m: stream.ShardMsg{Run: "r", ID: c.id, Fingerprint: "fp"}, key: "r." + c.id, attempt: 2}
		other := stream.CommitRecord{Run: "r", ID: c.id, Fingerprint: "fp", State: stream.CommitCommitted,
			Owner: stream.Owner{Worker: "o", Host: "elsewhere", Attempt: 1}, Checksum: "theirs", Path: dst, Time: time.Now().Add(c.skew).UTC()}
		data, err := stream.Encode(&other)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.b.Checkpoints.Create(ctx, a.key, data); err != nil {
			t.Fatal(err)
		}
		owner := stream.Owner{Worker: "w", Host: "host", Attempt: 2}
		if err := w.claimCommit(ctx, a, owner, "mine", dst); !errors.Is(err, errCommitPending) {
			t.Errorf("claim of a clock %s, just written: %v, want errCommitPending", c.skew, err)
		}
		time.Sleep(w.ttl + 100*time.Millisecond)
		if err := w.claimCommit(ctx, a, owner, "mine", dst); err != nil {
			t.Errorf("claim of a clock %s, written a lease TTL ago: %v, want it taken over", c.skew, err)
		}
	}
}

// TestCoordinatorOfThisHostIsShardpoolsCPU: a worker on its coordinator's
// boot and pid namespace counts the coordinator's process tree as
// shardpool's CPU (its CPU meter's roots), not as others' use; on another
// boot it cannot name the process and does not.
func TestCoordinatorOfThisHostIsShardpoolsCPU(t *testing.T) {
	w := workerOnServer(t, Config{})
	ctx := context.Background()
	start := processStart("/proc", os.Getpid())
	w.host, _ = os.Hostname()
	w.boot, w.pidns = stream.BootID("/proc"), stream.PIDNamespace()
	w.learnCoordinator(ctx, w.cfg.JetStream.Conn())
	if got := w.shardpoolRoots(); !slices.Contains(got, probe.ProcID{PID: os.Getpid(), Start: start}) {
		t.Fatalf("roots %+v, want the coordinator's process %d started at %d", got, os.Getpid(), start)
	}
	w.boot = "another-boot"
	w.learnCoordinator(ctx, w.cfg.JetStream.Conn())
	if got := w.shardpoolRoots(); len(got) != 0 {
		t.Fatalf("on another boot: roots %+v, want none", got)
	}
}

// TestBarriersFollowTheCoordinator: a worker learns the coordinator's sync
// mode and whether it shares its boot; only a worker on another boot makes
// the barriers that guard against the coordinator's host crashing alone.
func TestBarriersFollowTheCoordinator(t *testing.T) {
	for _, mode := range []string{stream.SyncGroup, stream.SyncAlways} {
		c, err := coordinator.New(coordinator.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", Sync: mode})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		host, _ := os.Hostname()
		for _, boot := range []string{stream.BootID("/proc"), "another-boot"} {
			w, err := New(Config{JetStream: c.JetStream(), Name: "w", Slots: map[string]int{"cpu": 1}})
			if err != nil {
				t.Fatal(err)
			}
			w.host, w.boot = host, boot
			w.learnCoordinator(ctx, c.JetStream().Conn())
			wantLocal := boot != "another-boot"
			if v := w.coord.Load(); v.sync != mode || v.local != wantLocal {
				t.Fatalf("sync %s, boot %s: learned sync %q local %v, want %q %v", mode, boot, v.sync, v.local, mode, wantLocal)
			}
		}
		c.Close()
	}
	// No coordinator answering: assume the worst (every barrier).
	c, err := coordinator.New(coordinator.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	nc := c.JetStream().Conn()
	w, _ := New(Config{JetStream: c.JetStream(), Name: "w", Slots: map[string]int{"cpu": 1}})
	w.host, w.boot = "h", stream.BootID("/proc")
	c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	w.learnCoordinator(ctx, nc)
	if v := w.coord.Load(); v.sync != stream.SyncGroup || v.local {
		t.Fatalf("without an answer: sync %q local %v, want group and not local", v.sync, v.local)
	}
}

// TestOwnerGoneNeedsAKnownBoot: an owner is proven gone only on this very
// boot of this host, in this pid namespace (or as this very process); two
// owners that could not read their boot ID prove nothing about each other,
// as a pid names a process only within one boot and one namespace.
func TestOwnerGoneNeedsAKnownBoot(t *testing.T) {
	exited := exec.Command("true")
	if err := exited.Run(); err != nil {
		t.Fatal(err)
	}
	dead := exited.Process.Pid
	ns := stream.PIDNamespace()
	if ns == "" {
		t.Fatal("/proc/self/ns/pid unreadable: nothing about a pid can be proven here")
	}
	w := &Worker{host: "h", boot: "boot-1", pid: os.Getpid(), pidns: ns}
	w.cfg.Name = "w"
	for _, c := range []struct {
		name  string
		boot  string
		owner stream.Owner
		gone  bool
	}{
		{"dead process on this boot", "boot-1", stream.Owner{Worker: "x", Host: "h", BootID: "boot-1", PID: dead, PIDNS: ns}, true},
		{"this very process", "boot-1", stream.Owner{Worker: "w", Host: "h", BootID: "boot-1", PID: os.Getpid(), PIDNS: ns}, true},
		{"live process on this boot", "boot-1", stream.Owner{Worker: "x", Host: "h", BootID: "boot-1", PID: os.Getppid(), PIDNS: ns}, false},
		{"another boot", "boot-1", stream.Owner{Worker: "x", Host: "h", BootID: "boot-0", PID: dead, PIDNS: ns}, false},
		{"another host", "boot-1", stream.Owner{Worker: "x", Host: "g", BootID: "boot-1", PID: dead, PIDNS: ns}, false},
		{"both boots unknown", "unknown", stream.Owner{Worker: "x", Host: "h", BootID: "unknown", PID: dead, PIDNS: ns}, false},
		{"both boots empty", "", stream.Owner{Worker: "x", Host: "h", PID: dead, PIDNS: ns}, false},
		// A container sharing the host's name and boot: its pid 1 or 7 is
		// not ours to look up, let alone gone.
		{"another pid namespace", "boot-1", stream.Owner{Worker: "x", Host: "h", BootID: "boot-1", PID: dead, PIDNS: "pid:[1]"}, false},
		{"another pid namespace, same pid and name", "boot-1", stream.Owner{Worker: "w", Host: "h", BootID: "boot-1", PID: os.Getpid(), PIDNS: "pid:[1]"}, false},
		{"namespace not recorded (an older record)", "boot-1", stream.Owner{Worker: "x", Host: "h", BootID: "boot-1", PID: dead}, false},
	} {
		w.boot = c.boot
		if got := w.ownerGone(c.owner); got != c.gone {
			t.Errorf("%s: ownerGone %v, want %v", c.name, got, c.gone)
		}
	}
}

// TestAClaimThatLandedUnansweredIsTheAttemptsOwn: a claim whose Create
// reached the store but whose answer was lost (the coordinator killed
// meanwhile) is found by the attempt's next try. It is the attempt's own,
// so the try succeeds without writing: once the claim was older than a
// lease TTL the attempt wrote it again, two live commits of one output
// in the history (the drill's check failed on it in CI), and while it
// was younger the attempt waited on itself as on another live claimant.
func TestAClaimThatLandedUnansweredIsTheAttemptsOwn(t *testing.T) {
	ctx := context.Background()
	w := workerOnServer(t, Config{})
	w.ttl, w.boot, w.host, w.pid = 300*time.Millisecond, "boot", "host", 1
	dst := t.TempDir() + "/out"
	a := &attemptState{m: stream.ShardMsg{Run: "r", ID: "s1", Fingerprint: "fp"}, key: "r.s1", attempt: 2}
	owner := stream.Owner{Worker: "w", Host: "host", BootID: "boot", PID: 1, Attempt: 2}
	if err := w.claimCommit(ctx, a, owner, "mine", dst); err != nil {
		t.Fatal(err)
	}
	// The same try again at once, and once the claim is older than a TTL.
	if err := w.claimCommit(ctx, a, owner, "mine", dst); err != nil {
		t.Errorf("its own claim, just written: %v, want it taken as won", err)
	}
	time.Sleep(w.ttl + 100*time.Millisecond)
	if err := w.claimCommit(ctx, a, owner, "mine", dst); err != nil {
		t.Errorf("its own claim, a TTL old: %v, want it taken as won", err)
	}
	hist, err := w.b.Checkpoints.History(ctx, a.key)
	if err != nil || len(hist) != 1 {
		t.Fatalf("commit history: %d entries (%v), want the one claim", len(hist), err)
	}
	// Another attempt of the same worker is not this one.
	other := owner
	other.Attempt = 3
	if err := w.claimCommit(ctx, a, other, "theirs", dst); err != nil {
		t.Errorf("another attempt, the first's claim a TTL old and its owner live: %v, want it taken over", err)
	}
	if hist, _ := w.b.Checkpoints.History(ctx, a.key); len(hist) != 2 {
		t.Errorf("commit history: %d entries, want 2 (the other attempt's claim written over the first)", len(hist))
	}
}
