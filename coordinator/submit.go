package coordinator

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardpool/shardpool/checkpoint"
	"github.com/shardpool/shardpool/staging"
	"github.com/shardpool/shardpool/stream"
)

// SubmitOptions tune a submission.
type SubmitOptions struct {
	// RetryFailed requeues the run's failed shards (a new retry round).
	RetryFailed bool
	// Resume is the command a person runs to resume this run; it is recorded
	// in the run record and resume.txt.
	Resume string
	// Retry is the command that retries the run's failed shards.
	Retry string
	// ClassCaps caps in-flight shards per class across the fleet (the
	// consumer's MaxAckPending); absent means no fleet cap.
	ClassCaps map[string]int
	// MeasuredMemory is each class's measured peak memory (profile.json).
	MeasuredMemory map[string]int64
	// MeasuredVRAM is each GPU class's VRAM where profile.json measured
	// more than the declared vram.
	MeasuredVRAM map[string]int64
	// Hashes caches input checksums for classes that stage (by path, size
	// and mtime); nil hashes without a cache file.
	Hashes *staging.Hashes
	// Halt, when above 0, has the coordinator halt the run once that many
	// shards have failed after their retries with none validated since this
	// submission (RunRecord.Halt). A submission of a halted run queues its
	// held shards again.
	Halt int
	// Reverify, for a resubmitted run that is COMPLETE or BLOCKED (nothing
	// running either way), checks every committed output at the
	// destination from this host and redoes the shards whose output is
	// missing or fails, or was made from inputs changed since (a new retry
	// round). Set it where the output directory is visible: `run` always,
	// `submit` when the directory exists here.
	Reverify bool
	// OutputOn is where this host sees the output directory
	// (stream.RunRecord's OutputOn); nil leaves the record's, in a new
	// generation too.
	OutputOn *stream.OutputStorage
}

// SubmitResult says what a submission did.
type SubmitResult struct {
	Run         string `json:"run"`
	Fingerprint string `json:"fingerprint"`
	State       string `json:"state"`
	Published   int    `json:"published"`
	NewRun      bool   `json:"new_generation"`
	Retried     int    `json:"retried"`
	// AlreadyRetried counts failed shards a --retry-failed found requeued
	// by another submission, at the same time or earlier, whose messages
	// were on the queue already; they are not in Retried.
	AlreadyRetried int `json:"already_retried,omitempty"`
	// Redone counts committed shards whose output was missing or failed
	// verification (Reverify) and were queued again.
	Redone int `json:"redone,omitempty"`
	// RedoneIDs names up to ten of them, with why.
	RedoneIDs []string `json:"redone_ids,omitempty"`
	// Restored counts unfinished shards whose queued message the store had
	// lost (a full disk under it, say), or that a halt had taken off the
	// queue, and that were published again.
	Restored int `json:"restored,omitempty"`
	// Unhalted is why the run had been halted, when this submission
	// queued its held shards again; UnhaltedBy who halted it, where that
	// was by hand (shardpool halt).
	Unhalted   string `json:"unhalted,omitempty"`
	UnhaltedBy string `json:"unhalted_by,omitempty"`
	// Changed lists the settings outside the fingerprint (retries, timeout,
	// staging, paths of the spec, manifest and command directory, profile
	// settings, measured peaks) that a resubmission of the same generation
	// updated; they apply to attempts that start from now on.
	Changed []string `json:"changed,omitempty"`
	// Replaced is the fingerprint of the generation this submission
	// replaced (the run existed with another fingerprint); Because says
	// what changed, and ReplacedValidated how many shards that generation
	// had validated: their outputs are made again under the new one.
	Replaced          string   `json:"replaced_generation,omitempty"`
	Because           []string `json:"generation_changes,omitempty"`
	ReplacedValidated int      `json:"replaced_validated,omitempty"`
}

// DescribeChanges joins GenerationChanges (SubmitResult.Because) for a
// message.
func DescribeChanges(c []string) string {
	if len(c) == 0 {
		// Fingerprints of an older version of shardpool differ in what
		// they hash, not in what the user wrote.
		return "nothing the spec shows; the run was submitted by another version of shardpool"
	}
	return strings.Join(c, "; ")
}

// Submit publishes a validated run. It is idempotent: the same run again
// publishes nothing; a changed fingerprint starts a new generation and
// purges the old one's queued messages, so the two are never mixed.
// Submissions of a new run at once (an array job whose every task
// submits) are one: the ones that find the run created meanwhile submit
// again as to a run that exists.
func Submit(ctx context.Context, js jetstream.JetStream, spec *stream.Spec, man *stream.Manifest, opt SubmitOptions) (SubmitResult, error) {
	for tries := 1; ; tries++ {
		res, err := submit(ctx, js, spec, man, opt)
		if !errors.Is(err, errCreatedMeanwhile) || tries == 3 {
			return res, err
		}
	}
}

// errCreatedMeanwhile: another submission created the run record first.
var errCreatedMeanwhile = errors.New("the run was created by another submission meanwhile")

