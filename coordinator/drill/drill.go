package drill

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardpool/shardpool/checkpoint"
	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/examples/train"
	"github.com/shardpool/shardpool/stream"
)

// Config configures a drill.
type Config struct {
	// Binary is the shardpool executable to start as coordinator and workers. Required.
	Binary string
	// DataDir is the state directory; the drill works in DataDir/drill/<time>/. Required.
	DataDir string
	// Progress receives one line per step; nil discards.
	Progress io.Writer
	// Timeout bounds the whole drill. Default 110s.
	Timeout time.Duration
}

// Check statuses.
const (
	Pass       = "PASS"
	Fail       = "FAIL"
	Unverified = "UNVERIFIED"
)

// Check is one line of the drill's table.
type Check struct {
	Name   string `json:"name"`
	Status string `json:"status"`
	Detail string `json:"detail"`
}

// Report is drill.json.
type Report struct {
	V        int       `json:"v"`
	Started  time.Time `json:"started"`
	Seconds  float64   `json:"seconds"`
	Dir      string    `json:"dir"`
	Passed   bool      `json:"passed"`
	Checks   []Check   `json:"checks"`
	Evidence string    `json:"evidence"`
}

const (
	// RunName names the drill's own run, and DATA/runs/RunName/ is where a
	// copy of its drill.json lands, where a person looks first.
	RunName = "drill"
	// ReportName is the drill's report in its run's evidence folder.
	ReportName = "drill.json"
	cpuN       = 6
	steps      = 6
)

type drill struct {
	cfg    Config
	dir    string
	addr   string
	url    string
	coord  *exec.Cmd
	procs  []*exec.Cmd
	nc     *nats.Conn
	js     jetstream.JetStream
	spec   *stream.Spec
	man    *stream.Manifest
	out    string
	report Report
	mu     sync.Mutex
}

// Run executes the drill. The returned report says which checks passed;
// err is for a drill that could not run at all.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.Binary == "" || cfg.DataDir == "" {
		return nil, fmt.Errorf("drill: Binary and DataDir are required")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 110 * time.Second
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	start := time.Now().UTC()
	d := &drill{cfg: cfg, dir: filepath.Join(cfg.DataDir, "drill", start.Format("20060102T150405"))}
	d.report = Report{V: 1, Started: start, Dir: d.dir}
	defer d.stopAll()
	err := d.run(ctx)
	d.report.Seconds = time.Since(start).Seconds()
	d.report.Passed = err == nil
	for _, c := range d.report.Checks {
		if c.Status == Fail {
			d.report.Passed = false
		}
	}
	if err != nil {
		d.check("drill completed its steps", Fail, err.Error())
	}
	d.writeReport()
	return &d.report, nil
}

// connectWithToken connects to a coordinator of the drill with the token
// in file token, reconnecting for as long as the drill runs; extra options
// follow (a cluster's connections also wait for a first answer).
func connectWithToken(url, token string, extra ...nats.Option) (*nats.Conn, error) {
	opts := []nats.Option{nats.TokenHandler(coordinator.TokenReader(token)), nats.MaxReconnects(-1), nats.ReconnectWait(100 * time.Millisecond)}
	return nats.Connect(url, append(opts, extra...)...)
}

func (d *drill) say(format string, args ...any) {
	d.mu.Lock() // the cluster check says its steps beside the power cuts'
	defer d.mu.Unlock()
	fmt.Fprintf(d.cfg.Progress, "drill: "+format+"\n", args...)
}

func (d *drill) check(name, status, detail string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.report.Checks = append(d.report.Checks, Check{Name: name, Status: status, Detail: detail})
}

func (d *drill) checkIf(name string, ok bool, detail string) {
	st := Pass
	if !ok {
		st = Fail
	}
	d.check(name, st, detail)
}

