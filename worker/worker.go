package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/shardpool/shardpool/coordinator/plan"
	"github.com/shardpool/shardpool/staging"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker/probe"
)

// SlotsOf is class's count in slots (a worker's --slots CLASS=N,...),
// or, for an outlier class slots does not name (`c-outlier`, which run
// and submit make of the shards far costlier than their class's median:
// plan.SplitOutliers), its class's: a user who gave `--slots cpu=2`
// knows nothing of the outlier class, and before, those shards waited
// for good ("no live worker serves class cpu-outlier"). It gets c's count
// as `--slots N` gives N to every class, outliers included; as a cap
// (Auto) it caps both. ok is false for a class slots does not give.
func SlotsOf(slots map[string]int, class string) (n int, ok bool) {
	if n, ok := slots[class]; ok {
		return n, true
	}
	if base, ok := strings.CutSuffix(class, plan.OutlierSuffix); ok {
		n, ok := slots[base]
		return n, ok
	}
	return 0, false
}

// Config configures a Worker. Zero values mean the documented default.
type Config struct {
	// JetStream is the client connected to the coordinator. Required.
	JetStream jetstream.JetStream
	// Name identifies the worker in leases and reports. Default: host name.
	Name string
	// Slots is the number of concurrent shards per class: alone, the worker
	// serves exactly the classes listed with a positive count, and their
	// outlier classes as runs with them appear (SlotsOf). With Auto
	// it is an optional cap per class (0: none).
	Slots map[string]int
	// SlotsEach, without Auto, is the fixed number of slots of every class
	// of the active runs, served as they appear (`shardpool worker --slots
	// N`); a class in Slots keeps its own count.
	SlotsEach int
	// Auto computes each class's slots from the host's budget and the
	// class's peak (plan.Compute), serves every class of the active runs,
	// and checks live headroom before each fetch.
	Auto bool
	// Scratch is local scratch space for {out} and {scratch}. Default:
	// shardpool-<name>-<uid> in the first directory of the policy's
	// scratch list that this host has, or in $TMPDIR where it lists none
	// (DefaultScratchFor, with the Probe's policy file).
	Scratch string
	// StateDir is where the worker writes evidence (attempt logs,
	// admission.log) under runs/<run>/. Default: $XDG_STATE_HOME/shardpool.
	StateDir string
	// Grace is how long a child has after SIGTERM before SIGKILL. Default 10s.
	Grace time.Duration
	// BackoffMin and BackoffMax bound the delay before a failed shard is
	// redelivered: min·2^(attempt-1), capped. Defaults 1s and 60s.
	BackoffMin, BackoffMax time.Duration
	// FetchWait bounds one Fetch when the queue is empty. Default 500ms.
	FetchWait time.Duration
	// IdleExit, when set, drains the worker (Drain) once it has had no
	// shard running, none delivered and none it handed back waiting in a
	// delay for that long: a worker in a batch allocation then releases it
	// when the queue has run dry, rather than holding it to the time
	// limit. Zero serves until stopped.
	IdleExit time.Duration
	// StopAfterStartFailures, when set, drains the worker once that many
	// attempts in a row (of any run) could not start their command on
	// this host (outcome start-error: the run's directory or an input
	// missing here, an output directory it cannot write, a program it
	// lacks, GPUs it cannot assign; or stage-error: inputs it could not
	// stage) while another worker starts commands. Such a host would
	// otherwise fail shard after shard of the queue while healthy
	// workers could run them; each failure is charged, and a run's
	// retries run out fast. Where no other worker starts commands either,
	// it holds and tries again instead (outage.go). Failed reports why
	// once it has. Zero never stops.
	StopAfterStartFailures int
	// StopWhenFailingAlone drains the worker once its charged attempts
	// have failed in a row while other workers validated those very
	// shards, more often than chance allows were the fault the job's
	// (lone.go): the host lacks what the command needs, and would
	// otherwise spend the retries of shard after shard. Failed reports
	// why once it has.
	StopWhenFailingAlone bool
	// OnServing, when set, is called once the worker has taken its name
	// and set up, just before it starts reporting and fetching.
	OnServing func()
	// ReportEvery is the period of the worker report. Default 5s.
	ReportEvery time.Duration
	// SlowFS is how long an attempt may wait on a file system (its commit,
	// or the looks at its destination and output directory before its
	// command) before the worker's report lists it (slowfs.go). Default
	// 2m.
	SlowFS time.Duration
	// Recheck is how often a class held back by admission looks again
	// when nothing wakes it (a shard of its own ending, or another
	// worker's write to the host ledger, do). Default 1s; while the
	// budget is shared and the ledger cannot be watched, at most 100ms.
	Recheck time.Duration
	// HostLedger is the directory of the host ledger through which the
	// workers of this user on this host share its budget
	// (ledger.go). Default DefaultLedgerDir().
	HostLedger string
	// ProcRoot is where /proc is read from (boot id, vmstat). Default "/proc".
	ProcRoot string
	// Staging bounds input staging on this host (used by classes with
	// stage = true): concurrent copies, bytes per second, bytes of staged
	// files kept for later shards. Its Dir defaults to Scratch/stage.
	Staging staging.Config
	// PressureEvery is the period of the memory pressure check. Default 1s.
	PressureEvery time.Duration
	// CriticalHeadroom: below this much free memory (host or cgroup) the
	// host is critical. Default 256 MiB.
	CriticalHeadroom int64
	// PressureFull: memory PSI "full" avg10 (percent) above which the host
	// is critical. Default 10.
	PressureFull float64
	// CriticalFor is how many consecutive critical checks preempt the
	// youngest shard. Default 3.
	CriticalFor int
	// CgroupRoot is where /proc/self/cgroup and /sys/fs/cgroup are read and
	// per-shard cgroups made (tests use a fixture tree). Default "/".
	CgroupRoot string
	// StageFleet bounds input copies across every worker (a KV semaphore);
	// 0 means no fleet-wide bound. Set the same on every worker.
	StageFleet int
	// Probe measures the host for the worker's reports. Default: the real
	// host (probe.New with zero Config), and in Auto mode with a
	// probe.CPUMeter over OthersWindow, so that the CPUs other users'
	// processes keep busy are not admitted into.
	Probe *probe.Prober
	// OthersWindow is what the CPU use of others is averaged over for the
	// default Probe in Auto mode. Default 10s.
	OthersWindow time.Duration
	// AdoptOrphans makes the process its commands' subreaper, so that
	// what a command leaves running outside its process group is killed
	// when it ends even where the shard has no cgroup of its own
	// (adopt.go). Process-wide: only for a process whose other children
	// run in its own process group (the shardpool binary's run and
	// worker), not a test binary's.
	AdoptOrphans bool
	// Binary is the shardpool binary exported to jobs as SHARDPOOL_BIN.
	// Default: this executable when it is shardpool.
	Binary string
	// Logger receives structured logs; default discards.
	Logger *slog.Logger
	// OnEvent, when set, is called for every admission decision (tests and
	// progress displays); it must not block.
	OnEvent func(Event)
}

// Event is one admission decision or shard outcome.
type Event struct {
	Time     time.Time
	Run      string
	Shard    string
	Class    string
	Decision string
	Detail   string
}