func submit(ctx context.Context, js jetstream.JetStream, spec *stream.Spec, man *stream.Manifest, opt SubmitOptions) (SubmitResult, error) {
	b, err := stream.WaitBuckets(ctx, js, 15*time.Second)
	if err != nil {
		return SubmitResult{}, fmt.Errorf("submit %s: %w", spec.Name, err)
	}
	fp := stream.Fingerprint(spec, man.Hash)
	res := SubmitResult{Run: spec.Name, Fingerprint: fp}
	var prev *stream.RunRecord
	var rev uint64
	if e, err := b.Runs.Get(ctx, spec.Name); err == nil {
		var r stream.RunRecord
		if err := stream.Decode(e.Value(), &r); err != nil {
			return res, fmt.Errorf("submit %s: %w", spec.Name, err)
		}
		prev, rev = &r, e.Revision()
	} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return res, fmt.Errorf("submit %s: %w", spec.Name, err)
	}
	if prev != nil && prev.Spec.Output != spec.Output && (prev.Fingerprint != fp || prev.Queued) {
		return res, movedOutput(spec, prev, fp)
	}
	if prev != nil && prev.Fingerprint == fp && prev.Queued {
		res.State = prev.State
		changed, settings, err := updateSettings(ctx, b, prev, rev, spec, opt)
		if err != nil {
			return res, fmt.Errorf("submit %s: %w", spec.Name, err)
		}
		res.Changed = changed
		if prev.Halted != "" {
			// The halt's purge goes first (the coordinator's may not have
			// run yet): what restoreLost below publishes again comes after
			// the halt's bound and is never taken off the queue.
			if err := PurgeHalted(ctx, js, prev); err != nil {
				return res, fmt.Errorf("submit %s: take the halted run's messages off the queue: %w", spec.Name, err)
			}
		}
		if opt.RetryFailed {
			r, err := retryFailed(ctx, js, b, prev, man, settings)
			if err != nil {
				return res, err
			}
			res.Retried, res.AlreadyRetried, res.State = r.n, r.already, stream.RunRunning
		}
		if prev.State != stream.RunComplete {
			// The shards just retried are unfinished again, not failed:
			// the check of how many messages the run should have must not
			// count them twice.
			cur := *prev
			cur.Counts.Failed = max(cur.Counts.Failed-res.Retried-res.AlreadyRetried, 0)
			n, err := restoreLost(ctx, js, b, &cur, man, settings)
			if err != nil {
				return res, err
			}
			res.Restored = n
		}
		// A BLOCKED run too: its validated shards would otherwise be
		// checked only once a retry has made it COMPLETE, at the run after.
		if opt.Reverify && (prev.State == stream.RunComplete || prev.State == stream.RunBlocked) {
			r, err := redoUnverified(ctx, js, b, prev, man, settings)
			if err != nil {
				return res, err
			}
			if r.n > 0 {
				res.Redone, res.RedoneIDs, res.State = r.n, r.why, stream.RunRunning
			}
		}
		// Last, once its held shards are queued again: a submission that
		// stops before this leaves the run halted, and the next one puts
		// them back.
		if prev.Halted != "" || prev.Halt != opt.Halt || opt.RetryFailed {
			lifted, err := setHalt(ctx, b, prev, opt.Halt, res.Retried+res.AlreadyRetried)
			if err != nil {
				return res, fmt.Errorf("submit %s: %w", spec.Name, err)
			}
			if lifted {
				res.Unhalted, res.UnhaltedBy, res.State = prev.Halted, prev.HaltedBy, stream.RunRunning
			}
		}
		return res, nil
	}
	if prev != nil && prev.Fingerprint != fp {
		res.Replaced, res.ReplacedValidated = prev.Fingerprint, prev.Counts.Validated
		res.Because = stream.GenerationChanges(&prev.Spec, prev.ManifestSHA, spec, man.Hash)
		if opt.RetryFailed {
			// The user asked for the failed shards only; a new generation
			// would run every shard again. Say so before anything changes.
			return res, fmt.Errorf("%s: %w: run %s is generation %s (%d of %d shard(s) validated), and this spec is %s (changed: %s): "+
				"it would run every shard again, not only the failed ones. To start the new generation, leave out --retry-failed; "+
				"to retry only the failed shards, undo the change", spec.SpecPath, ErrRetryNewGeneration, spec.Name, prev.Fingerprint,
				prev.Counts.Validated, prev.Counts.Total, fp, DescribeChanges(res.Because))
		}
	}
	if opt.RetryFailed && prev == nil {
		// A run not submitted before runs every shard anyway.
		opt.RetryFailed = false
	}
	if prev == nil {
		if err := checkSharedOutput(ctx, b, spec, man, fp); err != nil {
			return res, err
		}
	}
	ttl, err := leaseTTL(ctx, b)
	if err != nil {
		return res, fmt.Errorf("submit %s: %w", spec.Name, err)
	}
	classes := map[string]int{}
	for _, sh := range man.Shards {
		classes[sh.Class]++
	}
	for class := range classes {
		if _, err := stream.EnsureConsumer(ctx, js, class, stream.MaxDeliver(spec.Retries), opt.ClassCaps[class], ttl); err != nil {
			return res, fmt.Errorf("submit %s: %w", spec.Name, err)
		}
	}
	rec := stream.RunRecord{
		Name: spec.Name, Fingerprint: fp, Spec: *spec, ManifestSHA: man.Hash, Classes: classes,
		State: stream.RunPrepared, Counts: stream.Counts{Total: len(man.Shards), Pending: len(man.Shards)},
		MeasuredMemory: opt.MeasuredMemory, MeasuredVRAM: opt.MeasuredVRAM, Resume: opt.Resume, RetryCmd: opt.Retry, Submitted: time.Now().UTC(), Updated: time.Now().UTC(),
		Halt: opt.Halt, OutputOn: opt.OutputOn,
	}
	if rec.OutputOn == nil && prev != nil {
		// A submitter that could not tell where the output is leaves
		// what an earlier one saw.
		rec.OutputOn = prev.OutputOn
	}
	if prev != nil && prev.Fingerprint != fp {
		res.NewRun = true
		s, err := js.Stream(ctx, stream.StreamShards)
		if err != nil {
			return res, fmt.Errorf("submit %s: %w", spec.Name, err)
		}
		if err := s.Purge(ctx, jetstream.WithPurgeSubject(stream.RunSubjects(spec.Name))); err != nil {
			return res, fmt.Errorf("submit %s: purge old generation %s: %w", spec.Name, prev.Fingerprint, err)
		}
	}
	if prev == nil {
		res.NewRun = true
	}
	if rev, err = putNewGeneration(ctx, b, &rec, prev, rev); err != nil {
		return res, fmt.Errorf("submit %s: %w", spec.Name, err)
	}
	if err := describeInputs(ctx, spec, man, opt.Hashes); err != nil {
		return res, fmt.Errorf("submit %s: %w", spec.Name, err)
	}
	if err := checkStagedSizes(man); err != nil {
		return res, fmt.Errorf("submit %s: %w", spec.Name, err)
	}
	n, err := publish(ctx, js, fp, spec.Name, man.Shards, 0, 0)
	res.Published = n
	if err != nil {
		return res, fmt.Errorf("submit %s: %w", spec.Name, err)
	}
	if n < len(man.Shards) {
		// Some IDs were taken for duplicates. After a submission that
		// stopped halfway their messages are queued; after a run was
		// forgotten (Forget) within the queue's duplicate window they are
		// not, and nothing would deliver those shards: publish those again.
		restored, err := restoreLost(ctx, js, b, &rec, man, 0)
		res.Restored = restored
		if err != nil {
			return res, fmt.Errorf("submit %s: %w", spec.Name, err)
		}
	}
	// Mark queued; the tracker may have written state in between.
	if rec, _, err = changeRun(ctx, b, rec, rev, func(r *stream.RunRecord) {
		r.Queued, r.Updated = true, time.Now().UTC()
		if r.State == stream.RunPrepared {
			r.State = stream.RunQueued
			if c := r.Counts; c.Running+c.Validated+c.Failed > 0 {
				// Workers took what was published before this write, and
				// the tracker counted them: as it would judge the run.
				r.State = stream.RunRunning
			}
		}
	}); err != nil {
		return res, fmt.Errorf("submit %s: mark queued: %w", spec.Name, err)
	}
	// What was published and the QUEUED state must survive a host crash
	// before the producer is told so.
	if err := stream.Barrier(ctx, js.Conn()); err != nil {
		return res, fmt.Errorf("submit %s: %w", spec.Name, err)
	}
	res.State = rec.State
	return res, nil
}