func (d *drill) run(ctx context.Context) (err error) {
	if err := d.fixture(); err != nil {
		return fmt.Errorf("fixture: %w", err)
	}
	if err := d.startCoordinator(ctx); err != nil {
		return err
	}
	d.nc, err = connectWithToken(d.url, d.tokenFile())
	if err != nil {
		return err
	}
	defer d.nc.Close()
	defer func() { // before the connection closes
		if err != nil {
			err = fmt.Errorf("%w%s", err, d.attemptsSaid())
		}
	}()
	d.js, _ = jetstream.New(d.nc)
	retry := fmt.Sprintf("shardpool submit --server %s --token-file %s --retry-failed %s", d.url, d.tokenFile(), d.spec.SpecPath)
	if _, err := coordinator.Submit(ctx, d.js, d.spec, d.man, coordinator.SubmitOptions{Retry: retry,
		Resume: fmt.Sprintf("shardpool submit --server %s --token-file %s %s", d.url, d.tokenFile(), d.spec.SpecPath)}); err != nil {
		return fmt.Errorf("submit: %w", err)
	}
	d.say("submitted %d shards (%d cpu, 1 big); starting worker w1 (cpu=2)", len(d.man.Shards), cpuN)
	w1 := d.startWorker("w1", "cpu=2")

	// 1. Wait for completed outputs and a running shard with two generations.
	var victim string
	var victimGens []int64
	if err := d.poll(ctx, 60*time.Second, "two validated shards and a running one with 2+ checkpoint generations", func() bool {
		r, err := d.runRecord(ctx)
		if err != nil || r.Counts.Validated < 2 {
			return false
		}
		for _, id := range d.cpuIDs() {
			rec, err := d.shard(ctx, id)
			if err != nil || rec.State != stream.ShardRunning {
				continue
			}
			if gens := d.gens(id); len(gens) >= 2 {
				victim, victimGens = id, gens
				return true
			}
		}
		return false
	}); err != nil {
		return err
	}
	before := d.snapshot()
	d.say("%d outputs committed; SIGKILL worker w1 while %s is at generation %d", len(before), victim, victimGens[0])
	running := d.runningIDs(ctx)
	w1.Process.Signal(syscall.SIGKILL)
	w1.Wait()

	// 2. Corrupt the victim's newest generation.
	corruptGen := victimGens[0]
	corruptFile := filepath.Join(checkpointDir(d.out, victim), fmt.Sprintf("gen-%d", corruptGen), "state")
	if err := os.Truncate(corruptFile, 0); err != nil {
		return fmt.Errorf("corrupt %s: %w", corruptFile, err)
	}
	d.say("truncated %s", corruptFile)

	// 3. SIGKILL the coordinator and restart it on the same data.
	d.coord.Process.Signal(syscall.SIGKILL)
	d.coord.Wait()
	d.say("SIGKILL coordinator; restarting it on the same data directory")
	if err := d.startCoordinator(ctx); err != nil {
		return fmt.Errorf("restart coordinator: %w", err)
	}

	// 4. Truncate one committed output.
	var truncated string
	for id := range before {
		truncated = id
		break
	}
	tf := filepath.Join(d.out, truncated, "summary")
	if err := os.Truncate(tf, 3); err != nil {
		return fmt.Errorf("truncate %s: %w", tf, err)
	}
	d.say("truncated committed output %s; starting worker w2 (cpu=2)", tf)
	d.startWorker("w2", "cpu=2")

	// 4b. SIGKILL the coordinator while w2 runs shards and keep it down
	// past the lease TTL: the commands run on, and those that end in the
	// outage keep their outputs until it answers again.
	through, err := d.outageWhileRunning(ctx, "w2")
	if err != nil {
		return err
	}

	// 5. Every cpu shard done; the big shard must wait with its reason.
	if err := d.poll(ctx, 60*time.Second, "every cpu shard validated", func() bool {
		r, err := d.runRecord(ctx)
		return err == nil && r.ClassCounts["cpu"].Validated == cpuN
	}); err != nil {
		return err
	}
	st, err := coordinator.ReadStatus(ctx, d.js, RunName)
	waitReason := ""
	if err == nil && len(st.Runs) == 1 {
		waitReason = strings.Join(st.Runs[0].Waiting, "; ")
	}
	bigRec, _ := d.shard(ctx, "big")
	pendingOK := strings.Contains(waitReason, "no live worker serves class big") && bigRec.State != stream.ShardValidated
	d.say("big shard waits: %q; starting worker w3 (big=1)", waitReason)
	d.startWorker("w3", "big=1")

	// 6. The truncated output blocks the run at final verification; retry it.
	var blocked stream.RunRecord
	if err := d.poll(ctx, 60*time.Second, "the run to reach BLOCKED or COMPLETE", func() bool {
		r, err := d.runRecord(ctx)
		blocked = r
		return err == nil && (r.State == stream.RunBlocked || r.State == stream.RunComplete)
	}); err != nil {
		return err
	}
	detected := blocked.State == stream.RunBlocked && d.failedVerification(ctx, truncated)
	if blocked.State == stream.RunBlocked {
		d.say("BLOCKED as expected: %s; retrying failed shards", blocked.Reason)
		if _, err := coordinator.Submit(ctx, d.js, d.spec, d.man, coordinator.SubmitOptions{RetryFailed: true}); err != nil {
			return fmt.Errorf("retry: %w", err)
		}
	}
	var final stream.RunRecord
	// And its verdict written: the coordinator writes final.json just
	// after the record, and a look in between read the BLOCKED one's
	// counts (6 of 7 validated, in CI).
	if err := d.poll(ctx, 60*time.Second, "the run to be COMPLETE, with its final.json", func() bool {
		r, err := d.runRecord(ctx)
		final = r
		if err != nil || r.State != stream.RunComplete {
			return false
		}
		f, err := coordinator.ReadFinal(filepath.Join(d.dir, "coord", "runs", RunName))
		return err == nil && f != nil && f.State == stream.RunComplete && f.Fingerprint == r.Fingerprint
	}); err != nil {
		return err
	}
	d.say("COMPLETE; checking")
	d.verify(ctx, before, running, victim, corruptGen, truncated, detected, blocked.Reason, pendingOK, waitReason, final, through)
	return nil
}

