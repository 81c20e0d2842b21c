package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/testenv"
)

// TestClusterOfCoordinatorsLosesOne: three coordinators form a NATS
// cluster (--cluster, --peers, one shared --token-file) whose streams and
// buckets keep three copies. The coordinator that leads, and so tracks the
// runs, is killed with SIGKILL while a worker that knows all three runs
// the shards: another takes over the tracking, the run completes, every
// shard is validated exactly once, and the killed one, restarted on its
// --data, rejoins and answers status.
func TestClusterOfCoordinatorsLosesOne(t *testing.T) {
	for _, tlsMode := range []string{"off", "on"} {
		t.Run("tls "+tlsMode, func(t *testing.T) { clusterLosesOne(t, tlsMode) })
	}
}

// clusterLosesOne is TestClusterOfCoordinatorsLosesOne with --tls
// tlsMode: on, the clients' listeners and the routes between the
// coordinators serve TLS with certificates of one authority, made beside
// the shared token file, which clients pin from there.
func clusterLosesOne(t *testing.T, tlsMode string) {
	dir := t.TempDir()
	type node struct {
		data, client, route string
		p                   *testenv.Proc
	}
	nodes := make([]*node, 3)
	var routes, urls []string
	ports := testenv.FreePorts(t, 2*len(nodes))
	for i := range nodes {
		nodes[i] = &node{data: filepath.Join(dir, fmt.Sprintf("c%d", i+1)), client: ports[2*i], route: ports[2*i+1]}
		routes = append(routes, nodes[i].route)
		urls = append(urls, "nats://"+nodes[i].client)
	}
	url := strings.Join(urls, ",")
	// One token file for all (and the authority beside it): whichever
	// starts first makes them, and their directory.
	token := filepath.Join(dir, "shared", "token")
	start := func(n *node) {
		n.p = testenv.Start(t, "coordinator", "--data", n.data, "--listen", n.client, "--http", "", "--lease-ttl", "5s",
			"--cluster", n.route, "--peers", strings.Join(routes, ","), "--token-file", token, "--tls", tlsMode)
	}
	for _, n := range nodes {
		start(n)
	}
	for _, n := range nodes {
		testenv.Eventually(t, 60*time.Second, func() (bool, string) {
			return strings.Contains(n.p.Output(), "coordinator ready"), "coordinator output:\n" + n.p.Output()
		})
	}
	tok, err := coordinator.ReadToken(token)
	if err != nil {
		t.Fatal(err)
	}
	opts := []nats.Option{nats.Token(tok), nats.MaxReconnects(-1), nats.ReconnectWait(100 * time.Millisecond)}
	if tlsMode == "on" {
		tc, err := coordinator.ClientTLS(filepath.Join(filepath.Dir(token), coordinator.CAName))
		if err != nil {
			t.Fatal(err)
		}
		opts = append(opts, nats.Secure(tc))
		for _, n := range nodes {
			if !strings.Contains(n.p.Output(), "TLS: clients pin the certificate authority in "+filepath.Join(filepath.Dir(token), coordinator.CAName)) {
				t.Fatalf("coordinator does not serve TLS with the authority beside the token:\n%s", n.p.Output())
			}
		}
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	info, err := js.Stream(context.Background(), stream.StreamShards)
	if err != nil {
		t.Fatal(err)
	}
	if r := info.CachedInfo().Config.Replicas; r != 3 {
		t.Fatalf("SHARDS keeps %d copies, want 3", r)
	}

	spec := testenv.WriteJob(t, testenv.Job{Shards: 30, Retries: 3, Command: []string{"sh", "-c", `sleep 0.3; cp "$1" "$2/"`, "sh", "{input}", "{out}"}})
	sub := testenv.Start(t, "submit", "--server", url, "--token-file", token, spec)
	if code := sub.Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("submit to the cluster: exit %d\n%s", code, sub.Output())
	}
	w := testenv.Start(t, "worker", "--server", url, "--token-file", token, "--name", "w1", "--slots", "cpu=3",
		"--data", filepath.Join(dir, "w1"), "--scratch", filepath.Join(dir, "scratch"), "--grace", "2s")
	testenv.Eventually(t, 60*time.Second, func() (bool, string) {
		r, err := stream.ReadRun(context.Background(), js, "t")
		return err == nil && r.Counts.Validated >= 5, fmt.Sprintf("run %+v, %v\nworker:\n%s", r.Counts, err, w.Output())
	})
	// Whichever coordinator status asks, the worker (connected to one of
	// them) is not taken for disconnected: every coordinator's clients
	// are heard.
	leaders := map[string]bool{}
	for _, n := range nodes {
		var st coordinator.Status
		p := testenv.Start(t, "status", "--json", "--server", "nats://"+n.client, "--token-file", token)
		if code := p.Wait(t, 30*time.Second); code != 0 {
			t.Fatalf("status --json through %s: exit %d\n%s", n.client, code, p.Output())
		}
		if err := json.Unmarshal([]byte(p.Output()), &st); err != nil {
			t.Fatalf("status --json through %s: %v\n%s", n.client, err, p.Output())
		}
		if st.Coordinator == nil || st.Coordinator.Coordinators != 3 || !slices.Contains(st.Coordinator.Clients, "shardpool-worker-w1") {
			t.Errorf("status through %s: coordinator %+v; want 3 coordinators whose clients include the worker's connection", n.client, st.Coordinator)
		}
		if st.Coordinator != nil {
			leaders[st.Coordinator.Leader] = true
		}
		for _, wk := range st.Workers {
			if wk.Name == "w1" && wk.Disconnected != "" {
				t.Errorf("status through %s takes the live worker for disconnected: %s", n.client, wk.Disconnected)
			}
		}
	}
	leads := regexp.MustCompile(`this coordinator leads`)
	var leader *node
	for _, n := range nodes {
		if m := leads.FindAllStringIndex(n.p.Output(), -1); m != nil && !strings.Contains(n.p.Output()[m[len(m)-1][0]:], "leadership moved") {
			leader = n
		}
	}
	if leader == nil {
		t.Fatal("no coordinator says it leads")
	}
	// Every coordinator names the one that tracks the runs, as its log
	// says it does: status prints it, and the drill kills it.
	if want := strings.Replace(leader.route, ":", "-", 1); len(leaders) != 1 || !leaders[want] {
		t.Errorf("status through the three coordinators names the leader %v; want only %s, whose log says it leads", slices.Collect(maps.Keys(leaders)), want)
	}
	leader.p.SignalMain(syscall.SIGKILL)
	leader.p.Wait(t, 10*time.Second)
	testenv.WaitState(t, js, "t", 90*time.Second, stream.RunComplete)
	validatedOnce(t, js, "t", filepath.Join(filepath.Dir(spec), "out"), 30)
	took := 0
	var tracker *node
	for _, n := range nodes {
		if n != leader && leads.MatchString(n.p.Output()) {
			took++
			tracker = n
		}
	}
	if took != 1 {
		t.Errorf("%d of the remaining coordinators took over the tracking, want 1", took)
	}

	start(leader)
	testenv.Eventually(t, 60*time.Second, func() (bool, string) {
		return strings.Contains(leader.p.Output(), "coordinator ready"), "restarted coordinator:\n" + leader.p.Output()
	})
	st := testenv.Start(t, "status", "--server", "nats://"+leader.client, "--token-file", token, "t")
	if code := st.Wait(t, 30*time.Second); code != 0 || !strings.Contains(st.Output(), "COMPLETE") || !strings.Contains(st.Output(), "one of cluster shardpool") ||
		!strings.Contains(st.Output(), "runs tracked by 127.0.0.1-") {
		t.Fatalf("status from the restarted coordinator: exit %d\n%s", code, st.Output())
	}
	// status --data finds the shared token file (and authority) itself.
	st = testenv.Start(t, "status", "--data", leader.data, "t")
	if code := st.Wait(t, 30*time.Second); code != 0 || !strings.Contains(st.Output(), "COMPLETE") {
		t.Fatalf("status --data of a cluster's coordinator: exit %d\n%s", code, st.Output())
	}
	w.SignalMain(syscall.SIGTERM)
	w.Wait(t, 30*time.Second)
	stopLastTracker(t, nodes[0].p, nodes[1].p, nodes[2].p, tracker.p)
}