// Worker pulls and runs shards. Create with New, then Run.
type Worker struct {
	cfg      Config
	log      *slog.Logger
	host     string
	boot     string
	pidns    string // stream.PIDNamespace: pids are compared only within it
	conn     string // the name of its connection to the coordinator, for reports
	slurmJob string // SLURM_JOB_ID of the job it runs in, for reports
	pid      int
	b        *stream.Buckets
	ttl      time.Duration
	env      map[string]string

	// meter is the default Probe's measure of others' CPU use (Auto
	// mode), started with Run; nil otherwise.
	meter *probe.CPUMeter

	// viewMu guards admitView, the look at the host that admission decisions
	// share for a moment (admit.go); it is taken before mu, never inside.
	viewMu    sync.Mutex
	admitView *admitView
	// viewFor is how long a look is shared (admitViewFor; tests on a slow
	// machine widen it, a look under the race detector can take longer).
	viewFor time.Duration

	mu      sync.Mutex
	running map[string]int
	done    int
	failed  int
	logs    map[string]*openLog // admission.log per run, the most recently used kept open (maxOpenLogs)
	logUses uint64
	runs    map[string]cachedRun
	dirs    map[string]bool
	envs    map[string][]string // class environments by fingerprint and class (classEnv)
	journal *childJournal       // this worker's running process groups (orphans.go)

	// failedInARow counts this worker's charged attempts that failed
	// since its last validated shard, lastFailure says the last one's
	// reason (reports: a host that fails what others run). Under mu.
	failedInARow int
	lastFailure  string
	// streakKeys are the shards of the failures in a row (the most
	// recent loneKeys), streakGen counts the validations that ended a
	// streak, chargedHere the charged attempts that ended here: the
	// judgement of StopWhenFailingAlone (lone.go). Under mu.
	streakKeys  []string
	streakClass string // the class of the streak's last failure
	streakGen   uint64
	chargedHere int
	// loneSince is when the worker began to hold its fetches while its
	// streak's shards run elsewhere, loneWhy says why ("" when not held);
	// loneNext is the streak at which the next hold may begin (lone.go).
	// Under mu.
	loneSince time.Time
	loneWhy   string
	loneNext  int
	// leftRunning counts the attempts whose command left processes
	// running, lastLeft the last one (the report's LeftRunning, LastLeft).
	leftRunning int
	lastLeft    string
	// fsWaits holds the attempts waiting on a file system, by note
	// (fsSeq numbers them; slowfs.go). Under mu.
	fsWaits map[uint64]fsWait
	fsSeq   uint64

	peaks    map[string]plan.Peak
	gpuClass map[string]bool
	live     map[int]liveShard
	// peakWarned holds, per run and class warnPeakAbove has warned of,
	// what it said.
	peakWarned map[runClass]string
	// learned is, per run and class, the peak learned of its shards
	// where that went well above the run's own figure; classRuns the
	// active runs of each class with that figure (learn.go). Under mu.
	learned   map[runClass]learnedPeak
	classRuns map[string][]runBase
	liveSeq   uint64
	gates     map[string]*gate  // per class served: its shards in flight
	gpuRes    map[string]string // GPU UUID -> shard key holding it
	ledger    *hostLedger       // what this host's workers hold (all write; auto ones read); nil without
	sharing   atomic.Bool       // the last admission decision saw other active workers in the ledger

	// scratchNeed is, per class, what the active runs that declare
	// scratch or stage their inputs need of it; scratchHeld counts its
	// shards in flight holding their reservation in the scratch ledger;
	// stagedSeen is the inputs the latest staged shards of each run and
	// class needed (scratchadmit.go).
	scratchNeed map[string][]scratchDecl
	scratchHeld map[string]int
	stagedSeen  map[string][]int64
	// runsWatched: refreshPeaks keeps peaks and scratchNeed up to date.
	runsWatched atomic.Bool

	// othersLimit is what others' use of the host's CPUs limited the last
	// admission decision to; nil when another limit bound it (OthersLimit).
	othersLimit atomic.Pointer[othersLimit]
	// ledgerWatched: writes to the host ledger wake waiting fetch loops (watchLedger)
	ledgerWatched atomic.Bool
	// fixedShare is the budget a worker with fixed slots writes its holds
	// under (auto workers take theirs from each decision's look).
	fixedShare string
	// afterGPULook, set only by tests, runs while fixedGPUs holds the
	// host ledger between its look and the hold it leads to.
	afterGPULook func()
	// ledgerErr is why a profile has no ledger record (openProfileLedger).
	ledgerErr  error
	active     map[string]*running // shards whose command runs, by key
	haltedNow  map[string]string   // by run: why a run halted --now stops its commands (halts.go)
	preparing  map[string]*running // shards staging their inputs or waiting for scratch, by key (halts.go)
	waits      map[string]string   // per class: why the worker is not fetching
	poke       chan struct{}       // reportSoon: a report ahead of the period
	runsNews   chan struct{}       // watchRuns: a run record changed as refreshPeaks cares (runChanged)
	hurry      chan struct{}       // closed by Hurry: no grace left for children
	hurryOnce  sync.Once
	drain      chan struct{}   // closed by Drain: fetch no more, let the running shards end
	fixed      map[string]int  // under mu, without Auto, for reports: the slots of each class served (Slots, and SlotsEach as classes appear)
	ended      sync.Map        // run name -> *endedCount: shards this worker concluded (Ended)
	announced  map[string]bool // runs whose evidence directory was logged (admission; under mu)
	drainOnce  sync.Once
	drainWhy   string    // why Drain was called, for reports and the admission log
	stopWhy    string    // under mu: why Run's context ended, for reports (Stopping); "" while it serves
	stopAt     time.Time // under mu: when stopWhy was set
	hurried    bool      // under mu: Hurry was called
	draining   bool      // under mu: Drain was called; no fetch loop starts after it
	serving    sync.WaitGroup
	busyAt     atomic.Int64    // unix nanoseconds of the last delivery, of the last look that found a shard running, or of the end of the latest delay a shard was handed back for (IdleExit)
	startFails atomic.Int64    // attempts in a row whose command could not start (StopAfterStartFailures)
	stopped    string          // under mu: why the worker drained itself (Failed)
	owning     map[string]bool // shard keys with an attempt in flight here, from lease to settle (takeLease)
	held       map[string]int  // per class: deliveries held for a store that takes no lease write
	heldWhy    string          // the store's last refusal, while any is held
	awaiting   map[string]int  // shard keys whose delivery waits here for another owner's lease (awaitLease)
	keepFor    []string        // under mu: the classes this idle worker stays for (keeping)

	// lastStarted is when a command last started here (unix nanoseconds;
	// reports' LastStarted).
	lastStarted atomic.Int64
	// storeAhead is how far the coordinator's store's clock is ahead of
	// this worker's (nanoseconds; onOwnTime), from this worker's last
	// report as the store stamped it; 0 until one is read back.
	storeAhead atomic.Int64
	// Under mu (outage.go): when the current start failures in a row
	// began; since when the worker has held for start failures no other
	// worker is spared, until when, the last wait and why ("" when not).
	startStreakAt, outageSince, outageUntil time.Time
	outageWait                              time.Duration
	outageWhy                               string

	defaultScratch bool // cfg.Scratch was not given: it must be this user's own
	scratchMu      sync.Mutex
	scratchErr     error     // why the scratch directory failed an attempt; nil while it works
	scratchAt      time.Time // when scratchErr was last confirmed
	scratchDir     string    // the directory that failed

	peers    []stream.WorkerReport // other live workers, for locality and holdLone
	peersAt  time.Time             // when peers was read; under mu
	critical string                // why memory is critical now, or ""
	enforce  bool                  // per-shard cgroups can be made here
	adopter  *adopter              // nil unless AdoptOrphans took
	cgroups  *cgroups
	limits   string
	hostLogF *os.File
	// perHost is ".<host>" where the state directory may be shared with
	// other hosts (sharedStateDir), else "": see evidenceFile.
	perHost string

	scratch *scratchPool // {out} and {scratch} directories of attempts
	// storeGone is done once the coordinator's store takes no more
	// writes (StoreRefusesWrites): the worker's store writes then give
	// up at once (storeCtx).
	storeGone     context.Context
	markStoreGone context.CancelFunc
	coord         atomic.Pointer[coordView] // see learnCoordinator
	// durable and durableNow share sync barriers at the coordinator: those
	// before a message is settled, which may wait there for others
	// (stream.SettleBarrier), and those before a command starts or an
	// output is published.
	durable, durableNow *stream.Group
	// infoMissedAt is when the asks for the coordinator's info began to
	// find no responder, in Unix nanoseconds; 0 while one answers
	// (learnCoordinator).
	infoMissedAt atomic.Int64

	oomMu     sync.Mutex // guards the shared OOM-kill baseline (oomBaseline)
	oomN      int64
	oomAt     time.Time
	outSyncs  map[string]*stream.FSSync  // per output directory; nil: fsync per file
	outRoots  map[string]*outputRoot     // per output directory: where it was at the first commit (outroot.go)
	roOutputs map[string]*readOnlyOutput // per output directory where a commit failed with EROFS (readonly.go)
	// fullOutputs: per output directory where a commit failed for want
	// of room (outputfull.go); under mu.
	fullOutputs map[string]*fullOutput
	// logsLost counts attempts whose output no log could keep, and
	// logLostSaid is when the worker last said so (readonly.go); under mu.
	logsLost    int64
	logLostSaid time.Time
	// concluding bounds the attempts whose command has exited and whose
	// commit, records and ack are still in progress without their slot.
	concluding chan struct{}
	// handling counts the deliveries in handle, from decode to settling;
	// flushing those of them waiting for a flush (an output's syncfs, a
	// barrier before settling). A flush waits for others only while
	// someone could still join it (nobodyElse).
	handling  atomic.Int64
	flushing  atomic.Int64
	stageOnce sync.Once
	// preflighted holds the runs whose preflight snapshot this worker
	// wrote (or is writing) to their evidence; bg waits for the writes.
	preflighted map[string]bool
	bg          sync.WaitGroup
	stager      *staging.Stager
	stageErr    error
	started     time.Time
}