// outage is how long the drill keeps the coordinator down while shards
// run: longer than its 3 s lease TTL, so that the store, which counts a
// lease's TTL across its own downtime, has let their leases expire when
// it comes back, and longer than a worker's 5 s request timeout after the
// fixture's 1.5 s shards end, so that their commits wait for it rather
// than being answered from nats.go's reconnect buffer.
const outage = 7 * time.Second

// ranAt is a shard's attempt that was running when the coordinator died.
type ranAt struct {
	id, worker string
	n          int
}

// outageWhileRunning waits for worker to run a cpu shard, SIGKILLs the
// coordinator, and restarts it on the same data after outage. It returns
// the attempts that were running at the kill.
func (d *drill) outageWhileRunning(ctx context.Context, worker string) ([]ranAt, error) {
	var through []ranAt
	if err := d.poll(ctx, 30*time.Second, "worker "+worker+" to run a shard", func() bool {
		through = through[:0]
		for _, id := range d.cpuIDs() {
			r, err := d.shard(ctx, id)
			if err != nil || !r.OpenAttempt() {
				continue
			}
			if a := r.Attempts[len(r.Attempts)-1]; a.Worker == worker {
				through = append(through, ranAt{id, worker, a.N})
			}
		}
		return len(through) > 0
	}); err != nil {
		return nil, err
	}
	var names []string
	for _, a := range through {
		names = append(names, fmt.Sprintf("%s (attempt %d)", a.id, a.n))
	}
	d.say("SIGKILL coordinator while %s runs %s; restarting it in %s", worker, strings.Join(names, ", "), outage)
	d.coord.Process.Signal(syscall.SIGKILL)
	d.coord.Wait()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(outage):
	}
	if err := d.startCoordinator(ctx); err != nil {
		return nil, fmt.Errorf("restart coordinator: %w", err)
	}
	return through, nil
}