// movedOutput refuses a run submitted with another output directory than
// the one its record has. The run's outputs stay where they were
// committed. The same generation elsewhere would have nothing run to fill
// the new directory; a new generation would take over the run's name,
// records and evidence, most often as another job that happens to have
// the same name (two projects' "eval" in one state directory), whose
// submission would say that the old outputs are made again while nothing
// touches them.
func movedOutput(spec *stream.Spec, prev *stream.RunRecord, fp string) error {
	if prev.Fingerprint == fp {
		return fmt.Errorf("%s: field %q: %w: run %s (fingerprint %s) has its outputs in %s, and this spec names %s; "+
			"put the output back, or give the run another name to start a separate run", spec.At("", "output"), "output", ErrSpecConflict,
			spec.Name, fp, prev.Spec.Output, spec.Output)
	}
	of := ""
	if prev.Spec.SpecPath != "" && prev.Spec.SpecPath != spec.SpecPath {
		of = " of " + prev.Spec.SpecPath
	}
	return fmt.Errorf("%s: field %q: %w: run %s is generation %s%s (%s, %d of %d shard(s) validated) with its outputs in %s, "+
		"and this spec (generation %s) names %s: its outputs would not replace those, which would stay behind, "+
		"and the run's records and evidence would become this job's. Give this run another name to start a separate run, "+
		"or put the output back to make a new generation of run %s; to reuse the name, forget the old run first "+
		"(shardpool forget, once it is COMPLETE or BLOCKED: its outputs stay)", spec.At("", "output"), "output", ErrSpecConflict,
		spec.Name, prev.Fingerprint, of, prev.State, prev.Counts.Validated, prev.Counts.Total, prev.Spec.Output, fp, spec.Output, spec.Name)
}