// New validates cfg; it does no I/O.
func New(cfg Config) (*Worker, error) {
	if cfg.JetStream == nil {
		return nil, fmt.Errorf("%w: JetStream is required", ErrConfig)
	}
	if cfg.Name == "" {
		cfg.Name = DefaultName()
	}
	if !stream.ValidWorkerName(cfg.Name) {
		return nil, fmt.Errorf("%w: Name %q must match [A-Za-z0-9_-]{1,64}", ErrConfig, cfg.Name)
	}
	if cfg.SlotsEach < 0 {
		return nil, fmt.Errorf("%w: SlotsEach: %d slots", ErrConfig, cfg.SlotsEach)
	}
	if len(cfg.Slots) == 0 && !cfg.Auto && cfg.SlotsEach == 0 {
		return nil, fmt.Errorf("%w: Slots: no class to serve (set Slots, SlotsEach or Auto)", ErrConfig)
	}
	for c, n := range cfg.Slots {
		if !stream.ValidClass(c) {
			return nil, fmt.Errorf("%w: Slots: %q is not a valid class name", ErrConfig, c)
		}
		if n < 0 {
			return nil, fmt.Errorf("%w: Slots: class %s has %d slots", ErrConfig, c, n)
		}
	}
	if cfg.StateDir == "" {
		cfg.StateDir = DefaultStateDir()
	}
	// The records name attempt logs and evidence by it, which status
	// prints wherever it runs: `--data wdata` named none a reader found.
	if abs, err := filepath.Abs(cfg.StateDir); err == nil {
		cfg.StateDir = abs
	}
	if cfg.Grace <= 0 {
		cfg.Grace = 10 * time.Second
	}
	if cfg.BackoffMin <= 0 {
		cfg.BackoffMin = time.Second
	}
	if cfg.BackoffMax <= 0 {
		cfg.BackoffMax = time.Minute
	}
	if cfg.BackoffMax < cfg.BackoffMin {
		return nil, fmt.Errorf("%w: BackoffMax %s is below BackoffMin %s", ErrConfig, cfg.BackoffMax, cfg.BackoffMin)
	}
	if cfg.FetchWait <= 0 {
		// Short: a draining worker waits for its open pull requests to end
		// (a message that arrives after the stop is handed back at once).
		cfg.FetchWait = 500 * time.Millisecond
	}
	if cfg.ReportEvery <= 0 {
		cfg.ReportEvery = 5 * time.Second
	}
	if cfg.SlowFS <= 0 {
		cfg.SlowFS = defaultSlowFS
	}
	if cfg.Recheck <= 0 {
		cfg.Recheck = time.Second
	}
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Binary == "" {
		cfg.Binary = selfPath()
	}
	if cfg.CgroupRoot == "" {
		cfg.CgroupRoot = "/"
	}
	if cfg.PressureEvery <= 0 {
		cfg.PressureEvery = time.Second
	}
	if cfg.CriticalHeadroom <= 0 {
		cfg.CriticalHeadroom = 256 << 20
	}
	if cfg.PressureFull <= 0 {
		cfg.PressureFull = 10
	}
	if cfg.CriticalFor <= 0 {
		cfg.CriticalFor = 3
	}
	if cfg.OthersWindow <= 0 {
		cfg.OthersWindow = 10 * time.Second
	}
	var meter *probe.CPUMeter
	if cfg.Probe == nil {
		var pc probe.Config
		if cfg.Auto {
			m, err := probe.NewCPUMeter(probe.CPUMeterConfig{Every: cfg.OthersWindow / 5, Window: cfg.OthersWindow})
			if err != nil {
				return nil, fmt.Errorf("%w: OthersWindow: %v", ErrConfig, err)
			}
			pc.CPUUse, meter = m, m
		}
		p, err := probe.New(pc)
		if err != nil {
			return nil, fmt.Errorf("%w: Probe: %v", ErrConfig, err)
		}
		cfg.Probe = p
	}
	defaultScratch := cfg.Scratch == ""
	if defaultScratch {
		dir, err := PolicyScratch(cfg.Probe.PolicyPath(), cfg.Name)
		if err != nil {
			return nil, fmt.Errorf("%w: Scratch: %v", ErrConfig, err)
		}
		cfg.Scratch = dir
	}
	gone, markGone := context.WithCancel(context.Background())
	return &Worker{cfg: cfg, meter: meter, defaultScratch: defaultScratch, viewFor: admitViewFor, log: cfg.Logger.With("component", "worker", "worker", cfg.Name),
		storeGone: gone, markStoreGone: markGone,
		running: map[string]int{}, logs: map[string]*openLog{}, announced: map[string]bool{}, runs: map[string]cachedRun{}, dirs: map[string]bool{}, envs: map[string][]string{}, live: map[int]liveShard{}, peakWarned: map[runClass]string{}, learned: map[runClass]learnedPeak{}, gates: map[string]*gate{}, gpuRes: map[string]string{}, active: map[string]*running{}, preparing: map[string]*running{}, haltedNow: map[string]string{}, fixed: maps.Collect(maps.All(cfg.Slots)), waits: map[string]string{}, poke: make(chan struct{}, 1), runsNews: make(chan struct{}, 1), hurry: make(chan struct{}), drain: make(chan struct{}), held: map[string]int{}, awaiting: map[string]int{}, owning: map[string]bool{}, preflighted: map[string]bool{}}, nil
}

// bucketWait bounds the wait for the coordinator's buckets at start.
const bucketWait = 2 * time.Minute

// barrierTimeout bounds one sync barrier request.
const barrierTimeout = 10 * time.Second

// Hurry cuts a drain short (a second Ctrl-C): children still running get
// SIGKILL now instead of at the end of their grace period. Their attempts
// are recorded interrupted, as in any drain, and the messages handed
// back.
func (w *Worker) Hurry() {
	w.hurryOnce.Do(func() {
		w.mu.Lock()
		w.hurried = true
		w.mu.Unlock()
		close(w.hurry)
		w.reportSoon()
	})
}

// Drain stops fetching and lets the running shards end as they would:
// nothing is signalled, every command runs to its end, and its output is
// committed. Run returns once they have all settled. A shutdown (Run's
// context ending) still stops a drain at any time. why says who asked
// ("SIGUSR1": Slurm's --signal before a job's end), for the worker's
// report and the admission log.
func (w *Worker) Drain(why string) {
	w.drainOnce.Do(func() {
		w.mu.Lock()
		w.drainWhy = why
		w.mu.Unlock()
		close(w.drain)
	})
}

// endedCount is what a worker concluded for one run; left counts its
// attempts whose command left processes running (the first one's shard
// and report in firstLeft).
type endedCount struct {
	validated, failed, left atomic.Int64
	firstLeft               atomic.Pointer[string]
}

// counted is run's endedCount, made on first use.
func (w *Worker) counted(run string) *endedCount {
	c, ok := w.ended.Load(run)
	if !ok {
		c, _ = w.ended.LoadOrStore(run, &endedCount{})
	}
	return c.(*endedCount)
}

// noteLeft counts an attempt of run whose command left processes
// running; the first of each run is also logged, since a job that does
// this does it on every shard.
func (w *Worker) noteLeft(run, shard, left string) {
	c := w.counted(run)
	c.left.Add(1)
	w.mu.Lock()
	w.leftRunning++
	w.lastLeft = reportCut(run + " " + shard + ": " + left)
	w.mu.Unlock()
	first := shard + ": " + left
	if c.firstLeft.CompareAndSwap(nil, &first) {
		w.log.Warn("a command left processes running outside its process group when it ended; they were killed (a job that starts a daemon or server must stop it before it exits)",
			"run", run, "shard", shard, "killed", left)
	}
}

// LeftRunning is how many attempts of run on this worker left processes
// running when their command ended (they were killed), and the first:
// "shard: what was killed".
func (w *Worker) LeftRunning(run string) (int64, string) {
	c, ok := w.ended.Load(run)
	if !ok {
		return 0, ""
	}
	n := c.(*endedCount)
	if f := n.firstLeft.Load(); f != nil {
		return n.left.Load(), *f
	}
	return n.left.Load(), ""
}

// PeaksAbove is what this worker warned of run's shards whose measured
// peak went well above what their class's admission reserves
// (warnPeakAbove), one line per class, by class.
func (w *Worker) PeaksAbove(run string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, k := range slices.SortedFunc(maps.Keys(w.peakWarned), func(x, y runClass) int { return strings.Compare(x.class, y.class) }) {
		if k.run == run {
			out = append(out, w.peakWarned[k])
		}
	}
	return out
}

// runClass is a class of a run's spec.
type runClass struct{ run, class string }

// countEnded notes a shard of run that this worker concluded in state.
func (w *Worker) countEnded(run, state string) {
	switch n := w.counted(run); state {
	case stream.ShardValidated:
		n.validated.Add(1)
	case stream.ShardFailed:
		n.failed.Add(1)
	}
}

// Ended is how many shards of run this worker has concluded since it
// started: validated (a skip of an output already committed included),
// and failed after their retries. Unlike the run's record, it counts
// nothing from before this process, so a run resumed after a fix is
// judged on its new attempts alone (shardpool run's --halt).
func (w *Worker) Ended(run string) (validated, failed int64) {
	c, ok := w.ended.Load(run)
	if !ok {
		return 0, 0
	}
	n := c.(*endedCount)
	return n.validated.Load(), n.failed.Load()
}

// EndedRuns names the runs of which this worker has concluded a shard
// since it started (Ended), in order of name.
func (w *Worker) EndedRuns() []string {
	var runs []string
	w.ended.Range(func(k, v any) bool {
		n := v.(*endedCount)
		if n.validated.Load()+n.failed.Load() > 0 {
			runs = append(runs, k.(string))
		}
		return true
	})
	slices.Sort(runs)
	return runs
}

// Failed is why the worker drained itself (StopAfterStartFailures,
// StopWhenFailingAlone), or "" when it did not.
func (w *Worker) Failed() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stopped
}

// drainReason is why Drain was called, or "" before.
func (w *Worker) drainReason() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.drainWhy
}

// nakWithDelay hands msg back for a delivery after d, and keeps the worker
// from counting as idle (IdleExit) until then: were every worker to end as
// idle while the shards they handed back waited in their delays, nothing
// would be left to run them.
func (w *Worker) nakWithDelay(msg jetstream.Msg, d time.Duration) {
	w.busyTill(time.Now().Add(d))
	_ = msg.NakWithDelay(d)
}

// busyTill moves busyAt (IdleExit) forward to t, never back.
func (w *Worker) busyTill(t time.Time) {
	n := t.UnixNano()
	for {
		old := w.busyAt.Load()
		if old >= n || w.busyAt.CompareAndSwap(old, n) {
			return
		}
	}
}

// ticks yields every period until ctx ends or the worker drains.
func (w *Worker) ticks(ctx context.Context, every time.Duration) iter.Seq[time.Time] {
	return func(yield func(time.Time) bool) {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-w.drain:
				return
			case now := <-t.C:
				if !yield(now) {
					return
				}
			}
		}
	}
}

// errDrained ends Run's goroutines once a drain has settled every shard.
var errDrained = errors.New("drained")

// Running is the number of shards holding a slot now: from their delivery
// to the end of their command.
func (w *Worker) Running() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, k := range w.running {
		n += k
	}
	return n
}