// verifyOutage checks that each attempt running when the coordinator died
// was the one that committed its shard, with no other attempt of its
// worker: the outage cost no shard its run.
func (d *drill) verifyOutage(ctx context.Context, through []ranAt) {
	var bad, ok []string
	for _, at := range through {
		r, err := d.shard(ctx, at.id)
		if err != nil {
			bad = append(bad, fmt.Sprintf("%s: %v", at.id, err))
			continue
		}
		var said []string
		committed := false
		for _, a := range r.Attempts {
			if a.Worker != at.worker {
				continue // w1's, before the outage
			}
			if a.N == at.n && a.Outcome == stream.OutcomeOK {
				committed = true
				continue
			}
			said = append(said, fmt.Sprintf("attempt %d %s %s", a.N, a.Outcome, a.Reason))
		}
		if r.State != stream.ShardValidated || !committed || len(said) > 0 {
			bad = append(bad, fmt.Sprintf("%s: %s, attempt %d committed %v; %s", at.id, r.State, at.n, committed, strings.Join(said, "; ")))
			continue
		}
		waited := ""
		if d.admissionSaid(at.id, "decision=resume") {
			waited = " (its commit waited for the coordinator)"
		}
		ok = append(ok, fmt.Sprintf("%s attempt %d%s", at.id, at.n, waited))
	}
	d.checkIf("coordinator SIGKILL while shards run: they ran on and committed", len(through) > 0 && len(bad) == 0,
		fmt.Sprintf("down %s with %d running; committed by the attempt running then: %s; %s", outage, len(through), strings.Join(ok, ", "), strings.Join(bad, "; ")))
}

// failedVerification reports whether the shard's record history shows it
// failed because its output did not verify at the destination.
func (d *drill) failedVerification(ctx context.Context, id string) bool {
	kv, err := d.js.KeyValue(ctx, stream.BucketShards)
	if err != nil {
		return false
	}
	hist, err := kv.History(ctx, stream.ShardKey(RunName, id))
	if err != nil {
		return false
	}
	for _, e := range hist {
		var r stream.ShardRecord
		if stream.Decode(e.Value(), &r) == nil && r.State == stream.ShardFailed && strings.Contains(r.Reason, "failed verification") {
			return true
		}
	}
	return false
}

// checkpointDir is the shard's {ckpt} (worker.CkptDir): the drill's run
// has one generation, so the one directory under the run's.
func checkpointDir(out, id string) string {
	dirs, _ := filepath.Glob(filepath.Join(out, ".shardpool", "ckpt", RunName, "*", id))
	if len(dirs) == 1 {
		return dirs[0]
	}
	return filepath.Join(out, ".shardpool", "ckpt", RunName, "none", id)
}

func (d *drill) fixture() error {
	job := filepath.Join(d.dir, "job")
	if err := os.MkdirAll(job, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(job, "train.sh"), train.Script, 0o755); err != nil {
		return err
	}
	var m strings.Builder
	for i := range cpuN {
		fmt.Fprintf(&m, "{\"id\":\"s%d\",\"params\":{\"steps\":\"%d\"}}\n", i, steps)
	}
	m.WriteString("{\"id\":\"big\",\"class\":\"big\",\"params\":{\"steps\":\"2\"}}\n")
	if err := os.WriteFile(filepath.Join(job, "manifest.jsonl"), []byte(m.String()), 0o644); err != nil {
		return err
	}
	spec := `name = "drill"
manifest = "manifest.jsonl"
output = "out"
command = ["./train.sh", "{out}"]
retries = 3
timeout = "60s"
code_rev = "drill"
env = { STEP_SECONDS = "0.25" }
[class.cpu]
cpus = 1
[class.big]
cpus = 1
memory = "1GiB"
`
	sp := filepath.Join(job, "shardpool.toml")
	if err := os.WriteFile(sp, []byte(spec), 0o644); err != nil {
		return err
	}
	var err error
	if d.spec, err = stream.LoadSpec(sp); err != nil {
		return err
	}
	d.out = d.spec.Output
	d.man, err = stream.LoadManifest(d.spec)
	return err
}

func (d *drill) startCoordinator(ctx context.Context) error {
	if d.addr == "" {
		// Below the ephemeral range (LoopbackPorts): the coordinator is
		// restarted on this address twice, the second time after a 7 s
		// outage, and an outgoing connection must not take it meanwhile.
		ports, err := coordinator.LoopbackPorts(1)
		if err != nil {
			return err
		}
		d.addr = ports[0]
		d.url = "nats://" + d.addr
	}
	cmd := exec.Command(d.cfg.Binary, "coordinator", "--data", filepath.Join(d.dir, "coord"), "--listen", d.addr,
		"--http", "", "--lease-ttl", "3s")
	cmd.Stdout, cmd.Stderr = d.logFile("coordinator"), d.logFile("coordinator")
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start coordinator: %w", err)
	}
	d.coord = cmd
	return d.poll(ctx, 20*time.Second, "the coordinator to accept connections", func() bool {
		c, err := net.DialTimeout("tcp", d.addr, 200*time.Millisecond)
		if err != nil {
			return false
		}
		c.Close()
		return true
	})
}