// checkSharedOutput refuses a new run whose output directory holds shards
// of another run with the same ids and another fingerprint: each of this
// run's shards would replace that run's committed output (a copied spec
// whose output was not changed). Runs with disjoint ids may share a
// directory, and a renamed run of the same fingerprint finds its outputs
// committed and skips them. The other run's shards are those with a record
// and, where its manifest is readable here and unchanged, those it lists.
func checkSharedOutput(ctx context.Context, b *stream.Buckets, spec *stream.Spec, man *stream.Manifest, fp string) error {
	names, err := b.Keys(ctx, b.Runs)
	if err != nil {
		return fmt.Errorf("submit %s: %w", spec.Name, err)
	}
	ids := make(map[string]bool, len(man.Shards))
	for _, sh := range man.Shards {
		ids[sh.ID] = true
	}
	for _, name := range names {
		if name == spec.Name {
			continue
		}
		e, err := b.Runs.Get(ctx, name)
		if err != nil {
			continue
		}
		var other stream.RunRecord
		if stream.Decode(e.Value(), &other) != nil || filepath.Clean(other.Spec.Output) != filepath.Clean(spec.Output) || other.Fingerprint == fp {
			continue
		}
		keys, err := b.KeysMatching(ctx, b.Shards, name+".*")
		if err != nil {
			return fmt.Errorf("submit %s: %w", spec.Name, err)
		}
		seen := map[string]bool{}
		for _, k := range keys {
			if _, id, _ := strings.Cut(k, "."); ids[id] {
				seen[id] = true
			}
		}
		// Shards of the other run that have not started have no record yet:
		// its manifest names them, when it is readable here and still the
		// file that run published.
		if theirs, hash, err := stream.ManifestIDs(other.Spec.Manifest); err == nil && hash == other.ManifestSHA {
			for id := range theirs {
				if ids[id] {
					seen[id] = true
				}
			}
		}
		shared := slices.Sorted(maps.Keys(seen))
		if len(shared) > 0 {
			return fmt.Errorf("%s: field %q: %w: %s also holds run %s (fingerprint %s), which has %d shard(s) with ids of this manifest (%s); "+
				"they would replace each other's outputs. Give this run its own output directory", spec.At("", "output"), "output", ErrSpecConflict,
				spec.Output, name, other.Fingerprint, len(shared), strings.Join(shared[:min(len(shared), 3)], ", "))
		}
	}
	return nil
}

// orDefault is a retry_delay as settingChanges names it.
func orDefault(d stream.Seconds) string {
	if d <= 0 {
		return "the workers' default"
	}
	return d.D().String()
}

// settingChanges describes the differences between two specs of one
// generation in the fields the fingerprint leaves out.
func settingChanges(old, cur *stream.Spec) []string {
	var out []string
	if old.Retries != cur.Retries {
		out = append(out, fmt.Sprintf("retries %d -> %d", old.Retries, cur.Retries))
	}
	if old.Timeout != cur.Timeout {
		out = append(out, fmt.Sprintf("timeout %s -> %s", time.Duration(old.Timeout), time.Duration(cur.Timeout)))
	}
	if old.RetryDelay != cur.RetryDelay {
		out = append(out, fmt.Sprintf("retry_delay %s -> %s", orDefault(old.RetryDelay), orDefault(cur.RetryDelay)))
	}
	if old.Stage != cur.Stage {
		out = append(out, fmt.Sprintf("stage %v -> %v", old.Stage, cur.Stage))
	}
	if old.SpecPath != cur.SpecPath {
		out = append(out, fmt.Sprintf("spec %s -> %s", old.SpecPath, cur.SpecPath))
	}
	if old.Dir != cur.Dir {
		out = append(out, fmt.Sprintf("command directory %s -> %s", old.Dir, cur.Dir))
	}
	if old.Manifest != cur.Manifest {
		out = append(out, fmt.Sprintf("manifest %s -> %s (same content)", old.Manifest, cur.Manifest))
	}
	if !reflect.DeepEqual(old.Profile, cur.Profile) {
		out = append(out, "profile settings")
	}
	return out
}

// updateSettings writes the spec's settings outside the fingerprint (and
// the measured peaks and commands the submitter passes) into the run
// record of the same generation, so that a changed retries or timeout
// applies to what runs next instead of being ignored. It retries its
// compare-and-set when the tracker wrote in between. It returns what
// changed and the record's Settings count after the update.
func updateSettings(ctx context.Context, b *stream.Buckets, prev *stream.RunRecord, rev uint64, spec *stream.Spec, opt SubmitOptions) ([]string, int, error) {
	changed := settingChanges(&prev.Spec, spec)
	measured := (opt.MeasuredMemory != nil && !maps.Equal(prev.MeasuredMemory, opt.MeasuredMemory)) ||
		(opt.MeasuredVRAM != nil && !maps.Equal(prev.MeasuredVRAM, opt.MeasuredVRAM))
	if measured {
		changed = append(changed, "measured peaks (profile.json)")
	}
	commands := (opt.Resume != "" && opt.Resume != prev.Resume) || (opt.Retry != "" && opt.Retry != prev.RetryCmd)
	on := opt.OutputOn != nil && (prev.OutputOn == nil || *opt.OutputOn != *prev.OutputOn)
	if len(changed) == 0 && !commands && !on {
		return nil, prev.Settings, nil
	}
	rec, _, err := changeRun(ctx, b, *prev, rev, func(r *stream.RunRecord) {
		r.Spec = *spec
		if len(changed) > 0 {
			r.Settings++
		}
		if measured {
			r.MeasuredMemory, r.MeasuredVRAM = opt.MeasuredMemory, opt.MeasuredVRAM
		}
		if opt.Resume != "" {
			r.Resume = opt.Resume
		}
		if opt.Retry != "" {
			r.RetryCmd = opt.Retry
		}
		if on {
			r.OutputOn = opt.OutputOn
		}
	})
	if err != nil {
		return nil, 0, fmt.Errorf("update settings: %w", err)
	}
	return changed, rec.Settings, nil
}