// Commands names the shards of run whose command runs now, the longest
// running first.
func (w *Worker) Commands(run string) []string {
	w.mu.Lock()
	var rs []*running
	for _, r := range w.active {
		if r.run == run {
			rs = append(rs, r)
		}
	}
	w.mu.Unlock()
	slices.SortFunc(rs, func(a, b *running) int { return cmp.Or(a.started.Compare(b.started), cmp.Compare(a.id, b.id)) })
	ids := make([]string, len(rs))
	for i, r := range rs {
		ids[i] = r.id
	}
	return ids
}

// Concluding is the number of shards whose command has exited and that
// conclude outside a slot now (commit, records, ack): their records still
// say running while the slot has another shard.
func (w *Worker) Concluding() int { return len(w.concluding) }

// DefaultStateDir is $XDG_STATE_HOME/shardpool, or ~/.local/state/shardpool.
func DefaultStateDir() string {
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "shardpool")
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".local", "state", "shardpool")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("shardpool-state-%d", os.Getuid()))
}

// Run serves until ctx ends, then drains: it stops fetching, gives running
// children SIGTERM and the grace period, records and Naks what did not
// finish, and returns nil once every goroutine it started has exited.
// After Drain it returns nil once the running shards have settled.
func (w *Worker) Run(ctx context.Context) error {
	w.started = time.Now().UTC()
	if w.meter != nil {
		w.meter.Start()
	}
	w.host, _ = os.Hostname()
	w.boot, w.pidns = stream.BootID(w.cfg.ProcRoot), stream.PIDNamespace()
	w.slurmJob = os.Getenv("SLURM_JOB_ID")
	if nc := w.cfg.JetStream.Conn(); nc != nil {
		w.conn = nc.Opts.Name
	}
	w.pid = os.Getpid()
	// This process's start time: with the pid, what its journal, the host
	// ledger and its commands' environment name it by.
	start := processStart(w.cfg.ProcRoot, w.pid)
	w.env = environ()
	// Every command's environment names the worker process that started
	// it, so that a worker that reaps this one, should it die, ends what
	// its commands left running and nothing else (killStrays, which
	// matches it against the journal's).
	w.env[workerProcVar] = workerProc(w.pid, start)
	w.sharedStateDir(ctx)
	w.cgroups = detectCgroups(w.cfg.CgroupRoot)
	w.limits = w.cgroups.describe()
	w.enforce = w.cgroups.mode != ""
	if w.cfg.AdoptOrphans {
		var why string
		if w.adopter, why = adopt(); w.adopter == nil {
			w.log.Warn("what a command leaves running outside its process group is ended only where its shard has a cgroup of its own", "why", why)
		} else {
			w.adopter.reportLate(func(msg string) { w.hostLog("-", "left-running", msg) })
		}
	}
	defer w.cgroups.close()
	// Two minutes, as a worker waits for its coordinator to answer at all
	// (--connect-wait): a cluster restarting after a power cut takes
	// connections before it has elected the leaders that answer.
	b, err := stream.WaitBuckets(ctx, w.cfg.JetStream, bucketWait)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped before it served: nothing to drain
		}
		return fmt.Errorf("worker %s: %w", w.cfg.Name, err)
	}
	w.b = b
	st, err := b.Leases.Status(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("worker %s: lease bucket: %w", w.cfg.Name, err)
	}
	w.ttl = st.TTL()
	if err := CheckScratch(w.cfg.Scratch, w.defaultScratch); err != nil {
		return fmt.Errorf("worker %s: %w", w.cfg.Name, err)
	}
	if err := w.newStager(); err != nil {
		return fmt.Errorf("worker %s: %w", w.cfg.Name, err)
	}
	// Last out (deferred first): the shards' staged files are released
	// by then, and a worker started after this one may adopt them.
	defer w.hostStager().Close()
	// The last step that can fail: a worker that took its name and then
	// stopped would leave a report that looks alive until its pid is
	// judged gone.
	if err := w.claimName(ctx); err != nil {
		return err
	}
	defer w.closeLogs()
	nc := w.cfg.JetStream.Conn()
	w.learnCoordinator(ctx, nc)
	barriers := func(ask func(context.Context, *nats.Conn) error) *stream.Group {
		return &stream.Group{Fn: func() error {
			ctx, cancel := context.WithTimeout(context.Background(), barrierTimeout)
			defer cancel()
			return ask(ctx, nc)
		}, Gather: syncGather}
	}
	// A settling barrier lets the coordinator wait for others only while
	// someone in this worker's hands could still join; asked when all of
	// them wait already, it runs at once.
	w.durable, w.durableNow = barriers(func(ctx context.Context, nc *nats.Conn) error {
		if w.nobodyElse(w.flushing.Load()) {
			return stream.Barrier(ctx, nc)
		}
		return stream.SettleBarrier(ctx, nc)
	}), barriers(stream.Barrier)
	w.outSyncs = map[string]*stream.FSSync{}
	defer w.closeOutputSyncs()
	w.scratch = newScratchPool(w.cfg.Scratch, w.pid)
	// The journals first: they say which attempt each orphan ran for and
	// hand its shard back; what is left in dead workers' cgroups (those
	// of other state directories) goes next.
	w.reapOrphans()
	w.removeDeadCgroups()
	if j, err := openChildJournal(w.cfg.StateDir, w.host, w.cfg.Scratch, w.cfg.Name, w.boot, w.pidns, w.view().store, w.pid, start); err == nil {
		w.journal = j
		defer j.close()
	} else {
		w.log.Warn("child journal: a SIGKILL of this worker will leave its commands' descendants running", "err", err)
	}
	w.concluding = make(chan struct{}, maxConcluding)
	defer w.scratch.close()
	// Every worker writes what its shards hold to the host ledger; only
	// auto-mode workers also admit by what the others hold (fixed slots are
	// the user's to choose, but the auto workers beside them must see them).
	dir := w.cfg.HostLedger
	if dir == "" {
		dir = DefaultLedgerDir()
	}
	if l, err := openLedger(dir, w.cfg.ProcRoot, ledgerRec{Host: w.host, Boot: w.boot, PIDNS: w.pidns, PID: w.pid,
		Start: start, Name: w.cfg.Name}); err != nil {
		// Admission still sees what the probe measures, but not what
		// other workers on this host have admitted and not yet used.
		w.log.Warn("admitting as if this were the host's only worker", "err", err)
		w.hostLog("*", "ledger", fmt.Sprintf("%v: other workers' shards on this host are seen only as the probe measures them", err))
	} else {
		w.ledger = l
		defer l.close()
		if !w.cfg.Auto {
			// Which budget its shards count against, for the auto workers.
			snap, err := w.cfg.Probe.Snapshot(ctx, nil)
			if err != nil {
				snap = &probe.Snapshot{}
			}
			w.fixedShare = budgetShare(snap)
		}
	}

	if w.meter != nil {
		w.meter.SetRoots(w.shardpoolRoots)
	}

	// Shards run under their own context: ctx ending stops fetching at once,
	// while running shards get the grace period through drain.
	shardCtx, stopShards := context.WithCancel(context.WithoutCancel(ctx))
	defer stopShards()
	var shards sync.WaitGroup
	// Known before the first fetch, not a report period later: a host
	// that fails its first shards holds its fetches (holdLone) only
	// where it knows of a peer.
	w.refreshPeers(ctx)
	if w.cfg.OnServing != nil {
		w.cfg.OnServing()
	}
	g, gctx := errgroup.WithContext(ctx)
	// Reports go on while the worker stops, until its shards have
	// settled: a stop can last the grace period, or as long as a commit
	// waits on a hung mount. A silent worker looked dead (and another
	// could take its name, whose report this one's exit then removed).
	repCtx, endReports := context.WithCancel(context.WithoutCancel(ctx))
	defer endReports()
	// A report in flight when the store stops taking writes would wait
	// out its request's timeout before the worker could stop.
	defer context.AfterFunc(w.storeGone, endReports)()
	reported := make(chan struct{})
	go func() {
		defer close(reported)
		w.report(repCtx, gctx.Done(), ctx)
	}()
	// Peaks of the running shards without a cgroup, until the last of
	// them has ended (after a stop, their grace period).
	sampleCtx, stopSampling := context.WithCancel(context.WithoutCancel(ctx))
	defer stopSampling()
	sampling := make(chan struct{})
	go func() {
		defer close(sampling)
		_ = w.sampleLive(sampleCtx)
	}()
	g.Go(func() error { return w.watchPressure(gctx) })
	if w.ledger != nil && w.cfg.Auto {
		w.ledgerWatched.Store(true)
		g.Go(func() error {
			// Only while others share the budget: alone, the wake-ups
			// would be this worker's own writes, an admission decision
			// each for nothing (6-10% more CPU for short shards).
			if err := watchLedger(gctx, w.ledger.path, func() {
				if w.sharing.Load() {
					w.wakeAll()
				}
			}); err != nil {
				w.ledgerWatched.Store(false)
				w.log.Warn("other workers' shards ending are noticed by polling", "every", sharedRecheck, "err", err)
			}
			return nil
		})
	}
	g.Go(func() error {
		// Peers on this host that died: reap what their commands left and
		// hand their shards back, at a third of the TTL so that a dead
		// peer's leases are still young enough to hand back (handBack);
		// remove the shard cgroups they kept.
		t := time.NewTicker(max(w.ttl/3, time.Second))
		defer t.Stop()
		for {
			select {
			case <-gctx.Done():
				return nil
			case <-t.C:
				w.reapOrphans()
				w.removeDeadCgroups()
				w.refreshHold()
				w.scratch.dropIdle(scratchIdle)
			}
		}
	})
	classes := make([]string, 0, len(w.cfg.Slots))
	for c, n := range w.cfg.Slots {
		if n > 0 {
			classes = append(classes, c)
		}
	}
	sort.Strings(classes)
	// Every class of the active runs, as they appear: measured (Auto) or
	// SlotsEach apiece.
	discover := w.cfg.Auto || w.cfg.SlotsEach > 0
	// The fetch loops end on a drain as on a shutdown; the shards they
	// started end only on the shutdown (ctx).
	fetchCtx, stopFetch := context.WithCancel(gctx)
	defer stopFetch()
	startServe := func(class string) {
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.draining {
			return
		}
		if !w.cfg.Auto {
			w.fixed[class] = w.fixedSlots(class)
		}
		w.serving.Add(1)
		g.Go(func() error {
			defer w.serving.Done()
			return w.serve(fetchCtx, shardCtx, ctx.Done(), class, &shards)
		})
	}
	if discover || w.ledger != nil {
		// The runs already active decide the first fetches (with fixed
		// slots, a class no run has yet is fetched one at a time).
		w.runsWatched.Store(true)
		w.refreshPeaks(gctx)
	}
	for _, class := range classes {
		startServe(class)
	}
	if w.cfg.StopWhenFailingAlone {
		g.Go(func() error { return w.watchLone(gctx, min(w.cfg.ReportEvery, time.Second)) })
	}
	g.Go(func() error { return w.watchRuns(gctx) })
	g.Go(func() error { return w.watchFrozen(gctx) })
	if w.cfg.IdleExit > 0 {
		w.busyAt.Store(time.Now().UnixNano())
		g.Go(func() error { return w.exitWhenIdle(gctx) })
	}
	g.Go(func() error {
		select {
		case <-gctx.Done():
			return nil
		case <-w.drain:
		}
		w.mu.Lock()
		w.draining = true
		why := w.drainWhy
		fetching := slices.Collect(maps.Keys(w.gates))
		w.mu.Unlock()
		stopFetch()
		msg := fmt.Sprintf("draining (%s): fetching no more; %d running shard(s) end as they would", why, w.Running())
		w.log.Info(msg)
		w.hostLog("*", "drain", msg)
		w.serving.Wait()
		for _, class := range fetching {
			w.setWait(class, 0, "draining ("+why+"): fetching no more")
		}
		shards.Wait()
		return errDrained
	})
	// A class's outlier class (SlotsOf), served as a run with it
	// appears where Slots gives the class slots and does not name it.
	outliers := !w.cfg.Auto && len(w.cfg.Slots) > 0
	if discover || w.ledger != nil || outliers {
		// The classes' peaks of the active runs, for admission and for what
		// this worker's shards hold; in auto mode or with SlotsEach, serve
		// every class of those runs as they appear.
		served := map[string]bool{}
		for c, n := range w.cfg.Slots {
			// With fixed slots CLASS=0 keeps the class away; in auto mode
			// 0 is no cap, and the class is served as it appears.
			served[c] = n > 0 || !w.cfg.Auto
		}
		serves := func(c string) bool {
			if discover {
				return true
			}
			n, ok := w.slotsOf(c)
			return outliers && ok && n > 0
		}
		g.Go(func() error {
			t := time.NewTicker(w.cfg.ReportEvery)
			defer t.Stop()
			// A new run, generation or settings is seen as it is written
			// (watchRuns pokes runsNews): on the tick alone, a run
			// submitted to an idle worker waited up to ReportEvery (5 s)
			// before its first shard. The tick stays for a watch that
			// could not be set up or is being set up again.
			for {
				for _, c := range w.refreshPeaks(gctx) {
					if !served[c] && serves(c) {
						served[c] = true
						startServe(c)
					}
				}
				select {
				case <-gctx.Done():
					return nil
				case <-t.C:
				case <-w.runsNews:
				}
			}
		})
	}
	err = g.Wait()
	shards.Wait()
	stopSampling()
	<-sampling
	w.bg.Wait()
	endReports()
	<-reported
	w.finalReport()
	if errors.Is(err, context.Canceled) || errors.Is(err, errDrained) || ctx.Err() != nil {
		return nil
	}
	return err
}