// tokenFile holds the drill coordinator's token (coordinator.TokenName in
// its store), which its workers and the drill's own connection present.
func (d *drill) tokenFile() string {
	return filepath.Join(d.dir, "coord", "jetstream", coordinator.TokenName)
}

func (d *drill) logFile(name string) *os.File {
	f, err := os.OpenFile(filepath.Join(d.dir, name+".log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil
	}
	return f
}

func (d *drill) startWorker(name, slots string) *exec.Cmd {
	cmd := exec.Command(d.cfg.Binary, "worker", "--server", d.url, "--token-file", d.tokenFile(), "--name", name, "--slots", slots,
		"--data", filepath.Join(d.dir, "workers"), "--scratch", filepath.Join(d.dir, "scratch-"+name), "--grace", "1s")
	cmd.Stdout, cmd.Stderr = d.logFile("worker-"+name), d.logFile("worker-"+name)
	if err := cmd.Start(); err != nil {
		d.say("start worker %s: %v", name, err)
		return cmd
	}
	d.procs = append(d.procs, cmd)
	return cmd
}

func (d *drill) stopAll() {
	for _, p := range d.procs {
		if p.Process != nil && p.ProcessState == nil {
			p.Process.Signal(syscall.SIGTERM)
		}
	}
	for _, p := range d.procs {
		if p.Process != nil && p.ProcessState == nil {
			p.Wait()
		}
	}
	if d.coord != nil && d.coord.ProcessState == nil {
		d.coord.Process.Signal(syscall.SIGTERM)
		d.coord.Wait()
	}
}

func (d *drill) poll(ctx context.Context, timeout time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting for %s", timeout, what)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

func (d *drill) runRecord(ctx context.Context) (stream.RunRecord, error) {
	return stream.ReadRun(ctx, d.js, RunName)
}

func (d *drill) shard(ctx context.Context, id string) (stream.ShardRecord, error) {
	kv, err := d.js.KeyValue(ctx, stream.BucketShards)
	if err != nil {
		return stream.ShardRecord{}, err
	}
	e, err := kv.Get(ctx, stream.ShardKey(RunName, id))
	if err != nil {
		return stream.ShardRecord{}, err
	}
	var r stream.ShardRecord
	return r, stream.Decode(e.Value(), &r)
}

// attemptsSaid is what the fixture's failed attempts said, for a drill
// that stopped: a job that cannot run (a missing tool, no permission)
// otherwise shows only as a step that timed out.
func (d *drill) attemptsSaid() string {
	if d.js == nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var said []string
	seen := map[string]bool{}
	for _, id := range append(d.cpuIDs(), "big") {
		r, err := d.shard(ctx, id)
		if err != nil {
			continue
		}
		for _, at := range r.Attempts {
			if at.Outcome == stream.OutcomeOK || at.Reason == "" || seen[at.Reason] {
				continue
			}
			seen[at.Reason] = true
			said = append(said, fmt.Sprintf("%s attempt %d: %s", id, at.N, at.Reason))
		}
	}
	if len(said) == 0 {
		return ""
	}
	if len(said) > 3 {
		said = append(said[:3], fmt.Sprintf("%d more", len(said)-3))
	}
	return "; failed attempts: " + strings.Join(said, "; ")
}

func (d *drill) cpuIDs() []string {
	var ids []string
	for i := range cpuN {
		ids = append(ids, fmt.Sprintf("s%d", i))
	}
	return ids
}

func (d *drill) runningIDs(ctx context.Context) []string {
	var ids []string
	for _, id := range d.cpuIDs() {
		if r, err := d.shard(ctx, id); err == nil && r.State == stream.ShardRunning {
			ids = append(ids, id)
		}
	}
	return ids
}

// gens lists the generation numbers in a shard's checkpoint dir, newest first.
func (d *drill) gens(id string) []int64 {
	reports, _ := checkpoint.VerifyAll(checkpointDir(d.out, id))
	var out []int64
	for _, r := range reports {
		out = append(out, r.N)
	}
	return out
}

// snapshot maps each committed, verifying output to its file list checksum.
func (d *drill) snapshot() map[string]string {
	out := map[string]string{}
	for _, id := range d.cpuIDs() {
		if mk, err := checkpoint.Verify(filepath.Join(d.out, id)); err == nil {
			out[id] = mk.Manifest
		}
	}
	return out
}

func (d *drill) verify(ctx context.Context, before map[string]string, killed []string, victim string, corruptGen int64,
	truncated string, detected bool, blockedReason string, pendingOK bool, waitReason string, final stream.RunRecord, through []ranAt) {
	// Worker SIGKILL: the shards it was running were redelivered, the lost
	// attempt recorded, and they completed.
	var bad []string
	for _, id := range killed {
		r, err := d.shard(ctx, id)
		lost := false
		for _, a := range r.Attempts {
			lost = lost || a.Outcome == stream.OutcomeLost
		}
		if err != nil || r.State != stream.ShardValidated || !lost {
			bad = append(bad, fmt.Sprintf("%s: %s, lost attempt recorded %v", id, r.State, lost))
		}
	}
	d.checkIf("worker SIGKILL mid-shard: its shards were redelivered and completed", len(killed) > 0 && len(bad) == 0,
		fmt.Sprintf("interrupted %v; %s", killed, strings.Join(bad, "; ")))

	// Corrupt generation: rejected, and the next attempt resumed from the previous one.
	logs := d.attemptLogs(victim)
	want := fmt.Sprintf("resumed from gen-%d", corruptGen-1)
	skipped := fmt.Sprintf("skipped generation %d", corruptGen)
	d.checkIf("corrupt checkpoint generation rejected, previous one used", strings.Contains(logs, want) && strings.Contains(logs, skipped),
		fmt.Sprintf("%s gen-%d truncated; attempt logs contain %q: %v, %q: %v", victim, corruptGen, skipped, strings.Contains(logs, skipped), want, strings.Contains(logs, want)))

	// Incomplete shards resumed rather than restarted.
	resumed := strings.Contains(logs, "resumed from gen-")
	d.checkIf("incomplete shard resumed from its checkpoint", resumed, victim+": "+firstLine(logs, "resumed from"))

	// Coordinator SIGKILL: nothing lost.
	d.checkIf("coordinator SIGKILL and restart: run completed, nothing lost", final.State == stream.RunComplete && final.Counts.Validated == len(d.man.Shards),
		fmt.Sprintf("%s with %d of %d validated", final.State, final.Counts.Validated, len(d.man.Shards)))
	d.verifyOutage(ctx, through)

	// Truncated output detected and redone.
	_, err := checkpoint.Verify(filepath.Join(d.out, truncated))
	d.checkIf("truncated output detected at verification and redone", detected && err == nil,
		fmt.Sprintf("%s; blocked with: %q; now verifies: %v", truncated, blockedReason, err == nil))

	// Completed outputs unchanged.
	var changed []string
	for id, sum := range before {
		if mk, err := checkpoint.Verify(filepath.Join(d.out, id)); err != nil || mk.Manifest != sum {
			changed = append(changed, id)
		}
	}
	sort.Strings(changed)
	d.checkIf("completed outputs unchanged (checksums before and after)", len(changed) == 0,
		fmt.Sprintf("%d outputs compared; changed: %v", len(before), changed))

	// Counts and checksums match the manifest and final.json.
	var f coordinator.Final
	mismatch := []string{}
	b, ferr := os.ReadFile(filepath.Join(d.dir, "coord", "runs", RunName, "final.json"))
	if ferr == nil {
		ferr = json.Unmarshal(b, &f)
	}
	for _, s := range f.Shards {
		mk, err := checkpoint.Verify(filepath.Join(d.out, s.ID))
		if err != nil || mk.Manifest != s.Checksum {
			mismatch = append(mismatch, s.ID)
		}
	}
	d.checkIf("counts and checksums match the manifest", ferr == nil && len(f.Shards) == len(d.man.Shards) && len(mismatch) == 0 && f.Counts.Validated == len(d.man.Shards),
		fmt.Sprintf("manifest %d shards, final.json %d (%v), checksum mismatches %v", len(d.man.Shards), len(f.Shards), ferr, mismatch))

	// Exactly one live commit per shard in the KV history.
	kv, err := d.js.KeyValue(ctx, stream.BucketCheckpoint)
	var dup []string
	if err == nil {
		for _, sh := range d.man.Shards {
			hist, herr := kv.History(ctx, stream.ShardKey(RunName, sh.ID))
			commits, revoked := 0, 0
			for _, e := range hist {
				var c stream.CommitRecord
				if herr == nil && stream.Decode(e.Value(), &c) == nil && c.Fingerprint == final.Fingerprint {
					if c.State == stream.CommitRevoked {
						revoked++
					} else {
						commits++
					}
				}
			}
			if commits-revoked != 1 {
				dup = append(dup, fmt.Sprintf("%s: %d commits, %d revoked", sh.ID, commits, revoked))
			}
		}
	}
	d.checkIf("KV history holds exactly one live commit per shard", err == nil && len(dup) == 0, strings.Join(dup, "; "))

	// Every attempt closed: a record that ended with an attempt left
	// open no longer says which attempt made its output, or charges one
	// that was not its failure.
	var open []string
	attempts := 0
	for _, sh := range d.man.Shards {
		r, err := d.shard(ctx, sh.ID)
		if err != nil {
			open = append(open, fmt.Sprintf("%s: %v", sh.ID, err))
			continue
		}
		attempts += len(r.Attempts)
		for _, o := range r.OpenAttempts() {
			open = append(open, fmt.Sprintf("%s: %s, under %s", sh.ID, o, r.State))
		}
	}
	d.checkIf("every attempt in the shard records has its outcome", attempts >= len(d.man.Shards) && len(open) == 0,
		fmt.Sprintf("%d attempts in %d records; open: %s", attempts, len(d.man.Shards), strings.Join(open, "; ")))

	// Resource-full pending state.
	big, _ := d.shard(ctx, "big")
	d.checkIf("a shard no worker can take waits with its reason, then runs when one joins", pendingOK && big.State == stream.ShardValidated,
		fmt.Sprintf("waiting reason %q; after w3 joined: %s", waitReason, big.State))

	cluster := make(chan Check, 1)
	go func() { cluster <- d.cluster(ctx) }()
	d.powerCut(ctx)
	c := <-cluster
	d.check(c.Name, c.Status, c.Detail)
}

// admissionSaid reports whether the drill workers' admission log has a
// line for shard id that contains what.
func (d *drill) admissionSaid(id, what string) bool {
	b, _ := os.ReadFile(filepath.Join(d.dir, "workers", "runs", RunName, "admission.log"))
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, " shard="+id+" ") && strings.Contains(l, what) {
			return true
		}
	}
	return false
}

