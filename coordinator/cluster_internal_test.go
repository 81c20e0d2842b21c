package coordinator

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shardpool/shardpool/stream"
)

// TestClusterConfig: a cluster of fewer than three coordinators, peers
// without a route listener of its own, or a token file without auth are
// refused before anything starts; a cluster's default sync is always.
func TestClusterConfig(t *testing.T) {
	dir := t.TempDir()
	for _, cfg := range []Config{
		{DataDir: dir, Cluster: "127.0.0.1:6222", Peers: []string{"127.0.0.1:6223"}},
		{DataDir: dir, Cluster: "127.0.0.1:6222", Peers: []string{"127.0.0.1:6222", "127.0.0.1:6223"}},
		{DataDir: dir, Peers: []string{"127.0.0.1:6223", "127.0.0.1:6224"}},
		{DataDir: dir, Cluster: "6222", Peers: []string{"127.0.0.1:6223", "127.0.0.1:6224"}},
		{DataDir: dir, TokenFile: filepath.Join(dir, "token")},
	} {
		if _, err := New(cfg); !errors.Is(err, ErrConfig) {
			t.Errorf("New(%+v): %v, want ErrConfig", cfg, err)
		}
	}
	c, err := New(Config{DataDir: dir, Cluster: "10.0.0.1:6222", Peers: []string{"10.0.0.1:6222", "10.0.0.2:6222", "10.0.0.3:6222"}})
	if err != nil {
		t.Fatal(err)
	}
	if c.cfg.Sync != stream.SyncAlways || c.cfg.Name != "10.0.0.1-6222" || len(c.cfg.Peers) != 2 {
		t.Errorf("cluster config: sync %s, name %s, peers %v; want always, 10.0.0.1-6222 and the two others", c.cfg.Sync, c.cfg.Name, c.cfg.Peers)
	}
}

// TestClusterAloneSaysWhy: a coordinator of a cluster whose peers do not
// run is not ready, and says how many of them it reached and what a
// cluster needs.
func TestClusterAloneSaysWhy(t *testing.T) {
	dir := t.TempDir()
	ports := freePorts(t, 3)
	c, err := New(Config{DataDir: dir, Listen: "127.0.0.1:0", Cluster: ports[0], Peers: ports[1:], ReadyTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	err = c.Start(context.Background())
	c.Close()
	if !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "connected to 0 of its 2 peers: a cluster serves once a majority") {
		t.Fatalf("a lone coordinator of a cluster: %v, want ErrNotReady saying it reached 0 of its 2 peers", err)
	}
}

// TestCASConflictInACluster: submit retries its compare-and-set updates
// of the run record, which the tracker writes too, when stream.IsConflict calls
// the error a conflict; anything else fails the submit. In a cluster
// (replicated buckets) a conflict must still be one. nats.go documents
// that replicated streams may report it with their own code (10164, not
// 10071) and wraps an update's as ErrKeyRevisionMismatch; stream.IsConflict
// takes both forms. (nats-server 2.15.2 answered 10071 here.)
func TestCASConflictInACluster(t *testing.T) {
	dir := t.TempDir()
	routes := freePorts(t, 3)
	cs := make([]*Coordinator, 3)
	errs := make(chan error, 3)
	for i := range cs {
		c, err := New(Config{DataDir: filepath.Join(dir, routes[i]), Listen: "127.0.0.1:0", Cluster: routes[i], Peers: routes,
			Auth: true, TokenFile: filepath.Join(dir, "token"), ReadyTimeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		cs[i] = c
		t.Cleanup(c.Close)
		go func() { errs <- c.Start(context.Background()) }()
	}
	for range cs {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := stream.WaitBuckets(ctx, cs[0].JetStream(), 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	rev, err := b.Runs.Create(ctx, "cas", []byte("{}"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.Runs.Update(ctx, "cas", []byte("{}"), rev+7)
	if err == nil || !stream.IsConflict(err) {
		t.Errorf("update at a stale revision in a cluster: %v; IsConflict says %v, want a conflict", err, err != nil && stream.IsConflict(err))
	}
	_, err = b.Runs.Create(ctx, "cas", []byte("{}"))
	if err == nil || !stream.IsConflict(err) {
		t.Errorf("create of an existing key in a cluster: %v; IsConflict says %v, want a conflict", err, err != nil && stream.IsConflict(err))
	}
}

// freePorts is testenv.FreePorts, which this package's tests cannot
// import (testenv imports coordinator).
func freePorts(t *testing.T, n int) []string {
	t.Helper()
	ports, err := LoopbackPorts(n)
	if err != nil {
		t.Fatal(err)
	}
	return ports
}

// TestLoopbackPortsAvoidTheEphemeralRange: the ports handed to test and
// soak coordinators are distinct, free, and below the kernel's ephemeral
// range, where no outgoing connection takes one before it is bound.
func TestLoopbackPortsAvoidTheEphemeralRange(t *testing.T) {
	low := ephemeralLow()
	if low <= 21000 {
		t.Skipf("this kernel's ephemeral range starts at %d: no room below it, port 0 is used", low)
	}
	ports := freePorts(t, 20)
	seen := map[string]bool{}
	for _, p := range ports {
		_, ps, _ := net.SplitHostPort(p)
		n, _ := strconv.Atoi(ps)
		if seen[p] || n < 20000 || n >= low {
			t.Errorf("port %s: want distinct ports in 20000-%d", p, low-1)
		}
		seen[p] = true
	}
}