// serve is the fetch loop of one class: it fetches exactly as many shards
// as admission allows right now (free slots, and in auto mode the live
// memory check), never more.
func (w *Worker) serve(ctx, shardCtx context.Context, stop <-chan struct{}, class string, shards *sync.WaitGroup) error {
	var cons jetstream.Consumer
	for {
		c, err := w.cfg.JetStream.Consumer(ctx, stream.StreamShards, class)
		if err == nil {
			cons = c
			break
		}
		if ctx.Err() != nil {
			// Stopped while looking the consumer up: a run that was
			// COMPLETE when it started, or of a few shards of a
			// millisecond. Nothing to warn of.
			return nil
		}
		if !errors.Is(err, jetstream.ErrConsumerNotFound) {
			w.warnOnline("consumer lookup", "class", class, "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(500 * time.Millisecond):
		}
	}
	puller := stream.NewPuller(w.cfg.JetStream, cons)
	defer puller.Close()
	g := &gate{wake: make(chan struct{}, 1)}
	w.mu.Lock()
	w.gates[class] = g
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		if w.gates[class] == g {
			delete(w.gates, class)
		}
		w.mu.Unlock()
	}()
	// A wait is logged when its reason changes: "4 of 4 slots in use",
	// the usual state of a busy worker, once, not before every fetch.
	lastWhy := ""
	// dryWait is the expiry of the fetches made while the queue is dry
	// (dryFetch), 0 while it is not; drySince is when it ran dry.
	var dryWait time.Duration
	var drySince time.Time
	recheck := time.NewTimer(time.Second)
	defer recheck.Stop()
	for {
		inflight := g.count()
		n, why, blind := w.admit(ctx, class, inflight)
		if n <= 0 && inflight > 0 && g.requested() >= inflight {
			// Every slot taken is an open fetch waiting for a shard: this
			// worker is ready, and holds back none of the class's queued
			// shards (a retry's delay does). Saying "2 of 2 slots in use"
			// with nothing running sent users looking for a busy worker.
			// Once one arrives, the wait holds; the loop may not look
			// again before its shard ends, so the delivery reports it.
			w.setWait(class, 1, "")
			g.setPendingWhy(why)
		} else {
			g.setPendingWhy("")
			w.setWait(class, n, why)
		}
		if n <= 0 {
			if why != lastWhy {
				w.hostLog(class, "wait", why)
				lastWhy = why
			}
			// While the host's budget is shared, another worker's shard
			// may end at any moment: its write to the host ledger wakes
			// this loop (watchLedger), or, where that cannot be watched,
			// the loop looks again soon.
			every := w.cfg.Recheck
			if w.sharing.Load() && !w.ledgerWatched.Load() {
				every = min(every, sharedRecheck)
			}
			recheck.Reset(every)
			select {
			case <-ctx.Done():
				return nil
			case <-g.wake:
			case <-recheck.C:
			}
			continue
		}
		if isClosed(w.drain) {
			// Drain cancels ctx in a moment: no fetch in between.
			<-ctx.Done()
			return nil
		}
		wait := w.cfg.FetchWait
		switch {
		case !g.dry():
			dryWait, drySince = 0, time.Time{}
		case drySince.IsZero():
			drySince = time.Now()
		case time.Since(drySince) >= dryFetchAfter:
			dryWait = dryFetch(dryWait, wait)
			wait = dryWait
		}
		g.add(n)
		batch, err := puller.Fetch(n, wait)
		if err != nil {
			g.unasked(n)
			if ctx.Err() != nil {
				return nil
			}
			w.log.Warn("fetch", "class", class, "err", err)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(time.Second):
			}
			continue
		}
		// A batch closes some time after its last message arrives; draining
		// it aside lets the loop fetch for the next free slot at once. The
		// slots of one request stay reserved until it ends, so requests in
		// flight never ask for more than admission allowed.
		shards.Add(1)
		go func() {
			defer shards.Done()
			got := 0
			for {
				msg, ok := batch.Next()
				if !ok {
					break
				}
				got++
				if why := g.arrived(); why != "" {
					w.setWait(class, 0, why)
				}
				w.busyTill(time.Now())
				if ctx.Err() != nil || isClosed(w.drain) {
					// Shutting down, or draining (its goroutine cancels ctx in
					// a moment): hand it back untouched.
					w.handBackUnstarted(msg)
					g.done(1)
					continue
				}
				shards.Add(1)
				w.track(class, +1)
				run := func() {
					defer shards.Done()
					var once sync.Once
					free := func() { once.Do(func() { w.track(class, -1); g.done(1) }) }
					defer free()
					w.handle(shardCtx, stop, msg, class, why, blind, free)
				}
				if got == n {
					// The batch's last message: this goroutine has nothing
					// left to wait for, so it runs the shard itself (one
					// goroutine per fetch of one, the usual case).
					run()
					continue
				}
				go run()
			}
			g.setBacklog(got == n) // a short batch: the queue ran dry
			g.unasked(n - got)
			if got < n {
				w.hurryFlushes()
			}
			if got == 0 && w.handling.Load() == 0 {
				w.scratch.dropUnused() // nothing queued, nothing in hand
			}
			if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) && ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) {
				w.log.Debug("fetch ended", "class", class, "err", err)
			}
		}()
	}
}

