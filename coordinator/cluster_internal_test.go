package coordinator

import (
	"context"
	"errors"
	"net"
	"path/filepath"
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
	free := func() string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Addr().String()
	}
	c, err := New(Config{DataDir: dir, Listen: "127.0.0.1:0", Cluster: free(), Peers: []string{free(), free()}, ReadyTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	err = c.Start(context.Background())
	c.Close()
	if !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "connected to 0 of its 2 peers: a cluster serves once a majority") {
		t.Fatalf("a lone coordinator of a cluster: %v, want ErrNotReady saying it reached 0 of its 2 peers", err)
	}
}