// setHalt writes a submission's halt into the run record of the same
// generation: the threshold, the halt prev had lifted, and the counts from
// which failures are counted again (those of the record, less the shards
// a --retry-failed just reset). A halt the coordinator recorded while the
// submission ran stands: its purge may have taken what this submission
// published, and the next submission puts that back. It reports whether
// it lifted a halt.
func setHalt(ctx context.Context, b *stream.Buckets, prev *stream.RunRecord, halt, retried int) (bool, error) {
	lifted := false
	_, _, err := changeRun(ctx, b, *prev, 0, func(r *stream.RunRecord) {
		r.Halt, lifted = halt, false
		if r.Halted != "" && r.HaltSeq != prev.HaltSeq {
			return
		}
		lifted = r.Halted != ""
		r.Halted, r.HaltSeq, r.HaltedBy, r.HaltStop = "", 0, "", false
		r.HaltBase = stream.Counts{Failed: max(r.Counts.Failed-retried, 0), Validated: r.Counts.Validated}
		if lifted && r.State == stream.RunBlocked {
			// Its held shards are queued again; the tracker says the rest.
			r.State, r.Reason, r.Updated = stream.RunRunning, "", time.Now().UTC()
		}
	})
	if err != nil {
		return false, fmt.Errorf("set halt: %w", err)
	}
	return lifted, nil
}

// changeRun applies change to the run record cur, read at revision rev,
// and writes it with compare-and-set. When someone wrote the record in
// between (the tracker, judging the run), it reads it again and applies
// change to that, as long as it is still cur's generation. A rev of 0
// reads the record first. It returns the record written and its
// revision. Updated is change's to set: it dates the run's state, and
// `run` takes a BLOCKED or COMPLETE record updated after its submission
// began for the verdict, so a change of the spec part alone (settings,
// the halt's threshold) must leave it as it was.
func changeRun(ctx context.Context, b *stream.Buckets, cur stream.RunRecord, rev uint64, change func(*stream.RunRecord)) (stream.RunRecord, uint64, error) {
	fp := cur.Fingerprint
	for {
		if rev != 0 {
			r := cur
			change(&r)
			n, err := putRun(ctx, b.Runs, &r, rev, false)
			if err == nil {
				return r, n, nil
			}
			if !stream.IsConflict(err) {
				return r, 0, err
			}
		}
		e, err := b.Runs.Get(ctx, cur.Name)
		if err != nil {
			return cur, 0, err
		}
		cur = stream.RunRecord{}
		if err := stream.Decode(e.Value(), &cur); err != nil {
			return cur, 0, err
		}
		if cur.Fingerprint != fp {
			return cur, 0, fmt.Errorf("the run became generation %s meanwhile", cur.Fingerprint)
		}
		rev = e.Revision()
	}
}

// putNewGeneration writes rec, a new run or a new generation of prev read
// at rev. The tracker may write prev's record in between (its counts, its
// state as the previous submission takes effect): that is re-read, and rec
// replaces it all the same while it is still prev's generation. Another
// generation written meanwhile (a concurrent submission) is refused, as a
// run created meanwhile is.
func putNewGeneration(ctx context.Context, b *stream.Buckets, rec, prev *stream.RunRecord, rev uint64) (uint64, error) {
	for {
		n, err := putRun(ctx, b.Runs, rec, rev, prev == nil)
		if prev == nil && stream.IsConflict(err) {
			return 0, fmt.Errorf("%w (%v)", errCreatedMeanwhile, err)
		}
		if err == nil || prev == nil || !stream.IsConflict(err) {
			return n, err
		}
		e, err := b.Runs.Get(ctx, rec.Name)
		if err != nil {
			return 0, err
		}
		var cur stream.RunRecord
		if err := stream.Decode(e.Value(), &cur); err != nil {
			return 0, err
		}
		if cur.Fingerprint != prev.Fingerprint {
			return 0, fmt.Errorf("the run became generation %s meanwhile", cur.Fingerprint)
		}
		rev = e.Revision()
	}
}

func putRun(ctx context.Context, kv jetstream.KeyValue, r *stream.RunRecord, rev uint64, create bool) (uint64, error) {
	b, err := stream.Encode(r)
	if err != nil {
		return 0, err
	}
	if create {
		return kv.Create(ctx, r.Name, b)
	}
	return kv.Update(ctx, r.Name, b, rev)
}

func leaseTTL(ctx context.Context, b *stream.Buckets) (time.Duration, error) {
	st, err := b.Leases.Status(ctx)
	if err != nil {
		return 0, err
	}
	return st.TTL(), nil
}

// publishWindow is how many publications may await their acks at once.
const publishWindow = 1024

// publish sends shards with de-duplication IDs and waits for every ack.
func publish(ctx context.Context, js jetstream.JetStream, fp, run string, shards []stream.Shard, retry, settings int) (int, error) {
	return publishAs(ctx, js, fp, run, shards, retry, settings, "")
}