// stopLastTracker stops the coordinators of a cluster, the one that
// tracks the runs last, when no majority is left: it used to take 10 s to
// exit, silent, its run watches' consumer deletions each waiting out the
// JetStream request timeout (stream.StopWatch).
func stopLastTracker(t *testing.T, all ...*testenv.Proc) {
	tracker := all[len(all)-1]
	for _, p := range all[:len(all)-1] {
		if p == tracker {
			continue
		}
		p.SignalMain(syscall.SIGTERM)
		if code := p.Wait(t, 30*time.Second); code != 0 {
			t.Errorf("coordinator stopped with SIGTERM: exit %d\n%s", code, p.Output())
		}
	}
	start := time.Now()
	tracker.SignalMain(syscall.SIGTERM)
	code := tracker.Wait(t, 30*time.Second)
	if d := time.Since(start); code != 0 || d > 6*time.Second {
		t.Errorf("the tracking coordinator, left without a majority, stopped with SIGTERM: exit %d after %s, want 0 within 6 s\n%s", code, d.Round(time.Millisecond), tracker.Output())
	}
}

// TestClusterNeedsATokenFile: each coordinator of a cluster making a
// token of its own would refuse the others' routes and each other's
// clients; a cluster without --token-file is refused, saying why.
func TestClusterNeedsATokenFile(t *testing.T) {
	ports := testenv.FreePorts(t, 3)
	p := testenv.Start(t, "coordinator", "--data", t.TempDir(), "--listen", "127.0.0.1:0", "--http", "",
		"--cluster", ports[0], "--peers", ports[1]+","+ports[2])
	if code := p.Wait(t, 30*time.Second); code != 2 || !strings.Contains(p.Output(), "--cluster needs --token-file FILE") {
		t.Fatalf("cluster without a token file: exit %d, want 2 and the reason\n%s", code, p.Output())
	}
}
