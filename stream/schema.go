package stream

import (
	"fmt"
	"time"

	json "github.com/segmentio/encoding/json"
)

// SchemaVersion is written as "v" in every message and KV value.
const SchemaVersion = 1

// Shard states, durable in the shards bucket. A shard with no record yet is
// pending: its message sits in the SHARDS stream.
const (
	ShardPending   = "pending"
	ShardRunning   = "running"
	ShardValidated = "validated"
	ShardFailed    = "failed"
)

// Run states.
const (
	RunPrepared = "PREPARED"
	RunQueued   = "QUEUED"
	RunRunning  = "RUNNING"
	RunComplete = "COMPLETE"
	RunBlocked  = "BLOCKED"
)

// ShardMsg is the payload published on shards.<run>.<class>.
type ShardMsg struct {
	V           int               `json:"v"`
	Run         string            `json:"run"`
	Fingerprint string            `json:"fingerprint"`
	ID          string            `json:"id"`
	Class       string            `json:"class"`
	Inputs      []string          `json:"inputs"`
	Cost        int64             `json:"cost"`
	Params      map[string]string `json:"params,omitempty"`
	Retry       int               `json:"retry,omitempty"`
	// Settings is the run record's Settings when this message was
	// published: a worker whose copy of the record is older reads it again.
	Settings int `json:"settings,omitempty"`
	// Files describes Inputs (size, mtime, checksums) when the shard's
	// class stages its inputs; every copy is verified against it.
	Files []InputFile `json:"files,omitempty"`
}

// InputFile is one input as the submitter saw it: staging verifies every
// copy against it, and resumes an interrupted copy from the longest prefix
// whose chunks match.
type InputFile struct {
	Path   string   `json:"path"`
	Size   int64    `json:"size"`
	MTime  int64    `json:"mtime_ns"`
	XXH64  string   `json:"xxh64"`
	Chunks []string `json:"chunks"` // xxh64 of each ChunkSize piece
	// Pack marks a tar of the shard's many small inputs (made at submit);
	// the worker stages it as one file and unpacks it, verified, locally.
	Pack bool `json:"pack,omitempty"`
}

// Owner identifies one attempt's process on one boot of one host, which is
// what a reclaim must prove gone.
type Owner struct {
	Worker string `json:"worker"`
	Host   string `json:"host"`
	BootID string `json:"boot_id"`
	PID    int    `json:"pid"`
	// PIDNS names the owner's pid namespace ("pid:[4026531836]"): two
	// containers on one host share its name and boot ID, but a pid means
	// something only within its namespace. Empty where it was unreadable
	// (and in records older than the field): then nothing is proven.
	PIDNS   string `json:"pid_ns,omitempty"`
	Attempt int    `json:"attempt"`
}

// Attempt is what one run of a shard's command did.
type Attempt struct {
	// N is the delivery of the shard's message this attempt ran on (it
	// names the attempt's log); Round is the retry round (ShardRecord.Retry)
	// it belongs to.
	N        int       `json:"n"`
	Round    int       `json:"round,omitempty"`
	Worker   string    `json:"worker"`
	Host     string    `json:"host"`
	Start    time.Time `json:"start"`
	Duration Seconds   `json:"duration"`
	ExitCode *int      `json:"exit_code,omitempty"`
	Signal   string    `json:"signal,omitempty"`
	Outcome  string    `json:"outcome"`
	Reason   string    `json:"reason,omitempty"`
	// PeakRSS is the command's peak RSS where it had no cgroup: the
	// kernel's figure where above the worker's own, or the largest sum of
	// its process group's RSS sampled while it ran, the larger; 0 where
	// neither measured it (docs/status-json.md).
	PeakRSS int64 `json:"peak_rss,omitempty"`
	// PeakMemory is the shard cgroup's peak (the whole process tree) where
	// per-shard cgroups are enforced.
	PeakMemory int64  `json:"peak_memory,omitempty"`
	Log        string `json:"log,omitempty"`
	// LogLost says why the command's output could not be kept in a log
	// (its file not made: a state directory full or refusing writes);
	// empty where the output was kept, or there was none.
	LogLost string `json:"log_lost,omitempty"`
	// LeftRunning names the processes the command left running outside
	// its process group, killed when it ended (where the shard has a
	// cgroup of its own, or the worker found them: see docs/spec.md).
	LeftRunning string `json:"left_running,omitempty"`
	// StageSeconds and CommitSeconds time staging the inputs and the final
	// sync of the outputs to the destination.
	StageSeconds  float64 `json:"stage_seconds,omitempty"`
	CommitSeconds float64 `json:"commit_seconds,omitempty"`
}