// publishAs is publish with a suffix to the Msg-IDs: a message published
// again because the store lost it must not be taken for a duplicate of
// the lost one.
func publishAs(ctx context.Context, js jetstream.JetStream, fp, run string, shards []stream.Shard, retry, settings int, idSuffix string) (int, error) {
	// Acks are settled a window at a time and their futures dropped: a
	// future holds its message, and a manifest of millions of shards must
	// not be held twice in memory.
	futures := make([]jetstream.PubAckFuture, 0, publishWindow)
	n, first := 0, 0
	settle := func() error {
		select {
		case <-js.PublishAsyncComplete():
		case <-ctx.Done():
			return ctx.Err()
		}
		for i, f := range futures {
			select {
			case ack := <-f.Ok():
				if !ack.Duplicate {
					n++
				}
			case err := <-f.Err():
				return fmt.Errorf("publish shard %s: %w", shards[first+i].ID, stream.Explain(err))
			}
		}
		clear(futures)
		futures = futures[:0]
		return nil
	}
	for i := range shards {
		sh := &shards[i]
		m := stream.ShardMsg{Run: run, Fingerprint: fp, ID: sh.ID, Class: sh.Class, Inputs: sh.Inputs,
			Cost: sh.Cost, Params: sh.Params, Retry: retry, Settings: settings, Files: sh.Files}
		data, err := stream.Encode(&m)
		if err != nil {
			return n, err
		}
		msg := &nats.Msg{Subject: stream.ShardSubject(run, sh.Class), Data: data, Header: nats.Header{}}
		msg.Header.Set(nats.MsgIdHdr, stream.MsgID(run, fp, sh.ID, retry)+idSuffix)
		f, err := js.PublishMsgAsync(msg)
		if err != nil {
			return n, fmt.Errorf("publish shard %s: %w", sh.ID, stream.Explain(err))
		}
		futures = append(futures, f)
		// Bound the acks in flight: with SyncAlways each is an fsync, and
		// the client refuses more than a few thousand outstanding.
		if len(futures) == publishWindow {
			if err := settle(); err != nil {
				return n, err
			}
			first = i + 1
		}
	}
	return n, settle()
}

// maxShardMsg is the largest shard message submit publishes: the
// server's payload limit (8 MiB) less room for headers.
const maxShardMsg = 7 << 20

// checkStagedSizes refuses, before anything is published, a staged shard
// whose message with the description of each input would not fit in
// one (the manifest's own check bounds paths and params only).
func checkStagedSizes(man *stream.Manifest) error {
	for i := range man.Shards {
		sh := &man.Shards[i]
		if len(sh.Files) == 0 {
			continue
		}
		data, err := stream.Encode(&stream.ShardMsg{ID: sh.ID, Class: sh.Class, Inputs: sh.Inputs, Cost: sh.Cost, Params: sh.Params, Files: sh.Files})
		if err != nil {
			return err
		}
		if len(data) > maxShardMsg {
			return fmt.Errorf("%s:%d: field %q: %w: shard %s stages %d inputs, and its message with their descriptions comes to %s, over the %s a message may hold: split it into several shards",
				man.Path, sh.Line, "inputs", stream.ErrInvalidManifest, sh.ID, len(sh.Inputs), stream.FormatSize(int64(len(data))), stream.FormatSize(maxShardMsg))
		}
	}
	return nil
}

// describeInputs records size, mtime and checksums of the inputs of every
// shard whose class stages, once per run (cached across submissions).
func describeInputs(ctx context.Context, spec *stream.Spec, man *stream.Manifest, h *staging.Hashes) error {
	if h == nil {
		h = staging.LoadHashes("")
	}
	packing := staging.NewPacking(spec.Pack)
	for i := range man.Shards {
		sh := &man.Shards[i]
		if !spec.StageFor(sh.Class) || len(sh.Files) == len(sh.Inputs) || staging.Packed(sh.Files) {
			continue
		}
		files, err := staging.DescribeShard(ctx, h, packing, staging.PackDir(spec.Output), sh.ID, sh.Inputs, sh.Cost)
		if err != nil {
			return fmt.Errorf("shard %s (%s line %d): %w", sh.ID, man.Path, sh.Line, err)
		}
		sh.Files = files
	}
	return h.Save()
}

// requeueAction is what requeue does with one shard record.
type requeueAction int

const (
	keep      requeueAction = iota
	republish               // publish its current round again
	reset                   // pending in a new round, then publish
)

