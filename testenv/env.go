package testenv

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/staging"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker"
	"github.com/shardpool/shardpool/worker/probe"
)

// Options configure an Env; zero values are test-friendly defaults.
type Options struct {
	// Workers started at once, each serving Slots. Default 1.
	Workers int
	// Slots per class for the initial workers. Default cpu=2.
	Slots map[string]int
	// LeaseTTL of the coordinator. Default 3s.
	LeaseTTL time.Duration
	// Grace for children after SIGTERM. Default 2s.
	Grace time.Duration
	// NoWorkers starts none (same as Workers: -1).
	NoWorkers bool
	// OnEvent receives worker admission events.
	OnEvent func(worker.Event)
	// Auto starts workers with measured admission (Slots become caps).
	Auto bool
	// Probe replaces the workers' host probe (fixture hosts).
	Probe *probe.Prober
	// CgroupRoot points workers' per-shard cgroups at a fixture tree.
	CgroupRoot string
	// Binary builds the shardpool binary and gives it to jobs as
	// SHARDPOOL_BIN (for jobs that call "shardpool ckpt").
	Binary bool
	// Sync is the coordinator's sync mode. Default stream.SyncGroup.
	Sync string
	// SlowFS is the workers' Config.SlowFS. Default the worker's.
	SlowFS time.Duration
	// ReportEvery is the workers' report period, which is also how often
	// an auto-mode worker looks at the runs without being told. Default
	// 500ms.
	ReportEvery time.Duration
	// Recheck is the workers' Config.Recheck (default 1s).
	Recheck time.Duration
	// Staging is the workers' Config.Staging (a bandwidth limit makes
	// a copy last). Default the worker's.
	Staging staging.Config
	// Scratch is where the workers' scratch directories are made (one
	// per worker, named for it). Default <Data>/scratch.
	Scratch string
	// HoldTracking starts the coordinator's server (Start) but not its
	// Run (run tracking, advisories, HTTP) until Env.Track is called: what
	// a coordinator between the two, or restarting, misses.
	HoldTracking bool
}

// Env is a running coordinator plus workers.
type Env struct {
	t       testing.TB
	opts    Options
	Data    string
	Coord   *coordinator.Coordinator
	JS      jetstream.JetStream
	URL     string
	cancel  context.CancelFunc
	runCtx  context.Context
	tracked bool
	done    chan error
	mu      sync.Mutex
	workers map[string]*Worker
	n       int
}

// Worker is an in-process worker of an Env.
type Worker struct {
	Name   string
	W      *worker.Worker
	cancel context.CancelFunc
	done   chan error
	ended  chan struct{} // closed when Run has returned
}

// Ended is closed once the worker's Run has returned (after a drain, for
// instance); StopWorker still collects its error.
func (w *Worker) Ended() <-chan struct{} { return w.ended }

// Worker is the running worker named name, or nil.
func (e *Env) Worker(name string) *Worker {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.workers[name]
}

// New starts a coordinator (and workers) for t.
func New(t testing.TB, opts Options) *Env {
	t.Helper()
	if opts.LeaseTTL == 0 {
		opts.LeaseTTL = 3 * time.Second
	}
	if opts.Grace == 0 {
		opts.Grace = 2 * time.Second
	}
	if opts.Slots == nil {
		opts.Slots = map[string]int{stream.DefaultClass: 2}
	}
	if opts.Workers == 0 && !opts.NoWorkers {
		opts.Workers = 1
	}
	e := &Env{t: t, opts: opts, Data: t.TempDir(), workers: map[string]*Worker{}}
	e.startCoordinator()
	for range opts.Workers {
		e.StartWorker("", opts.Slots)
	}
	t.Cleanup(e.Close)
	return e
}

func (e *Env) logger() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	return slog.New(slog.DiscardHandler)
}