// Attempt outcomes.
const (
	OutcomeOK          = "ok"
	OutcomeExit        = "exit"
	OutcomeTimeout     = "timeout"
	OutcomeOOM         = "oom"
	OutcomeSignal      = "signal"
	OutcomeInvalid     = "invalid-output"
	OutcomeCommit      = "commit-error"
	OutcomeInterrupted = "interrupted"
	OutcomeLeaseLost   = "lease-lost"
	OutcomeStart       = "start-error"
	OutcomeLost        = "lost"
	OutcomeDiscarded   = "discarded"
	OutcomeStage       = "stage-error"
	OutcomePreempted   = "preempted"
)

// Output is a committed shard output.
type Output struct {
	Path     string `json:"path"`
	Checksum string `json:"checksum"`
	Files    int    `json:"files"`
	Bytes    int64  `json:"bytes"`
}

// ShardRecord is the durable state of one shard, key <run>.<id> in the
// shards bucket.
type ShardRecord struct {
	V           int       `json:"v"`
	Run         string    `json:"run"`
	ID          string    `json:"id"`
	Fingerprint string    `json:"fingerprint"`
	Class       string    `json:"class"`
	State       string    `json:"state"`
	Retry       int       `json:"retry"`
	Owner       *Owner    `json:"owner,omitempty"`
	Attempts    []Attempt `json:"attempts,omitempty"`
	Output      *Output   `json:"output,omitempty"`
	Reason      string    `json:"reason,omitempty"`
	Payload     *ShardMsg `json:"payload,omitempty"`
	// Deferred counts deliveries of this retry round handed to a worker that
	// had the inputs staged (locality); they are not attempts.
	Deferred int `json:"deferred,omitempty"`
	// Interrupted counts deliveries of this retry round handed back by a
	// worker's shutdown (SIGTERM, or `run` interrupted) or preempted under
	// memory pressure: the shard did not fail, so they are not attempts
	// either.
	Interrupted int       `json:"interrupted,omitempty"`
	Updated     time.Time `json:"updated"`
}

// ShardBrief is the part of a ShardRecord that a reader of every record's
// update needs (the coordinator's tracker): its attempts are counted, not
// decoded, and its owner and payload are skipped. A record of one attempt
// decodes in 60% of the time with a tenth of the allocations, and the
// tracker decodes two records a shard. The fields keep ShardRecord's
// names (TestShardBriefReadsARecord).
type ShardBrief struct {
	V           int        `json:"v"`
	Fingerprint string     `json:"fingerprint"`
	Class       string     `json:"class"`
	State       string     `json:"state"`
	Retry       int        `json:"retry"`
	Attempts    []struct{} `json:"attempts,omitempty"`
	Output      *Output    `json:"output,omitempty"`
	Reason      string     `json:"reason,omitempty"`
}

// ShardTimes is the part of a ShardRecord that says what its attempts
// took, which the tracker decodes of a validated record only (once a
// shard): ShardBrief counts attempts without decoding them.
type ShardTimes struct {
	V        int `json:"v"`
	Attempts []struct {
		Duration   Seconds `json:"duration"`
		Outcome    string  `json:"outcome"`
		PeakRSS    int64   `json:"peak_rss"`
		PeakMemory int64   `json:"peak_memory"`
	} `json:"attempts,omitempty"`
}

// Peak is the largest peak memory of the record's attempts: each
// one's cgroup peak where it was measured, else its peak RSS.
func (r *ShardTimes) Peak() int64 {
	var p int64
	for _, a := range r.Attempts {
		p = max(p, a.PeakMemory, a.PeakRSS)
	}
	return p
}