// dryFetchMax bounds the expiry of the fetches a worker makes while its
// class's queue is dry: once it has been dry for dryFetchAfter, each one
// that comes back empty doubles the next one's, from the configured
// FetchWait up to this (or FetchWait, where that is longer). A shard
// queued meanwhile is delivered to the open request at once; what the
// longer expiry costs is the wait for it when the worker stops. `run`'s
// worker fetches with a 20 ms expiry, so that it exits at once when the
// run completes: while the last shard of a run ran for an hour, it asked
// 50 times a second, each time an admission decision with its line in
// admission.log (170,000 lines, about 6% of a CPU). The usual tail of a
// run, its last shards concluding for some milliseconds, keeps the short
// expiry and exits as fast as before.
const (
	dryFetchMax   = 250 * time.Millisecond
	dryFetchAfter = time.Second
)

// dryFetch is the expiry of the next fetch while the queue stays dry, the
// last one's having been last (0: the first since it ran dry).
func dryFetch(last, fetchWait time.Duration) time.Duration {
	if last <= 0 {
		return fetchWait
	}
	return max(min(2*last, dryFetchMax), fetchWait)
}

// dryLogEvery is how often a fetch decision goes to admission.log while
// the queue is dry and the decision is the same (logFetch).
const dryLogEvery = time.Minute

// gate counts a class's shards in flight (requested or running).
type gate struct {
	mu       sync.Mutex
	inflight int
	wake     chan struct{}
	drained  bool // the last fetch came back short: nothing more is queued for now
	asked    int  // of inflight, shards asked for by fetches still open and not yet delivered
	// pendingWhy is why the fetch loop fetches no more, kept while every
	// slot it holds is an open fetch (no wait to report then): the first
	// shard delivered makes it the worker's reason to wait.
	pendingWhy string
	// loggedK and loggedAt are the last fetch decision logFetch let
	// through; dryLogged says it was made while the queue was dry.
	loggedK   int
	loggedAt  time.Time
	dryLogged bool
}

// logFetch says whether a decision to fetch k goes to admission.log:
// every one while the queue has shards; while it is dry, where every
// fetch comes back empty and the loop asks again, the first, then one a
// minute, or one that fetches another number.
func (g *gate) logFetch(k int, now time.Time) bool {
	if g == nil {
		return true
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.drained && g.dryLogged && k == g.loggedK && now.Sub(g.loggedAt) < dryLogEvery {
		return false
	}
	g.loggedK, g.loggedAt, g.dryLogged = k, now, g.drained
	return true
}

// arrived counts a shard asked for and delivered, and returns the wait
// this delivery begins (pendingWhy), or "".
func (g *gate) arrived() (why string) {
	g.mu.Lock()
	g.asked--
	why, g.pendingWhy = g.pendingWhy, ""
	g.mu.Unlock()
	return why
}

// setPendingWhy keeps why the fetch loop waits until a shard arrives.
func (g *gate) setPendingWhy(why string) {
	g.mu.Lock()
	g.pendingWhy = why
	g.mu.Unlock()
}

// unasked takes back n shards asked for that a fetch will not deliver.
func (g *gate) unasked(n int) {
	g.mu.Lock()
	g.asked -= n
	g.mu.Unlock()
	g.done(n)
}

// requested is how many shards open fetches may still deliver.
func (g *gate) requested() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.asked
}

// dry reports whether the class's last fetch came back short (nothing
// more queued for now); a nil gate (no fetch loop yet) is not dry.
func (g *gate) dry() bool { return g != nil && !g.backlog() }

// oneOpen is n cut to what keeps a single fetch of the class open (none
// more while one is), and whether it cut it; a nil gate cuts nothing.
func (g *gate) oneOpen(n int) (int, bool) {
	if g == nil {
		return n, false
	}
	if one := max(1-g.requested(), 0); n > one {
		return one, true
	}
	return n, false
}

// setBacklog records whether the last fetch got all it asked for.
func (g *gate) setBacklog(full bool) {
	g.mu.Lock()
	g.drained = !full
	g.mu.Unlock()
}

// backlog reports whether more shards may be queued (the last fetch was
// full, or none has ended yet).
func (g *gate) backlog() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return !g.drained
}

func (g *gate) count() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.inflight
}

// add counts n shards asked for by a fetch.
func (g *gate) add(n int) {
	g.mu.Lock()
	g.inflight += n
	g.asked += n
	g.mu.Unlock()
}

func (g *gate) done(n int) {
	if n == 0 {
		return
	}
	g.mu.Lock()
	g.inflight -= n
	g.mu.Unlock()
	g.wakeUp()
}

// wakeUp makes the class's fetch loop, when it waits, look again.
func (g *gate) wakeUp() {
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// holdForStore counts a delivery of class held while the store refuses its
// lease write (err), for the worker's report; the returned func ends it.
func (w *Worker) holdForStore(class string, err error) func() {
	w.mu.Lock()
	w.held[class]++
	if cause := errors.Unwrap(err); cause != nil {
		err = cause // without one shard's lease key: the report counts them all
	}
	w.heldWhy = err.Error()
	w.mu.Unlock()
	return func() {
		w.mu.Lock()
		w.held[class]--
		w.mu.Unlock()
	}
}

// holdForOwner counts a delivery of shard key that holds its slot while
// another owner's lease of the shard lives, for the worker's report; the
// returned func ends it.
func (w *Worker) holdForOwner(key string) func() {
	w.mu.Lock()
	w.awaiting[key]++
	w.mu.Unlock()
	w.reportSoon()
	return func() {
		w.mu.Lock()
		if w.awaiting[key]--; w.awaiting[key] <= 0 {
			delete(w.awaiting, key)
		}
		w.mu.Unlock()
		w.reportSoon()
	}
}

// setWait records why class is not being fetched (n <= 0), or clears it.
func (w *Worker) setWait(class string, n int, why string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	old, waited := w.waits[class]
	if n > 0 {
		delete(w.waits, class)
	} else {
		w.waits[class] = why
	}
	if waited != (n <= 0) || (n <= 0 && !SameReason(old, why)) {
		w.reportSoon()
	}
}

// SameReason reports whether two reasons to wait differ only in their
// figures ("4 of 4 slots in use", "probed 12ms ago"): no news for a
// report or a progress line.
func SameReason(a, b string) bool {
	noDigits := func(r rune) rune {
		if r >= '0' && r <= '9' {
			return -1
		}
		return r
	}
	return strings.Map(noDigits, a) == strings.Map(noDigits, b)
}

func (w *Worker) track(class string, d int) {
	w.mu.Lock()
	w.running[class] += d
	w.mu.Unlock()
	w.reportSoon()
}

// reportSoon asks for a report ahead of the period: what status shows of
// this worker (running shards, why it waits) changed.
func (w *Worker) reportSoon() {
	select {
	case w.poke <- struct{}{}:
	default:
	}
}

// reportGap is the least time between two reports: a worker whose shards
// start and end hundreds of times a second writes at most this often.
const reportGap = time.Second

func (w *Worker) count(ok bool) {
	w.mu.Lock()
	held := w.loneWhy != ""
	if ok {
		w.done++
		w.chargedHere++
		w.failedInARow, w.lastFailure = 0, ""
		w.streakKeys = w.streakKeys[:0]
		w.streakGen++
		w.releaseLone()
		w.loneNext = 0
	} else {
		w.failed++
	}
	w.mu.Unlock()
	if ok && held {
		// A shard that ran through the hold validated here: the host can
		// run the job.
		w.hostLog("*", "resume", "fetching again: a shard was validated here")
		w.wakeAll()
	}
}

// peersFresh is how long a read of the peers serves a failure that finds
// no healthy one: a failing worker alone reads them at most 10 times a
// second.
const peersFresh = 100 * time.Millisecond

// attemptFailed counts a charged attempt at the shard key of class that
// failed here (retried or not) toward the report's FailedInARow, and the
// judgement of StopWhenFailingAlone.
func (w *Worker) attemptFailed(ctx context.Context, key, class, reason string) {
	w.mu.Lock()
	w.failedInARow++
	w.chargedHere++
	w.lastFailure = reportCut(reason)
	w.addToStreak(key)
	w.streakClass = class
	if w.holdLone(time.Now()) == holdNoPeer && time.Since(w.peersAt) >= peersFresh {
		// The peers were read before the others started (a scheduler
		// starts a fleet at once), or a while ago: read them now, before
		// this slot fetches again.
		w.mu.Unlock()
		w.refreshPeers(ctx)
		w.mu.Lock()
		w.holdLone(time.Now())
	}
	w.mu.Unlock()
	w.reportSoon()
}

// unixTime is unix nanoseconds as UTC, the zero time for 0.
func unixTime(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns).UTC()
}

// reportCut bounds a reason a worker report quotes: the shard's record
// has it whole.
func reportCut(s string) string {
	if len(s) > 300 {
		return strings.ToValidUTF8(s[:300], "") + "..."
	}
	return s
}

// reportedSlots are the slots a report gives, under mu: the caps of an
// auto worker, the fixed slots of each class served otherwise.
func (w *Worker) reportedSlots() map[string]int {
	if w.cfg.Auto {
		return w.cfg.Slots
	}
	return maps.Clone(w.fixed)
}

// slotsEach is what the report says every class of the active runs gets
// as it appears: SlotsEach, without Auto.
func (w *Worker) slotsEach() int {
	if w.cfg.Auto {
		return 0
	}
	return w.cfg.SlotsEach
}

// fixedSlots is the configured number of slots of class, without Auto:
// its own in Slots, else SlotsEach. Read from the configuration, it takes
// no lock on the fetch path.
func (w *Worker) fixedSlots(class string) int {
	if n, ok := w.slotsOf(class); ok {
		return n
	}
	return w.cfg.SlotsEach
}

// slotsOf is SlotsOf of the worker's Slots.
func (w *Worker) slotsOf(class string) (int, bool) {
	return SlotsOf(w.cfg.Slots, class)
}

