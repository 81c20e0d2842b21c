package drill

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardpool/shardpool/checkpoint"
	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/stream"
)

const (
	clusterCheck  = "a cluster loses the coordinator that tracks the runs: run completed, nothing lost"
	clusterRun    = "cluster"
	clusterShards = 24
	clusterSize   = 3
)

// clusterNode is one coordinator of the drill's cluster.
type clusterNode struct {
	data, client, route, name string
	cmd                       *exec.Cmd
	done                      chan struct{} // closed once cmd has been waited for
}

// cluster checks the distributed form's own recovery: three coordinators
// of a NATS cluster (coordinator --cluster), a run submitted to them and a
// worker given all three addresses; the coordinator that tracks the runs
// (the cluster's meta leader, as the coordinators name it) is SIGKILLed
// mid-run. Another must take over, the run must end COMPLETE with each
// shard validated once and every output verifying, and the killed one,
// restarted on its data, must rejoin and answer for the run.
// It shares nothing with the other checks, and runs beside the power
// cuts; its result is the caller's to add, so that the table's order
// does not depend on which ends first.
func (d *drill) cluster(ctx context.Context) Check {
	d.say("cluster: %d coordinators, %d shards, then SIGKILL of the one that tracks the runs", clusterSize, clusterShards)
	detail, err := d.loseClusterLeader(ctx)
	if err != nil {
		return Check{Name: clusterCheck, Status: Fail, Detail: fmt.Sprintf("%v (logs: %s)", err, filepath.Join(d.dir, "cluster-*.log"))}
	}
	return Check{Name: clusterCheck, Status: Pass, Detail: detail}
}