// Validated is what the attempt that validated the shard took: the last
// attempt, where it ended ok with its command timed. Its peak memory is
// the shard cgroup's (the whole process tree) where it was measured, else
// the command's peak RSS. ok is false for a shard validated without such
// an attempt (an output already committed, found and recorded).
func (r *ShardTimes) Validated() (d time.Duration, peak int64, ok bool) {
	if len(r.Attempts) == 0 {
		return 0, 0, false
	}
	a := r.Attempts[len(r.Attempts)-1]
	if a.Outcome != OutcomeOK || a.Duration <= 0 {
		return 0, 0, false
	}
	peak = a.PeakRSS
	if a.PeakMemory > 0 {
		peak = a.PeakMemory
	}
	return time.Duration(a.Duration), peak, true
}

// OpenAttempt reports whether the record is running an attempt whose
// end it does not hold.
func (r *ShardRecord) OpenAttempt() bool {
	return r.State == ShardRunning && len(r.Attempts) > 0 && r.Attempts[len(r.Attempts)-1].Outcome == ""
}

// OpenAttempts names the attempts r holds with no outcome ("attempt N of
// WORKER"). A record that says validated or failed should hold none:
// whoever ended the shard closed every attempt, so each says how it ended
// and which were charged. The drill and the crash soak check it.
func (r *ShardRecord) OpenAttempts() []string {
	var open []string
	for _, at := range r.Attempts {
		if at.Outcome == "" {
			open = append(open, fmt.Sprintf("attempt %d of %s", at.N, at.Worker))
		}
	}
	return open
}

// CloseLost marks the open attempt, if any, lost: called once its
// worker is over (its lease expired, released, or handed back).
func (r *ShardRecord) CloseLost() {
	if !r.OpenAttempt() {
		return
	}
	last := &r.Attempts[len(r.Attempts)-1]
	last.Outcome = OutcomeLost
	last.Reason = fmt.Sprintf("worker %s on %s did not report this attempt before its lease expired or was handed back (killed, its host lost, or cut off from the coordinator)", last.Worker, last.Host)
}

// Counts are shards per state of the run's current fingerprint.
type Counts struct {
	Total     int `json:"total"`
	Pending   int `json:"pending"`
	Running   int `json:"running"`
	Validated int `json:"validated"`
	Failed    int `json:"failed"`
}