func (w *Worker) snapshot() stream.WorkerReport {
	stays := w.cfg.IdleExit <= 0 && w.fetchHeld() == ""
	w.mu.Lock()
	defer w.mu.Unlock()
	running := map[string]int{}
	for c, n := range w.running {
		running[c] = n
	}
	waits := map[string]string{}
	for c, why := range w.waits {
		waits[c] = why
	}
	for c, n := range w.held {
		if n <= 0 {
			continue
		}
		held := fmt.Sprintf("%d shard(s) held: the store takes no lease write (%s)", n, w.heldWhy)
		if waits[c] != "" {
			held = waits[c] + "; " + held
		}
		waits[c] = held
	}
	if w.stopWhy != "" {
		// What the fetch loops last said ("2 of 2 slots in use") no
		// longer holds: none fetches.
		for c := range waits {
			waits[c] = "stopping (" + w.stopWhy + "): fetching no more"
		}
	}
	var staged []string
	if w.stager != nil {
		staged = w.stager.Ready(stream.StagedAdvertised)
	}
	var awaiting []string
	if len(w.awaiting) > 0 {
		awaiting = slices.Sorted(maps.Keys(w.awaiting))
	}
	slow, slowN := w.slowFS(time.Now())
	stopWhy := w.stopWhy
	if stopWhy != "" && w.hurried {
		stopWhy += "; again: SIGKILL to the running commands"
	}
	return stream.WorkerReport{Stopping: stopWhy, StoppingSince: w.stopAt, Concluding: len(w.concluding), Name: w.cfg.Name, Host: w.host, BootID: w.boot, PID: w.pid, PIDNS: w.pidns, Conn: w.conn, SlurmJob: w.slurmJob, Version: stream.ThisBuild().Version, Slots: w.reportedSlots(),
		Running: running, Done: w.done, Failed: w.failed, FailedInARow: w.failedInARow, LastFailure: w.lastFailure, SlotsEach: w.slotsEach(),
		LeftRunning: w.leftRunning, LastLeft: w.lastLeft, SlowFS: slow, SlowFSCount: slowN,
		Started: w.started, Reported: time.Now().UTC(), Waiting: waits, AdmissionLog: w.hostLogPath(), Staged: staged, Awaiting: awaiting, Commands: w.commands(), LastStarted: unixTime(w.lastStarted.Load()), Draining: w.drainWhy, Keeping: slices.Clone(w.keepFor), Stays: stays && w.drainWhy == "" && w.stopWhy == ""}
}

// headroom is the compact probe published with each report: the effective
// budget per resource with the limit that binds it.
func (w *Worker) headroom(ctx context.Context) map[string]stream.Resource {
	snap, err := w.cfg.Probe.Snapshot(ctx, nil)
	if err != nil {
		u := stream.Resource{Unknown: err.Error(), Source: "probe"}
		return map[string]stream.Resource{"cpu_millicores": u, "memory": u, "gpus": u, "vram": u}
	}
	conv := func(l probe.Line) stream.Resource {
		v := l.Effective
		return stream.Resource{Value: v.N, Unlimited: v.Unlimited, Unknown: v.Unknown, Source: l.Binding}
	}
	h := map[string]stream.Resource{
		"cpu_millicores": conv(snap.Budget.CPU), "memory": conv(snap.Budget.Memory),
		"gpus": conv(snap.Budget.GPUs), "vram": conv(snap.Budget.VRAM),
		// Capacity, for judging whether a shard can ever run on this host.
		"cpu_hard": conv(snap.Budget.Hard.CPU), "memory_hard": conv(snap.Budget.Hard.Memory), "gpus_hard": conv(snap.Budget.Hard.GPUs), "vram_hard": conv(snap.Budget.Hard.VRAM),
		"memory_available": {Value: snap.Host.MemAvailable.N, Unknown: snap.Host.MemAvailable.Unknown, Source: "MemAvailable"},
	}
	// The scratch file system: its room now, and its size, for judging
	// whether a class's declared scratch can ever fit (submit).
	src := "statfs " + w.cfg.Scratch
	if st, err := (probe.SysStatFS{}).Statfs(w.cfg.Scratch); err != nil {
		h["scratch"] = stream.Resource{Unknown: err.Error(), Source: src}
		h["scratch_hard"] = h["scratch"]
	} else {
		h["scratch"] = stream.Resource{Value: st.Free(), Source: src}
		h["scratch_hard"] = stream.Resource{Value: st.Total(), Source: src}
	}
	return h
}

// report writes the worker's report to the workers bucket every
// ReportEvery, and soon after what it says changes (reportSoon). It
// reports until ctx ends, which is after the worker's shards have
// settled. Once serving ends (the worker stops fetching, or drained),
// it says why when run, the worker's own context, has ended: the
// worker stops (Stopping).
func (w *Worker) report(ctx context.Context, serving <-chan struct{}, run context.Context) {
	t := time.NewTicker(w.cfg.ReportEvery)
	defer t.Stop()
	// Every period the report probes the host again; in between, a change
	// of what this worker runs or waits for goes out with the last probe
	// (status read a report up to a period old: "RUNNING -" while two
	// shards ran, and no reason for the ones waiting).
	full := true
	var head map[string]stream.Resource
	for {
		r := w.snapshot()
		if full {
			head = w.headroom(ctx)
			w.refreshPeers(ctx)
			w.learnCoordinator(ctx, w.cfg.JetStream.Conn())
		}
		r.Headroom, r.Limits, r.Auto = head, w.limits, w.cfg.Auto
		// As it goes out, after the probe: readers compare it with when
		// the store took it (onOwnClock).
		r.Reported = time.Now().UTC()
		if data, err := stream.Encode(&r); err == nil {
			if _, err := w.b.Workers.Put(ctx, w.cfg.Name, data); err != nil && ctx.Err() == nil {
				w.warnOnline("worker report", "err", err)
			}
		}
		wrote := time.Now()
		select {
		case <-ctx.Done():
			return
		case <-serving:
			serving = nil
			if run.Err() != nil {
				w.stopping(whyStopped(run))
			}
			full = false
		case <-t.C:
			full = true
		case <-w.poke:
			full = false
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Until(wrote.Add(min(reportGap, w.cfg.ReportEvery)))):
			}
		}
	}
}

// whyStopped says why a worker's context ended: the cause its canceller
// gave (the CLI gives the signal's name), or "stopped".
func whyStopped(ctx context.Context) string {
	c := context.Cause(ctx)
	if c == nil || errors.Is(c, context.Canceled) || errors.Is(c, context.DeadlineExceeded) {
		return "stopped"
	}
	return c.Error()
}

// stopping records why the worker stops, for its reports.
func (w *Worker) stopping(why string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopWhy == "" {
		w.stopWhy, w.stopAt = why, time.Now().UTC()
	}
}

// checkName refuses to start under a name another live worker reports
// under: their reports would overwrite each other (status would show one
// of them, and either one's exit would remove the other's report). A report
// of a process proven gone (this host and boot, same pid namespace, pid
// not running) or older than three report periods (15 s by default) is a
// dead worker's, as after a crash and restart under the same name. The
// age is the store's (its stamp of the entry against its clock now:
// readStoreClock), not its writer's, whose clock may be off by hours.
//
// It returns the revision of the report it judged (0: none), from which
// claimName takes the name.
func (w *Worker) checkName(ctx context.Context) (uint64, error) {
	e, err := w.b.Workers.Get(ctx, w.cfg.Name)
	if err != nil {
		return 0, nil // none (or unreadable: claimName's create says which)
	}
	var r stream.WorkerReport
	if stream.Decode(e.Value(), &r) != nil {
		return e.Revision(), nil
	}
	// The report's process is judged as a lease's owner is: gone only when
	// provably so (or this very process, a worker restarted in it).
	if w.ownerGone(stream.Owner{Worker: r.Name, Host: r.Host, BootID: r.BootID, PID: r.PID, PIDNS: r.PIDNS}) {
		return e.Revision(), nil
	}
	// The report's age by the store's stamp, not by its writer's clock:
	// a holder whose clock runs an hour behind is live all the same.
	age := time.Since(r.Reported)
	if w.readStoreClock(ctx) {
		age = time.Since(w.onOwnTime(e.Created()))
	}
	if age > 3*max(w.cfg.ReportEvery, 5*time.Second) {
		return e.Revision(), nil // silent for three report periods: gone, or its pid reused
	}
	if r.Stopping != "" {
		// Restarted at once after a stop: the old one still settles
		// its shards, and its exit removes the report under the name.
		return 0, fmt.Errorf("worker %s: %w: the worker under it on host %s pid %d is stopping (%s, since %s by its clock) and exits once its shards have settled; start this one when it has, or give it another --name",
			w.cfg.Name, ErrNameTaken, r.Host, r.PID, r.Stopping, r.StoppingSince.Format(time.TimeOnly))
	}
	return 0, fmt.Errorf("worker %s: %w: a live worker reports under it from host %s pid %d (last report %s ago); give this one another --name",
		w.cfg.Name, ErrNameTaken, r.Host, r.PID, max(age, 0).Round(time.Second))
}