func (e *Env) startCoordinator() {
	e.t.Helper()
	listen := "127.0.0.1:0"
	if e.URL != "" {
		listen = e.URL[len("nats://"):]
	}
	c, err := coordinator.New(coordinator.Config{DataDir: e.Data, Listen: listen, HTTP: "127.0.0.1:0", LeaseTTL: e.opts.LeaseTTL, Sync: e.opts.Sync, Logger: e.logger()})
	if err != nil {
		e.t.Fatalf("coordinator config: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := c.Start(ctx); err != nil {
		cancel()
		e.t.Fatalf("start coordinator: %v", err)
	}
	e.Coord, e.JS, e.URL, e.cancel = c, c.JetStream(), c.ClientURL(), cancel
	e.done = make(chan error, 1)
	e.runCtx, e.tracked = ctx, false
	if e.opts.HoldTracking {
		return
	}
	e.Track()
}

// Track runs the coordinator (tracking, advisories, HTTP); startCoordinator
// does unless Options.HoldTracking.
func (e *Env) Track() {
	c, ctx := e.Coord, e.runCtx
	e.tracked = true
	go func() { e.done <- c.Run(ctx) }()
}

func (e *Env) stopCoordinator() {
	if e.cancel == nil {
		return
	}
	e.cancel()
	if !e.tracked {
		e.Coord.Close() // Run, which closes it, never ran
		e.cancel = nil
		return
	}
	select {
	case err := <-e.done:
		if err != nil && !errors.Is(err, context.Canceled) {
			e.t.Errorf("coordinator run: %v", err)
		}
	case <-time.After(20 * time.Second):
		e.t.Errorf("coordinator did not stop within 20s")
	}
	e.cancel = nil
}

// StartWorker starts an in-process worker; name "" picks w1, w2, ...
func (e *Env) StartWorker(name string, slots map[string]int) *Worker {
	e.t.Helper()
	e.mu.Lock()
	if name == "" {
		e.n++
		name = fmt.Sprintf("w%d", e.n)
	}
	e.mu.Unlock()
	bin := ""
	if e.opts.Binary {
		bin = Binary(e.t)
	}
	wk, err := worker.New(worker.Config{JetStream: e.JS, Name: name, Slots: slots, Binary: bin, Auto: e.opts.Auto, Probe: e.opts.Probe, CgroupRoot: e.opts.CgroupRoot, HostLedger: LedgerDir(e.t),
		Scratch: filepath.Join(cmp.Or(e.opts.Scratch, filepath.Join(e.Data, "scratch")), name), StateDir: e.Data, Grace: e.opts.Grace,
		BackoffMin: 100 * time.Millisecond, BackoffMax: time.Second, FetchWait: 500 * time.Millisecond,
		ReportEvery: cmp.Or(e.opts.ReportEvery, 500*time.Millisecond), Recheck: e.opts.Recheck, SlowFS: e.opts.SlowFS, Staging: e.opts.Staging, Logger: e.logger().With("worker", name), OnEvent: e.opts.OnEvent})
	if err != nil {
		e.t.Fatalf("worker config: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &Worker{Name: name, W: wk, cancel: cancel, done: make(chan error, 1), ended: make(chan struct{})}
	go func() {
		err := wk.Run(ctx)
		close(w.ended)
		w.done <- err
	}()
	e.mu.Lock()
	e.workers[name] = w
	e.mu.Unlock()
	return w
}

// StopWorker drains one worker (SIGTERM semantics) and waits for it.
func (e *Env) StopWorker(name string) error {
	e.mu.Lock()
	w := e.workers[name]
	delete(e.workers, name)
	e.mu.Unlock()
	if w == nil {
		return fmt.Errorf("no worker %s", name)
	}
	w.cancel()
	select {
	case err := <-w.done:
		return err
	case <-time.After(30 * time.Second):
		return fmt.Errorf("worker %s did not stop within 30s", name)
	}
}

func (e *Env) stopWorkers() []string {
	e.mu.Lock()
	var names []string
	for n := range e.workers {
		names = append(names, n)
	}
	e.mu.Unlock()
	for _, n := range names {
		if err := e.StopWorker(n); err != nil {
			e.t.Errorf("stop worker: %v", err)
		}
	}
	return names
}

// Close stops workers and the coordinator. It runs from t.Cleanup.
func (e *Env) Close() {
	e.stopWorkers()
	e.stopCoordinator()
}

// Submit validates and submits the spec at path; any error fails the test.
func (e *Env) Submit(path string, opt coordinator.SubmitOptions) coordinator.SubmitResult {
	e.t.Helper()
	res, err := e.TrySubmit(path, opt)
	if err != nil {
		e.t.Fatalf("submit %s: %v", path, err)
	}
	return res
}

// TrySubmit loads the spec and manifest at path (failing the test if they
// do not load) and returns what coordinator.Submit returns, error included.
func (e *Env) TrySubmit(path string, opt coordinator.SubmitOptions) (coordinator.SubmitResult, error) {
	e.t.Helper()
	spec, man := LoadJob(e.t, path)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return coordinator.Submit(ctx, e.JS, spec, man, opt)
}

// Buckets opens the coordinator's KV buckets, failing the test if it cannot.
func (e *Env) Buckets() *stream.Buckets {
	e.t.Helper()
	b, err := stream.OpenBuckets(context.Background(), e.JS)
	if err != nil {
		e.t.Fatalf("open buckets: %v", err)
	}
	return b
}

// Run reads a run record.
func (e *Env) Run(name string) (stream.RunRecord, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return stream.ReadRun(ctx, e.JS, name)
}

// WorkerReport reads the report of worker name from the workers bucket.
func (e *Env) WorkerReport(name string) (stream.WorkerReport, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var r stream.WorkerReport
	kv, err := e.JS.KeyValue(ctx, stream.BucketWorkers)
	if err != nil {
		return r, err
	}
	w, err := kv.Get(ctx, name)
	if err != nil {
		return r, err
	}
	return r, stream.Decode(w.Value(), &r)
}

// Shard reads a shard record.
func (e *Env) Shard(run, id string) (stream.ShardRecord, error) {
	return ReadShard(e.JS, run, id)
}

// ReadShard reads a shard record through any JetStream client.
func ReadShard(js jetstream.JetStream, run, id string) (stream.ShardRecord, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, stream.BucketShards)
	if err != nil {
		return stream.ShardRecord{}, err
	}
	en, err := kv.Get(ctx, stream.ShardKey(run, id))
	if err != nil {
		return stream.ShardRecord{}, err
	}
	var r stream.ShardRecord
	return r, stream.Decode(en.Value(), &r)
}

// WaitState polls the run until it reaches one of states, failing t after timeout.
func (e *Env) WaitState(run string, timeout time.Duration, states ...string) stream.RunRecord {
	e.t.Helper()
	return WaitState(e.t, e.JS, run, timeout, states...)
}

// WaitState polls a run through js until it reaches one of states.
func WaitState(t testing.TB, js jetstream.JetStream, run string, timeout time.Duration, states ...string) stream.RunRecord {
	t.Helper()
	var last stream.RunRecord
	Eventually(t, timeout, func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		r, err := stream.ReadRun(ctx, js, run)
		if err != nil {
			return false, err.Error()
		}
		last = r
		for _, s := range states {
			if r.State == s {
				return true, ""
			}
		}
		return false, fmt.Sprintf("run %s is %s %+v, want one of %v", run, r.State, r.Counts, states)
	})
	return last
}

// Eventually polls cond every 25ms until it holds or timeout passes, then
// fails t with cond's last explanation.
func Eventually(t testing.TB, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	why := ""
	for {
		ok, w := cond()
		if ok {
			return
		}
		why = w
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", timeout, why)
		}
		time.Sleep(25 * time.Millisecond)
	}
}