// RunRecord is key <run> in the runs bucket. Submit writes the spec part;
// the coordinator writes the state part.
type RunRecord struct {
	V           int            `json:"v"`
	Name        string         `json:"name"`
	Fingerprint string         `json:"fingerprint"`
	Spec        Spec           `json:"spec"`
	ManifestSHA string         `json:"manifest_hash"`
	Classes     map[string]int `json:"classes"`
	// MeasuredMemory is each class\'s peak memory from profile.json, which
	// workers\' admission prefers to the declared one.
	MeasuredMemory map[string]int64 `json:"measured_memory,omitempty"`
	// MeasuredVRAM is each GPU class's VRAM from profile.json where the
	// measured peak is above the declared vram (a shard's over all its
	// GPUs): workers place its shards by it.
	MeasuredVRAM map[string]int64 `json:"measured_vram,omitempty"`
	Queued       bool             `json:"queued"`
	Retry        int              `json:"retry"`
	// Settings counts the updates of Spec's settings outside the
	// fingerprint (retries, timeout, paths) by resubmissions of this
	// generation; shard messages carry the value they were published at.
	Settings    int               `json:"settings,omitempty"`
	Resume      string            `json:"resume"`
	RetryCmd    string            `json:"retry_command"`
	State       string            `json:"state"`
	Counts      Counts            `json:"counts"`
	ClassCounts map[string]Counts `json:"class_counts,omitempty"`
	Reason      string            `json:"reason,omitempty"`
	Evidence    string            `json:"evidence,omitempty"`
	Submitted   time.Time         `json:"submitted"`
	Updated     time.Time         `json:"updated"`
	// Halt is how many shards may fail, with none validated since
	// HaltBase, before the coordinator halts the run (0: never; `submit
	// --halt`). Halted says why it halted: the run is BLOCKED, and its
	// queued messages published before stream sequence HaltSeq are taken
	// off the queue, until a submission puts them back.
	Halt     int    `json:"halt,omitempty"`
	HaltBase Counts `json:"halt_base,omitzero"`
	Halted   string `json:"halted,omitempty"`
	HaltSeq  uint64 `json:"halt_seq,omitempty"`
	// HaltedBy is who halted the run by hand (`shardpool halt`: user and
	// host), not for its failures; absent otherwise, and cleared with
	// Halted.
	HaltedBy string `json:"halted_by,omitempty"`
	// HaltStop is set when the halt stops the run's running commands too
	// (`shardpool halt --now`): workers send them SIGTERM, then SIGKILL
	// after their grace period, and hand their shards back uncharged, to
	// be queued again with the held ones. Cleared with Halted.
	HaltStop bool `json:"halt_stop,omitempty"`
	// OutputOn is the storage that held the output directory (or, where
	// it did not exist yet, the nearest directory above it) on the host
	// of the latest submission that could tell. Off a local disk, a
	// worker on a host where the directory is missing and would be made
	// under another mount point does not make it (the file system is not
	// mounted there). On a local disk (Local), a worker on another host
	// (boot) that sees the directory on a local disk of its own commits
	// nothing there: outputs would lie scattered over the workers' disks.
	OutputOn *OutputStorage `json:"output_on,omitempty"`
	// Timing is, with a verdict (COMPLETE or BLOCKED), what the run's
	// validated shards took (final.json's timing); before it, what those
	// validated so far took, as of a moment up to 10 s before Updated;
	// absent where none was timed.
	Timing *Timing `json:"timing,omitempty"`
	// PeaksSeen is, per class, the largest peak memory an attempt of this
	// generation recorded (its cgroup's where it had one, else its
	// process group's RSS), with its shard: workers' admission reserves
	// it where it is well above the class's declared or measured peak
	// (docs/admission.md). The coordinator keeps it from the shard
	// records; absent before an attempt recorded a peak.
	PeaksSeen map[string]PeakSeen `json:"peaks_seen,omitempty"`
	// Pace is, before the verdict, how fast the run's shards end
	// (validated, or failed after their retries) over the tracker's last
	// minute of it, as of Updated: absent until a few seconds of it saw
	// shards end.
	Pace *RunPace `json:"pace,omitempty"`
}

// PeakSeen is the largest peak memory of a class's attempts
// (RunRecord's PeaksSeen) and the shard that reached it.
type PeakSeen struct {
	Bytes int64  `json:"bytes"`
	Shard string `json:"shard"`
}

// RunPace is a run's pace: shards ended a second, and the seconds the
// shards left (pending and running) need at it.
type RunPace struct {
	PerSecond   float64 `json:"per_second"`
	LeftSeconds float64 `json:"left_seconds"`
}

// OutputStorage is where a run's output directory was seen (RunRecord's
// OutputOn).
type OutputStorage struct {
	Host       string `json:"host"`
	Type       string `json:"type"` // with a FUSE subtype: "fuse.sshfs"
	Source     string `json:"source,omitempty"`
	MountPoint string `json:"mount_point"`
	// Local: a disk of that host's own (ext4, xfs, ...), which no other
	// host sees; BootID tells that host from others of the same name
	// (containers), and is set with Local only.
	Local  bool   `json:"local,omitempty"`
	BootID string `json:"boot_id,omitempty"`
}

// String describes the storage as a person reads it.
func (o OutputStorage) String() string {
	return fmt.Sprintf("%s %s mounted at %s on host %s", o.Type, o.Source, o.MountPoint, o.Host)
}

// Lease is key <run>.<id> in the leases bucket; its life is the bucket TTL.
type Lease struct {
	V           int       `json:"v"`
	Owner       Owner     `json:"owner"`
	Fingerprint string    `json:"fingerprint"`
	Taken       time.Time `json:"taken"`
	Renewed     time.Time `json:"renewed"`
}