func (d *drill) attemptLogs(id string) string {
	var b strings.Builder
	matches, _ := filepath.Glob(filepath.Join(d.dir, "workers", "runs", RunName, "attempts", id+".*.log"))
	sort.Strings(matches)
	for _, m := range matches {
		data, _ := os.ReadFile(m)
		b.Write(data)
	}
	return b.String()
}

func firstLine(s, substr string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			return l
		}
	}
	return "(none)"
}

func (d *drill) writeReport() {
	dir := filepath.Join(d.dir, "coord", "runs", RunName)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return
	}
	d.report.Evidence = filepath.Join(dir, ReportName)
	b, _ := json.MarshalIndent(d.report, "", "  ")
	if err := checkpoint.WriteFile(d.report.Evidence, append(b, '\n')); err != nil {
		d.say("write drill.json: %v", err)
	}
	// A copy where a person looks first.
	top := ReportPath(d.cfg.DataDir)
	if err := os.MkdirAll(filepath.Dir(top), 0o755); err == nil {
		_ = checkpoint.WriteFile(top, append(b, '\n'))
	}
}

// ReportPath is where a drill run with state directory dataDir leaves a
// copy of its report: DATA/runs/drill/drill.json.
func ReportPath(dataDir string) string {
	return filepath.Join(dataDir, "runs", RunName, ReportName)
}