// requeue walks the run's shard records of its fingerprint and, as decide
// says, resets them to pending in a new retry round (keeping their
// attempt history) and publishes them again. Every record is reset before
// anything is published, so the shards watch shows all resets ahead of any
// progress of a requeued shard (the tracker never judges the run from a
// mix of old states and new results); a requeue cut short in between
// leaves shards pending in a round whose message may be missing, which
// retryFailed publishes again where the queue does not hold it (read
// from the stream: past the duplicate window the round's Msg-ID no
// longer makes a second message a no-op). What was published is durable
// before it returns.
//
// It counts the shards whose message it put on the queue, not the records
// it decided on: a submission requeueing the same run at the same time
// finds the shards the other reset pending in the new round and publishes
// them again under the same Msg-ID, which the queue drops as duplicates;
// those are counted apart (requeued.already), so that of two retries at
// once only one says it retried them.
func requeue(ctx context.Context, js jetstream.JetStream, b *stream.Buckets, run *stream.RunRecord, man *stream.Manifest, settings int,
	decide func(r *stream.ShardRecord, sh stream.Shard) (requeueAction, string)) (requeued, error) {
	var res requeued
	keys, err := b.KeysMatching(ctx, b.Shards, run.Name+".*")
	if err != nil {
		return res, fmt.Errorf("requeue %s: %w", run.Name, err)
	}
	byID := map[string]stream.Shard{}
	for _, sh := range man.Shards {
		byID[sh.ID] = sh
	}
	rounds := map[int][]stream.Shard{}
	type inRound struct {
		sh    stream.Shard
		round int
	}
	var again []inRound // to publish again where the queue lacks them
	total := 0
	for _, key := range keys {
		r, sh, action, reason, err := requeueOne(ctx, b, run, key, byID, decide)
		if err != nil {
			return res, err
		}
		if action == keep {
			continue
		}
		if action == republish {
			again = append(again, inRound{sh, r.Retry})
		} else {
			rounds[r.Retry] = append(rounds[r.Retry], sh)
		}
		if len(res.why) < 10 {
			res.why = append(res.why, fmt.Sprintf("%s (%s)", r.ID, reason))
		}
		total++
	}
	if len(again) > 0 {
		// A shard to publish again may have its message queued still (a
		// retry that did publish, still waiting for a worker, or another
		// submission's at this moment). Past the duplicate window a second
		// message of its round would be taken: publish only the missing.
		s, info, err := runQueue(ctx, js, run)
		if err != nil {
			return res, fmt.Errorf("requeue %s: %w", run.Name, err)
		}
		queued, err := queuedRounds(ctx, s, run, info)
		if err != nil {
			return res, fmt.Errorf("requeue %s: %w", run.Name, err)
		}
		for _, a := range again {
			if q, ok := queued[a.sh.ID]; ok && q >= a.round {
				res.already++
				continue
			}
			rounds[a.round] = append(rounds[a.round], a.sh)
		}
	}
	// The retry round is part of the Msg-ID, so a requeued shard is never
	// taken for a duplicate of an earlier round.
	for round, todo := range rounds {
		n, err := publish(ctx, js, run.Fingerprint, run.Name, todo, round, settings)
		if err != nil {
			return res, fmt.Errorf("requeue %s: %w", run.Name, err)
		}
		res.n += n
		res.already += len(todo) - n
	}
	if total > 0 {
		if err := stream.Barrier(ctx, js.Conn()); err != nil {
			return res, fmt.Errorf("requeue %s: %w", run.Name, err)
		}
	}
	return res, nil
}

// requeued is what requeue did: n shards put on the queue, already found
// there (published by another submission, at the same time or earlier),
// and the reasons of the first ten it decided on.
type requeued struct {
	n, already int
	why        []string
}

// requeueOne decides on the shard record at key and, for a reset, writes
// it pending in its next retry round. A record written in between (a
// worker, or another submission requeueing the same run at once) is read
// and decided on again.
func requeueOne(ctx context.Context, b *stream.Buckets, run *stream.RunRecord, key string, byID map[string]stream.Shard,
	decide func(r *stream.ShardRecord, sh stream.Shard) (requeueAction, string)) (stream.ShardRecord, stream.Shard, requeueAction, string, error) {
	for tries := 1; ; tries++ {
		var r stream.ShardRecord
		e, err := b.Shards.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return r, stream.Shard{}, keep, "", nil // a deleted record the listing still counts
		}
		if err != nil {
			return r, stream.Shard{}, keep, "", fmt.Errorf("requeue %s: %w", key, err)
		}
		if err := stream.Decode(e.Value(), &r); err != nil || r.Fingerprint != run.Fingerprint {
			return r, stream.Shard{}, keep, "", nil
		}
		sh, ok := byID[r.ID]
		if !ok {
			return r, sh, keep, "", nil
		}
		action, reason := decide(&r, sh)
		if action != reset {
			return r, sh, action, reason, nil
		}
		r.State, r.Retry, r.Reason, r.Owner, r.Output, r.Updated = stream.ShardPending, r.Retry+1, reason, nil, nil, time.Now().UTC()
		// The new round is a new message with deliveries of its own.
		r.Deferred, r.Interrupted = 0, 0
		data, _ := stream.Encode(&r)
		_, err = b.Shards.Update(ctx, key, data, e.Revision())
		if err == nil {
			return r, sh, action, reason, nil
		}
		if !stream.IsConflict(err) || tries == 5 {
			return r, sh, keep, "", fmt.Errorf("requeue shard %s: %w", r.ID, err)
		}
	}
}

// retryFailed requeues the run's failed shards in a new retry round, and
// publishes again the shards an interrupted retry left pending.
func retryFailed(ctx context.Context, js jetstream.JetStream, b *stream.Buckets, run *stream.RunRecord, man *stream.Manifest, settings int) (requeued, error) {
	res, err := requeue(ctx, js, b, run, man, settings, func(r *stream.ShardRecord, _ stream.Shard) (requeueAction, string) {
		switch {
		case r.State == stream.ShardFailed:
			return reset, "retry requested"
		case r.State == stream.ShardPending && r.Retry > 0:
			return republish, "an earlier retry may have stopped before publishing it"
		}
		return keep, ""
	})
	if err == nil && res.n == 0 && res.already == 0 {
		err = fmt.Errorf("retry %s: %w", run.Name, ErrNothingToRetry)
	}
	return res, err
}