func (d *drill) loseClusterLeader(ctx context.Context) (detail string, err error) {
	base := filepath.Join(d.dir, "cluster")
	nodes := make([]*clusterNode, clusterSize)
	var routes, urls []string
	ports, err := coordinator.LoopbackPorts(2 * clusterSize)
	if err != nil {
		return "", err
	}
	for i := range nodes {
		client, route := ports[2*i], ports[2*i+1]
		nodes[i] = &clusterNode{data: filepath.Join(base, fmt.Sprintf("c%d", i+1)), client: client, route: route,
			name: strings.Replace(route, ":", "-", 1)} // the coordinator's default name
		routes, urls = append(routes, route), append(urls, "nats://"+client)
	}
	url := strings.Join(urls, ",")
	token := filepath.Join(base, "shared", "token") // whichever starts first makes it
	start := func(n *clusterNode) error {
		n.cmd = exec.Command(d.cfg.Binary, "coordinator", "--data", n.data, "--listen", n.client, "--http", "", "--lease-ttl", "3s",
			"--cluster", n.route, "--peers", strings.Join(routes, ","), "--token-file", token)
		log := d.logFile("cluster-" + filepath.Base(n.data))
		n.cmd.Stdout, n.cmd.Stderr = log, log
		if err := n.cmd.Start(); err != nil {
			return fmt.Errorf("start coordinator %s: %w", n.name, err)
		}
		n.done = make(chan struct{})
		go func(cmd *exec.Cmd, done chan struct{}) { cmd.Wait(); close(done) }(n.cmd, n.done)
		return nil
	}
	defer func() {
		for _, n := range nodes {
			if n.cmd != nil && n.cmd.Process != nil {
				n.cmd.Process.Signal(syscall.SIGTERM)
			}
		}
		for _, n := range nodes {
			if n.done != nil {
				<-n.done
			}
		}
	}()
	for _, n := range nodes {
		if err := start(n); err != nil {
			return "", err
		}
	}
	if err := d.poll(ctx, 60*time.Second, "the cluster's token file", func() bool {
		_, err := os.Stat(token)
		return err == nil
	}); err != nil {
		return "", err
	}
	nc, err := connectWithToken(url, token, nats.RetryOnFailedConnect(true))
	if err != nil {
		return "", err
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	var info stream.CoordinatorInfo
	if err := d.poll(ctx, 90*time.Second, "the cluster to elect the coordinator that tracks the runs", func() bool {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		info, err = stream.AskInfoAll(actx, nc, 500*time.Millisecond)
		return err == nil && info.Leader != ""
	}); err != nil {
		return "", err
	}
	spec, man, err := clusterJob(filepath.Join(base, "job"))
	if err != nil {
		return "", err
	}
	sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if _, err := stream.WaitBuckets(sctx, js, 60*time.Second); err != nil {
		return "", fmt.Errorf("the cluster's buckets: %w", err)
	}
	if st, err := js.Stream(sctx, stream.StreamShards); err != nil {
		return "", fmt.Errorf("the cluster's %s stream: %w", stream.StreamShards, err)
	} else if r := st.CachedInfo().Config.Replicas; r != clusterSize {
		return "", fmt.Errorf("the cluster's %s stream keeps %d copies, want %d", stream.StreamShards, r, clusterSize)
	}
	if _, err := coordinator.Submit(sctx, js, spec, man, coordinator.SubmitOptions{}); err != nil {
		return "", fmt.Errorf("submit to the cluster: %w", err)
	}
	w := exec.Command(d.cfg.Binary, "worker", "--server", url, "--token-file", token, "--name", "cw", "--slots", "cpu=3",
		"--data", filepath.Join(base, "worker"), "--scratch", filepath.Join(base, "scratch"), "--grace", "1s")
	wlog := d.logFile("cluster-worker")
	w.Stdout, w.Stderr = wlog, wlog
	if err := w.Start(); err != nil {
		return "", fmt.Errorf("start worker: %w", err)
	}
	defer func() { // before the coordinators stop
		w.Process.Signal(syscall.SIGTERM)
		w.Wait()
	}()
	read := func() (stream.RunRecord, error) {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		return stream.ReadRun(rctx, js, clusterRun)
	}
	var before stream.RunRecord
	if err := d.poll(ctx, 60*time.Second, "5 shards validated through the cluster", func() bool {
		before, err = read()
		return err == nil && before.Counts.Validated >= 5
	}); err != nil {
		return "", err
	}
	// Asked again: leadership may have moved since the election.
	actx, acancel := context.WithTimeout(ctx, 5*time.Second)
	if i, err := stream.AskInfo(actx, nc); err == nil && i.Leader != "" {
		info = i
	}
	acancel()
	var victim *clusterNode
	for _, n := range nodes {
		if n.name == info.Leader {
			victim = n
		}
	}
	if victim == nil {
		return "", fmt.Errorf("the coordinators name %q as their leader, none of the drill's %d", info.Leader, clusterSize)
	}
	d.say("cluster: SIGKILL coordinator %s, which tracks the runs, at %d of %d shards validated", victim.name, before.Counts.Validated, clusterShards)
	victim.cmd.Process.Signal(syscall.SIGKILL)
	<-victim.done
	var after stream.RunRecord
	if err := d.poll(ctx, 90*time.Second, "the run to be COMPLETE with one coordinator lost", func() bool {
		after, err = read()
		return err == nil && after.State == stream.RunComplete
	}); err != nil {
		return "", fmt.Errorf("%w (last seen: %s, %d of %d validated)", err, after.State, after.Counts.Validated, clusterShards)
	}
	var newLeader string
	if err := d.poll(ctx, 30*time.Second, "another coordinator to lead", func() bool {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		i, err := stream.AskInfo(actx, nc)
		newLeader = i.Leader
		return err == nil && newLeader != "" && newLeader != victim.name
	}); err != nil {
		return "", err
	}
	if bad := validatedOnce(ctx, js, clusterRun, after.Fingerprint, spec.Output, clusterShards); len(bad) > 0 {
		return "", fmt.Errorf("after the loss of coordinator %s: %s", victim.name, strings.Join(bad, "; "))
	}
	// The lost coordinator, restarted on its data, rejoins and answers.
	if err := start(victim); err != nil {
		return "", err
	}
	one, err := connectWithToken("nats://"+victim.client, token, nats.RetryOnFailedConnect(true))
	if err != nil {
		return "", err
	}
	defer one.Close()
	ojs, _ := jetstream.New(one)
	if err := d.poll(ctx, 90*time.Second, "the restarted coordinator to answer for the run", func() bool {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		r, err := stream.ReadRun(rctx, ojs, clusterRun)
		return err == nil && r.State == stream.RunComplete
	}); err != nil {
		return "", fmt.Errorf("coordinator %s restarted on its data: %w", victim.name, err)
	}
	return fmt.Sprintf("%d coordinators, each stream in %d copies; %s, which tracked the runs, SIGKILLed at %d of %d shards validated: %s took over, "+
		"the run is COMPLETE, each shard validated once with every attempt closed, every output verifies; %s restarted on its data rejoined and answers for the run",
		clusterSize, clusterSize, victim.name, before.Counts.Validated, clusterShards, newLeader, victim.name), nil
}

// clusterJob writes the cluster check's job into dir (copyJob), with
// shards long enough that the run is under way when its coordinator is
// lost.
func clusterJob(dir string) (*stream.Spec, *stream.Manifest, error) {
	path, err := copyJob(dir, clusterRun, clusterShards, "0.3", 3)
	if err != nil {
		return nil, nil, err
	}
	spec, err := stream.LoadSpec(path)
	if err != nil {
		return nil, nil, err
	}
	man, err := stream.LoadManifest(spec)
	return spec, man, err
}

// validatedOnce returns what is wrong with the shards s00, s01... of a
// run of n shards whose ids are numbered so (the power-cut and cluster
// jobs): one not recorded validated exactly once by the generation fp (KV
// history), one whose record holds an attempt with no outcome, or an
// output that does not verify at the destination.
func validatedOnce(ctx context.Context, js jetstream.JetStream, run, fp, out string, n int) []string {
	shards, err := js.KeyValue(ctx, stream.BucketShards)
	if err != nil {
		return []string{err.Error()}
	}
	var bad []string
	for i := range n {
		id := fmt.Sprintf("s%02d", i)
		hist, err := shards.History(ctx, stream.ShardKey(run, id))
		if err != nil {
			bad = append(bad, fmt.Sprintf("%s: no record history: %v", id, err))
			continue
		}
		if v := len(stream.Validations(hist, fp)); v != 1 {
			bad = append(bad, fmt.Sprintf("%s recorded validated %d times", id, v))
		}
		if err := stream.CheckClosed(hist[len(hist)-1].Value()); err != nil {
			bad = append(bad, fmt.Sprintf("%s: %v", id, err))
		}
		if _, err := checkpoint.VerifyCommitted(filepath.Join(out, id), fp, true); err != nil {
			bad = append(bad, fmt.Sprintf("output %s: %v", id, err))
		}
	}
	return bad
}