// Commit states in the checkpoints bucket.
const (
	CommitCommitted = "committed"
	CommitRevoked   = "revoked"
)

// CommitRecord is key <run>.<id> in the checkpoints bucket: which attempt
// won the right to publish the shard's output for a fingerprint. It is
// written with compare-and-set, so exactly one attempt wins; the coordinator
// revokes it when the published output later fails verification.
type CommitRecord struct {
	V           int       `json:"v"`
	Run         string    `json:"run"`
	ID          string    `json:"id"`
	Fingerprint string    `json:"fingerprint"`
	State       string    `json:"state"`
	Owner       Owner     `json:"owner"`
	Checksum    string    `json:"checksum"`
	Path        string    `json:"path"`
	Reason      string    `json:"reason,omitempty"`
	Time        time.Time `json:"time"`
}

// Command is a shard's command running on a worker: the shard's key
// (run.id), the attempt (its delivery, as the shard's owner records it),
// the command's pid, which leads its own process group (kill -TERM
// -PID ends the attempt, which is retried as any failed one), and when it
// started, by the worker's clock.
type Command struct {
	Key     string    `json:"key"`
	Attempt int       `json:"attempt"`
	PID     int       `json:"pid"`
	Start   time.Time `json:"start"`
}

// MaxReportedCommands bounds WorkerReport.Commands: a worker of many
// slots reports its longest running commands, the ones a person looks
// for.
const MaxReportedCommands = 64