// redoUnverified checks the committed output of every validated shard of
// a COMPLETE run at the destination (marker, file list checksum, names and
// sizes) and requeues each shard whose output is missing or fails, or was
// made from inputs that have changed since (checkpoint.InputsStamp): a run
// is not COMPLETE because its record says so once someone has deleted or
// damaged an output, or rewritten an input. A damaged output is kept aside
// by the commit that replaces it.
func redoUnverified(ctx context.Context, js jetstream.JetStream, b *stream.Buckets, run *stream.RunRecord, man *stream.Manifest, settings int) (requeued, error) {
	return requeue(ctx, js, b, run, man, settings, func(r *stream.ShardRecord, sh stream.Shard) (requeueAction, string) {
		if r.State != stream.ShardValidated {
			return keep, ""
		}
		dir := filepath.Join(run.Spec.Output, r.ID)
		mk, err := checkpoint.VerifyCommitted(dir, run.Fingerprint, false)
		if err != nil {
			if _, serr := os.Lstat(dir); errors.Is(serr, fs.ErrNotExist) {
				// Deleted, not damaged: "no COMPLETE marker" read as a
				// commit cut short.
				return reset, "output missing: " + dir + " is not there"
			}
			return reset, "output failed verification: " + err.Error()
		}
		if mk.InputsChanged(sh.Inputs) {
			return reset, "an input changed since the output was made (size or modification time of " + inputNames(sh.Inputs) + ")"
		}
		return keep, ""
	})
}

// restoreLost publishes again each unfinished shard of a queued run whose
// message is no longer in the stream. Every shard that is neither
// validated nor failed has one there (queued, or delivered and not yet
// acknowledged), unless the store lost it: nats-server rebuilding a stream
// after its file system filled up was seen to come back without the
// run's messages, leaving shards pending that nothing would ever deliver.
// The check costs one stream info request; only when the run has fewer
// messages than unfinished shards are the messages read (their IDs) and
// then the records, in that order, so that a shard finished in between is
// seen finished rather than missing.
func restoreLost(ctx context.Context, js jetstream.JetStream, b *stream.Buckets, run *stream.RunRecord, man *stream.Manifest, settings int) (int, error) {
	s, info, err := runQueue(ctx, js, run)
	if err != nil {
		return 0, fmt.Errorf("check queued shards of %s: %w", run.Name, err)
	}
	var queued uint64
	for _, n := range info.State.Subjects {
		queued += n
	}
	if unfinished := len(man.Shards) - run.Counts.Validated - run.Counts.Failed; queued >= uint64(max(unfinished, 0)) {
		return 0, nil
	}
	have, err := queuedRounds(ctx, s, run, info)
	if err != nil {
		return 0, err
	}
	rounds := map[int][]stream.Shard{}
	n := 0
	for _, sh := range man.Shards {
		round := 0
		e, err := b.Shards.Get(ctx, stream.ShardKey(run.Name, sh.ID))
		if err == nil {
			var r stream.ShardRecord
			if stream.Decode(e.Value(), &r) == nil && r.Fingerprint == run.Fingerprint {
				if r.State == stream.ShardValidated || r.State == stream.ShardFailed {
					continue
				}
				round = r.Retry
			}
		} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return 0, fmt.Errorf("check shard %s: %w", sh.ID, err)
		}
		if r, ok := have[sh.ID]; ok && r >= round {
			continue
		}
		rounds[round] = append(rounds[round], sh)
		n++
	}
	suffix := fmt.Sprintf(".restored.%d", time.Now().UnixNano())
	for round, todo := range rounds {
		if _, err := publishAs(ctx, js, run.Fingerprint, run.Name, todo, round, settings, suffix); err != nil {
			return 0, fmt.Errorf("restore lost shards of %s: %w", run.Name, err)
		}
	}
	if n > 0 {
		if err := stream.Barrier(ctx, js.Conn()); err != nil {
			return 0, fmt.Errorf("restore lost shards of %s: %w", run.Name, err)
		}
	}
	return n, nil
}

// runQueue is the shards stream and its state for the run's subjects.
func runQueue(ctx context.Context, js jetstream.JetStream, run *stream.RunRecord) (jetstream.Stream, *jetstream.StreamInfo, error) {
	s, err := js.Stream(ctx, stream.StreamShards)
	if err != nil {
		return nil, nil, err
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(stream.RunSubjects(run.Name)))
	if err != nil {
		return nil, nil, err
	}
	return s, info, nil
}

// queuedRounds reads the run's queued messages (info is the stream's, for
// the run's subjects) and returns, per shard id, the highest retry round
// that has a message there: one request per message, so it is read only
// where a message may be missing. A message delivered and not yet
// acknowledged is still there (work-queue retention).
func queuedRounds(ctx context.Context, s jetstream.Stream, run *stream.RunRecord, info *jetstream.StreamInfo) (map[string]int, error) {
	filter := stream.RunSubjects(run.Name)
	have := map[string]int{} // shard id -> highest retry round queued
	for seq := info.State.FirstSeq; seq > 0 && seq <= info.State.LastSeq; {
		m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(filter))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read queued shards of %s: %w", run.Name, err)
		}
		var sm stream.ShardMsg
		if stream.Decode(m.Data, &sm) == nil && sm.Fingerprint == run.Fingerprint {
			if r, ok := have[sm.ID]; !ok || sm.Retry > r {
				have[sm.ID] = sm.Retry
			}
		}
		seq = m.Sequence + 1
	}
	return have, nil
}

// inputNames names a shard's inputs for a reason: the first three, and how
// many more.
func inputNames(paths []string) string { return joinFirst(paths, 3) }

// joinFirst joins the first most of names as they are ordered, and says
// how many more there are.
func joinFirst(names []string, most int) string {
	if len(names) <= most {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:most], ", "), len(names)-most)
}