// claimName takes the worker's name: checkName, then a first report
// written with compare-and-set from the revision it judged. Two workers
// started at once under one name both found it free before either had
// reported; both served, their reports overwriting each other, and
// neither ran a shard. Now the second's write conflicts, and it judges
// again what the first wrote: a live worker's report.
func (w *Worker) claimName(ctx context.Context) error {
	for range 3 {
		rev, err := w.checkName(ctx)
		if err != nil {
			return err
		}
		r := w.snapshot()
		data, err := stream.Encode(&r)
		if err != nil {
			return err
		}
		if rev == 0 {
			_, err = w.b.Workers.Create(ctx, w.cfg.Name, data)
		} else {
			_, err = w.b.Workers.Update(ctx, w.cfg.Name, data, rev)
		}
		if err == nil {
			return nil
		}
		if !stream.IsConflict(err) {
			// The store did not answer: serve, as before names were
			// claimed; the first report replaces whatever is there. A
			// worker stopped meanwhile has nothing to warn of.
			if ctx.Err() != nil {
				return nil
			}
			w.log.Warn("could not take the worker's name in the workers bucket", "err", err)
			return nil
		}
	}
	return fmt.Errorf("worker %s: %w: its report changed under it three times; give this one another --name", w.cfg.Name, ErrNameTaken)
}

// warnOnline logs a failed request to the coordinator as a warning while
// the connection is up, and at debug level while it is down: the loss is
// told once where the connection is watched (the worker command says
// "lost the coordinator at ..."), not by every loop that meets it.
func (w *Worker) warnOnline(msg string, args ...any) {
	if nc := w.cfg.JetStream.Conn(); nc != nil && !nc.IsConnected() {
		w.log.Debug(msg, args...)
		return
	}
	w.log.Warn(msg, args...)
}

// finalReport removes the worker's report so status stops listing it.
func (w *Worker) finalReport() {
	ctx, cancel := w.exitWrite(context.Background(), 2*time.Second)
	defer cancel()
	_ = w.b.Workers.Delete(ctx, w.cfg.Name)
}

// admission appends one decision to the run's admission.log and emits it.
func (w *Worker) admission(run, shard, class, decision, detail string) {
	ev := Event{Time: time.Now().UTC(), Run: run, Shard: shard, Class: class, Decision: decision, Detail: detail}
	if w.cfg.OnEvent != nil {
		w.cfg.OnEvent(ev)
	}
	line := fmt.Sprintf("%s worker=%s run=%s shard=%s class=%s decision=%s %s\n",
		ev.Time.Format(time.RFC3339Nano), w.cfg.Name, run, shard, class, decision, strings.TrimSpace(detail))
	w.mu.Lock()
	defer w.mu.Unlock()
	l := w.logs[run]
	if l == nil {
		dir := w.evidenceDir(run)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return
		}
		if !w.announced[run] {
			// Once a process: its output says where to look, where it
			// would otherwise say nothing of the runs it serves.
			w.announced[run] = true
			w.log.Info("serving a run: its admission decisions and attempt logs on this host are in its evidence directory", "run", run, "evidence", dir)
		}
		f, err := os.OpenFile(filepath.Join(dir, w.evidenceFile("admission.log")), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			return
		}
		if len(w.logs) >= maxOpenLogs {
			w.closeOldestLog()
		}
		l = &openLog{f: f}
		w.logs[run] = l
	}
	w.logUses++
	l.used = w.logUses
	l.f.WriteString(line)
}

// maxOpenLogs bounds the admission logs a worker keeps open: one that
// serves runs for months would otherwise hold a descriptor for every run
// it ever served.
const maxOpenLogs = 16

// openLog is an open admission.log and when it was last written (a
// count of writes).
type openLog struct {
	f    *os.File
	used uint64
}

// closeOldestLog closes the least recently written admission log (under
// w.mu); a later decision of its run opens it again.
func (w *Worker) closeOldestLog() {
	oldest := ""
	for run, l := range w.logs {
		if oldest == "" || l.used < w.logs[oldest].used {
			oldest = run
		}
	}
	if oldest != "" {
		w.logs[oldest].f.Close()
		delete(w.logs, oldest)
	}
}

func (w *Worker) closeLogs() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.hostLogF != nil {
		w.hostLogF.Close()
		w.hostLogF = nil
	}
	for k, l := range w.logs {
		l.f.Close()
		delete(w.logs, k)
	}
}

func (w *Worker) evidenceDir(run string) string { return filepath.Join(w.cfg.StateDir, "runs", run) }

// sharedStateDir decides whether the files this worker appends evidence to
// carry its host's name (evidenceFile). Workers on several hosts share a
// state directory on network storage (a home directory on NFS, as the
// workers of `shardpool sbatch` do by default), and appends from two NFS
// clients to one file are not atomic: each client writes at the end it
// last saw, and lines of one host overwrite or split another's. Appends
// from one host are ordered by its kernel, so local storage keeps the
// plain names, and so does a directory the probe could not look at (its
// statfs failed): there is nothing to go on. A file system of a type the
// probe cannot classify (a FUSE of unknown subtype, say) counts as shared.
func (w *Worker) sharedStateDir(ctx context.Context) {
	pi := w.cfg.Probe.Where(ctx, w.cfg.StateDir)
	if pi.Locality == probe.Local || pi.Unknown != "" {
		return
	}
	host := strings.ReplaceAll(w.host, "/", "_") // a kernel hostname may hold one
	if host == "" {
		host = "unnamed-host"
	}
	w.perHost = "." + host
	w.log.Info("the state directory may be shared with other hosts: evidence logs carry this host's name",
		"state", w.cfg.StateDir, "type", pi.Type, "locality", pi.Locality, "example", w.evidenceFile("admission.log"))
}

// evidenceFile is the name of a file that every worker using the state
// directory appends to (admission.log, staging.jsonl): the name itself, or
// with the host before its extension (admission.<host>.log) where the state
// directory may be shared with other hosts (sharedStateDir).
func (w *Worker) evidenceFile(name string) string {
	if w.perHost == "" {
		return name
	}
	ext := filepath.Ext(name)
	return strings.TrimSuffix(name, ext) + w.perHost + ext
}

// cachedRun is a run record as a worker last read it.
type cachedRun struct {
	rec  *stream.RunRecord
	read time.Time
}

// runRecordTTL is how long a worker trusts the run record it read: a
// resubmission of the same generation can change its retries, timeout or
// paths (coordinator.SubmitResult.Changed), which must reach the workers
// that are already running.
const runRecordTTL = 5 * time.Second

// runRecord returns the run's record, read again when the cached copy is
// of another generation, older than the message's settings, or older than
// runRecordTTL.
func (w *Worker) runRecord(ctx context.Context, run, fp string, settings int) (*stream.RunRecord, error) {
	w.mu.Lock()
	c := w.runs[run]
	w.mu.Unlock()
	if c.rec != nil && c.rec.Fingerprint == fp && c.rec.Settings >= settings && time.Since(c.read) < runRecordTTL {
		return c.rec, nil
	}
	e, err := w.b.Runs.Get(ctx, run)
	if err != nil {
		return nil, fmt.Errorf("run %s: %w", run, err)
	}
	var rec stream.RunRecord
	if err := stream.Decode(e.Value(), &rec); err != nil {
		return nil, err
	}
	w.mu.Lock()
	w.runs[run] = cachedRun{rec: &rec, read: time.Now()}
	w.mu.Unlock()
	return &rec, nil
}

func (w *Worker) backoff(attempt int) time.Duration {
	return stream.Doubled(w.cfg.BackoffMin, w.cfg.BackoffMax, attempt)
}

// newStager makes the host's stager, at start: it copies nothing until
// a shard stages (stagerFor), but its reservations are the scratch
// file system's one ledger from the first shard on, staged or not
// (reserveScratch).
func (w *Worker) newStager() error {
	cfg := w.cfg.Staging
	if cfg.Dir == "" {
		cfg.Dir = filepath.Join(w.cfg.Scratch, "stage")
	}
	if cfg.Probe == nil {
		cfg.Probe = w.cfg.Probe
	}
	if cfg.Logger == nil {
		cfg.Logger = w.log
	}
	if cfg.HostDir == "" {
		cfg.HostDir = StageHostDir(cmp.Or(w.cfg.HostLedger, DefaultLedgerDir()))
	}
	if w.cfg.StageFleet > 0 {
		cfg.Fleet = &staging.Fleet{KV: w.b.Stagers, Slots: w.cfg.StageFleet, Owner: w.cfg.Name, TTL: w.ttl}
	}
	st, err := staging.New(cfg)
	if err != nil {
		return err
	}
	// Under mu: the report and the locality check read it from other
	// goroutines than the one that ran this.
	w.mu.Lock()
	w.stager = st
	w.mu.Unlock()
	return nil
}

// hostStager is the host's stager (newStager), read under mu: the
// report, the locality check and the shards read it from other
// goroutines than the one that made it.
func (w *Worker) hostStager() *staging.Stager {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stager
}

// stagerFor returns the host's stager once it has checked, on first use,
// that the scratch is local storage: staging to a network mount would
// copy inputs from one file server to another.
func (w *Worker) stagerFor(ctx context.Context) (*staging.Stager, error) {
	w.stageOnce.Do(func() {
		err := w.hostStager().Check(ctx)
		w.mu.Lock()
		w.stageErr = err
		w.mu.Unlock()
	})
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stager, w.stageErr
}

// shardpoolRoots are the processes besides this one whose trees the CPU
// meter counts as shardpool's, not as others' use: the host's other
// workers that share this one's budget (the ledger's last look; their
// shards count by what they hold) and the coordinator when it runs on
// this host (its CPU grows with the shards it serves).
func (w *Worker) shardpoolRoots() []probe.ProcID {
	var roots []probe.ProcID
	if w.ledger != nil {
		roots = append(roots, w.ledger.workerRoots()...)
	}
	if v := w.coord.Load(); v != nil && v.proc != nil {
		roots = append(roots, *v.proc)
	}
	return roots
}