// WorkerReport is key <worker> in the workers bucket, refreshed every few
// seconds; a worker whose key expired is gone.
type WorkerReport struct {
	V      int    `json:"v"`
	Name   string `json:"name"`
	Host   string `json:"host"`
	BootID string `json:"boot_id"`
	PID    int    `json:"pid"`
	// PIDNS scopes PID (see Owner.PIDNS); absent in older reports.
	PIDNS    string              `json:"pid_ns,omitempty"`
	Slots    map[string]int      `json:"slots"`
	Running  map[string]int      `json:"running"`
	Done     int                 `json:"done"`
	Failed   int                 `json:"failed"`
	Started  time.Time           `json:"started"`
	Reported time.Time           `json:"reported"`
	Headroom map[string]Resource `json:"headroom,omitempty"`
	// FailedInARow counts the attempts this worker ran and that failed
	// (charged: each counts toward the shard's retries) since it last
	// validated a shard, and LastFailure is the last one's reason. A host
	// that fails what other hosts run (a missing library or driver) shows
	// a count that only grows.
	FailedInARow int    `json:"failed_in_a_row,omitempty"`
	LastFailure  string `json:"last_failure,omitempty"`
	// LeftRunning counts the attempts here whose command left processes
	// running outside its process group when it ended (they were killed),
	// and LastLeft names the last: run, shard and what was killed.
	LeftRunning int    `json:"left_running,omitempty"`
	LastLeft    string `json:"last_left,omitempty"`
	// SlowFS lists, oldest first and at most ten, the attempts that have
	// waited on a file system for the worker's --slow-fs (2m) or longer: in
	// their commit, or in the looks at their destination and output
	// directory before their command ("run.id in its commit to DIR for
	// 7m12s"), as on a hung NFS mount; SlowFSCount counts them all.
	SlowFS      []string `json:"slow_fs,omitempty"`
	SlowFSCount int      `json:"slow_fs_count,omitempty"`
	// Limits says whether per-shard limits are enforced by the OS or only watched.
	Limits string `json:"limits,omitempty"`
	// Auto is true when slots come from measured admission.
	Auto bool `json:"auto,omitempty"`
	// SlotsEach is the slots the worker gives each class of the active
	// runs as it appears (Slots lists those it has seen); 0 when its slots
	// are per class, or measured.
	SlotsEach int `json:"slots_each,omitempty"`
	// Waiting is, per class, why the worker is not fetching right now.
	Waiting map[string]string `json:"waiting,omitempty"`
	// AdmissionLog is the file on the worker's host where it logs each
	// admission decision; absent in older reports.
	AdmissionLog string `json:"admission_log,omitempty"`
	// Staged lists the inputs this worker holds verified in its staging
	// cache (checksum-size-name keys, most recently used first, at most
	// StagedAdvertised), for other workers' locality decisions.
	Staged []string `json:"staged,omitempty"`
	// Awaiting lists the shards (run.id keys) of which this worker holds a
	// delivery, its slot taken (Running counts it), while another
	// attempt's lease of the shard lives (another worker's, or one of this
	// worker's own): the message came again while that attempt ran (a
	// heartbeat late at the server, a coordinator restart). The
	// delivery settles once the shard's record says it ended, or takes the
	// lease once it ends, or hands the message back after three lease
	// TTLs; it runs nothing meanwhile.
	Awaiting []string `json:"awaiting,omitempty"`
	// Commands are the processes of the commands running when the report
	// was made, the longest running first (at most MaxReportedCommands):
	// which process a shard's attempt is, for a person who looks into it
	// (ps, strace, py-spy) or ends it. Absent while none runs, and in
	// older reports.
	Commands []Command `json:"commands,omitempty"`
	// Conn is the name of the worker's connection to the coordinator, as
	// the coordinator lists its clients (`shardpool-worker-<name>`, or
	// the coordinator's own where `run` embeds the worker); absent in
	// older reports and for unnamed connections.
	Conn string `json:"conn,omitempty"`
	// SlurmJob is the Slurm job the worker runs in (SLURM_JOB_ID), so that
	// an operator can find and end it (scancel); absent outside Slurm.
	SlurmJob string `json:"slurm_job,omitempty"`
	// Version is the build of shardpool the worker runs (Build.Version);
	// absent in older reports.
	Version string `json:"version,omitempty"`
	// LastStarted is when the worker last started a command (by its own
	// clock): another worker whose commands cannot start on its host
	// tells from it whether this one's can (worker's noteStart). Absent
	// before its first start, and in older reports.
	LastStarted time.Time `json:"last_started,omitzero"`
	// Draining is why the worker drains (it fetches no more and leaves
	// once its running shards end); absent while it serves. An idle
	// worker does not count on a draining one to stay for the shards
	// still out (worker's keeping).
	Draining string `json:"draining,omitempty"`
	// Stopping is why the worker stops ("SIGTERM", with "; again:
	// SIGKILL to the running commands" after a second signal): it fetches
	// no more, its running commands have SIGTERM and the grace period, what
	// did not finish goes back to the queue, and it exits once its shards
	// have settled. It keeps reporting meanwhile: a commit that waits on
	// a hung mount can hold it there for long. StoppingSince is when,
	// by its clock. Both absent while it serves.
	Stopping      string    `json:"stopping,omitempty"`
	StoppingSince time.Time `json:"stopping_since,omitzero"`
	// Concluding counts the shards whose command has ended and that are
	// being committed, recorded and acknowledged; their slots are free
	// (Running does not count them) but their records say RUNNING.
	Concluding int `json:"concluding,omitempty"`
	// Keeping lists the classes of which shards are out (delivered, not
	// settled) that this idle worker stays for, past its --idle-exit: a
	// shard of a worker that dies, or one waiting out a retry's delay,
	// comes back with a worker there to run it. Other idle workers leave
	// (worker's keeping). Absent while the worker runs shards, or has no
	// --idle-exit.
	Keeping []string `json:"keeping,omitempty"`
	// Stays is true for a worker that serves until it is stopped (no
	// --idle-exit) and is not draining or holding its fetches: an idle
	// worker leaves the shards out to it as to one that is Keeping them.
	// Absent (false) in older reports, which are not counted on.
	Stays bool `json:"stays,omitempty"`
	// Stored is when the coordinator's store took the report (the KV
	// entry's time, by the coordinator's clock), set by WorkerReports and
	// never sent: against Reported, by the worker's clock, it tells how
	// far that clock is from the coordinator's.
	Stored time.Time `json:"-"`
	// ClockAhead is set by whoever reads the report, never by the worker:
	// how far the worker's clock is ahead of the coordinator's (negative:
	// behind), from Reported against Stored, where that is the
	// coordinator's clockShown or more; 0 otherwise. Its report's and
	// attempts' times are off by as much; other workers correct for it,
	// readers of evidence do not.
	ClockAhead Seconds `json:"clock_ahead,omitempty"`
	// Gone is set by whoever reads the report, never by the worker: why
	// its process is proven gone (on the reader's own host: same boot and
	// pid namespace, pid not running) while its report has not expired.
	Gone string `json:"gone,omitempty"`
	// Disconnected is set by whoever reads the report, never by the
	// worker: why the worker has no connection to the coordinator (no
	// client of the coordinator has its Conn name) while its report has
	// not expired. A worker killed on another host, or cut off from the
	// coordinator: what it runs stays leased until the leases expire.
	Disconnected string `json:"disconnected,omitempty"`
}

// StagedAdvertised bounds the staged inputs a worker report lists.
const StagedAdvertised = 4096

// Resource is a three-state probe value: a number, unlimited, or unknown
// with a reason. Zero never stands for "could not read".
type Resource struct {
	Value     int64  `json:"value,omitempty"`
	Unlimited bool   `json:"unlimited,omitempty"`
	Unknown   string `json:"unknown,omitempty"`
	Source    string `json:"source,omitempty"`
}

// versioned is a schema type: Encode stamps its V, Decode checks it.
type versioned interface{ schemaV() *int }

func (r *ShardMsg) schemaV() *int     { return &r.V }
func (r *ShardRecord) schemaV() *int  { return &r.V }
func (r *ShardBrief) schemaV() *int   { return &r.V }
func (r *RunRecord) schemaV() *int    { return &r.V }
func (r *Lease) schemaV() *int        { return &r.V }
func (r *WorkerReport) schemaV() *int { return &r.V }
func (r *CommitRecord) schemaV() *int { return &r.V }

func (r *CoordinatorInfo) schemaV() *int { return &r.V }

// Encode marshals v after stamping its schema version.
//
// Records and messages go through github.com/segmentio/encoding/json, a
// drop-in for encoding/json that writes the same bytes (sorted map keys,
// the same escaping; TestCodecMatchesEncodingJSON) about 2.5x faster and
// decodes about 3.5x faster: every shard makes four records and the
// coordinator decodes each, so on short shards the standard codec was
// several percent of the worker pool's CPU. The spec, the manifest and
// the fingerprint keep encoding/json.
func Encode(v any) ([]byte, error) {
	if r, ok := v.(versioned); ok {
		*r.schemaV() = SchemaVersion
	}
	return json.Marshal(v)
}

// Decode unmarshals b into v and refuses versions it does not know. The
// schema types are parsed once and their V checked after; other types (and
// documents that fail to parse) are probed for "v" first, so that a newer
// version is reported as such rather than as a type error.
func Decode(b []byte, v any) error {
	if err := json.Unmarshal(b, v); err != nil {
		if ver, perr := probeVersion(b); perr == nil && ver != SchemaVersion {
			return fmt.Errorf("decode %T: %w: %d", v, ErrSchemaVersion, ver)
		}
		return fmt.Errorf("decode %T: %w", v, err)
	}
	ver, ok := versionOf(v)
	if !ok {
		var err error
		if ver, err = probeVersion(b); err != nil {
			return fmt.Errorf("decode %T: %w", v, err)
		}
	}
	if ver != SchemaVersion {
		return fmt.Errorf("decode %T: %w: %d", v, ErrSchemaVersion, ver)
	}
	return nil
}

func probeVersion(b []byte) (int, error) {
	var probe struct {
		V int `json:"v"`
	}
	err := json.Unmarshal(b, &probe)
	return probe.V, err
}

// versionOf reads V of the schema types Encode stamps.
func versionOf(v any) (int, bool) {
	if r, ok := v.(versioned); ok {
		return *r.schemaV(), true
	}
	return 0, false
}
