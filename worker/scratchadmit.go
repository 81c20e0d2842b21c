package worker

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker/probe"
)

// Scratch in admission. A class that declares scratch, or stages its
// inputs, is fetched only as many at a time as the scratch ledger (the
// stager's) has room for beside what running shards hold. Before, every
// free slot fetched one, and a shard without room waited in its slot,
// its lease renewed, for a running one to end: on one host the same
// wait, but a shard that another host could have run at once was held
// here.
//
// A shard's staged inputs are known only once it is fetched: admission
// counts, for each run and class, the median of what its latest staged
// shards needed for their inputs (stagedWindow of them: inputs not yet
// staged here, a pack's unpacked copy). Inputs already staged count for
// nothing, so a model every shard reads is counted while it is copied
// once, not for every shard. Before a run's first shard is staged, or
// where a shard needs more than the median, the ledger still makes it
// wait in its slot at run time.

// stagedWindow is how many of a run's latest staged shards of a class
// the estimate of the next one's inputs is taken from.
const stagedWindow = 16

// scratchDecl is what an active run needs of the scratch for each shard
// of a class: its declared scratch and, where it stages its inputs, its
// key in stagedSeen.
type scratchDecl struct {
	run      string
	declared int64
	staged   string
}

// declOf is run r's scratchDecl for class c.
func declOf(r stream.RunRecord, c string) scratchDecl {
	d := scratchDecl{run: r.Name, declared: r.Spec.Classes[c].Scratch}
	if r.Spec.StageFor(c) {
		d.staged = stagedKey(r.Name, r.Fingerprint, c)
	}
	return d
}

func stagedKey(run, fingerprint, class string) string {
	return run + "/" + fingerprint + "/" + class
}

// noteStaged records what a shard of run and class needs for its inputs
// (Stager.InputNeed) before it reserves it.
func (w *Worker) noteStaged(run, fingerprint, class string, need int64) {
	k := stagedKey(run, fingerprint, class)
	w.mu.Lock()
	if w.stagedSeen == nil {
		w.stagedSeen = map[string][]int64{}
	}
	first := len(w.stagedSeen[k]) == 0
	seen := append(w.stagedSeen[k], need)
	if len(seen) > stagedWindow {
		seen = seen[len(seen)-stagedWindow:]
	}
	w.stagedSeen[k] = seen
	w.mu.Unlock()
	if first {
		// Fetched one at a time until now (scratchFit): look again.
		w.wakeAll()
	}
}

// pruneStagedLocked forgets what the shards of runs no longer active
// staged, under mu.
func (w *Worker) pruneStagedLocked() {
	active := map[string]bool{}
	for _, ds := range w.scratchNeed {
		for _, d := range ds {
			active[d.staged] = true
		}
	}
	for k := range w.stagedSeen {
		if !active[k] {
			delete(w.stagedSeen, k)
		}
	}
}

// stagedEstimate is the median of the staged needs seen, and how many
// were seen; 0, 0 where none was.
func stagedEstimate(seen []int64) (int64, int) {
	if len(seen) == 0 {
		return 0, 0
	}
	s := slices.Clone(seen)
	slices.Sort(s)
	return s[len(s)/2], len(s)
}

// scratchFit caps k, the shards of class admission would fetch now, to
// the room in the scratch ledger: whole shards of what the class needs
// (declared scratch and the estimate of staged inputs), less those of
// its shards in flight that hold no reservation yet (fetched or being
// fetched; holdScratch counts those that do). While an active run that
// stages has had none of its shards staged here, there is no estimate:
// one such shard is fetched at a time until one is. It returns k
// unchanged and "" where scratch did not bind, otherwise the cap and
// why.
func (w *Worker) scratchFit(class string, inflight, k int) (int, string) {
	needs, holding := w.scratchState(class)
	if len(needs) == 0 || k <= 0 {
		return k, ""
	}
	pending := max(inflight-holding, 0)
	var notes []string
	// The largest that can fit at all: a run whose class declares more
	// than the whole file system holds is left out, as no wait makes
	// room for it; its attempts fail at once with the numbers
	// (reserveScratch), and submit blocks such a class where it knows
	// the workers' scratch. A shard whose inputs alone are larger fails
	// its staging the same way.
	var need, declared, staged int64
	var stagedOf int
	var unseen string
	total, terr := w.scratchTotal()
	for _, d := range needs {
		if d.staged != "" && d.seen == 0 && unseen == "" {
			unseen = d.run
		}
		if sum := d.declared + d.est; sum > need && (terr != nil || sum <= total) {
			need, declared, staged, stagedOf = sum, d.declared, d.est, d.seen
		}
	}
	if need > 0 {
		room, free, unwritten, err := w.hostStager().Room()
		if err != nil {
			return 0, fmt.Sprintf("scratch free space unknown (%v): fetching none of class %s", err, class)
		}
		if fits := int(max(room, 0)/need) - pending; fits < k {
			k = max(fits, 0)
			what := "declaring " + stream.FormatSize(need)
			if staged > 0 {
				what = fmt.Sprintf("needing %s (%s declared, %s of inputs to stage: the median of the last %d staged)",
					stream.FormatSize(need), stream.FormatSize(declared), stream.FormatSize(staged), stagedOf)
			}
			why := fmt.Sprintf("scratch at %s has room for %d more shard(s) %s: %s free, %s reserved by running shards and not yet written",
				w.cfg.Scratch, k, what, stream.FormatSize(free), stream.FormatSize(unwritten))
			if pending > 0 {
				why += fmt.Sprintf(", %d fetched not yet reserved", pending)
			}
			notes = append(notes, why)
		}
	}
	if unseen != "" && k > 1-pending {
		k = max(1-pending, 0)
		notes = append(notes, fmt.Sprintf("run %s stages its inputs and none of its shards has been staged here yet: one fetched at a time until one is", unseen))
	}
	return k, strings.Join(notes, "; ")
}

// scratchTotal is the size of the scratch directory's file system.
func (w *Worker) scratchTotal() (int64, error) {
	st, err := (probe.SysStatFS{}).Statfs(w.cfg.Scratch)
	return st.Total(), err
}

// scratchNow is what an active run needs of the scratch for a shard of
// a class now: its declaration, and the estimate of its staged inputs
// from the seen shards staged here (0, 0 before the first).
type scratchNow struct {
	scratchDecl
	est  int64
	seen int
}

// scratchState is what each active run with class needs of the scratch
// now, and how many of the class's shards in flight hold their
// reservation.
func (w *Worker) scratchState(class string) (needs []scratchNow, holding int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, d := range w.scratchNeed[class] {
		est, n := stagedEstimate(w.stagedSeen[d.staged])
		needs = append(needs, scratchNow{d, est, n})
	}
	return needs, w.scratchHeld[class]
}

// holdScratch counts a's shard, in its slot, as holding its reservation
// in the scratch ledger, until the returned function or a.free, whichever
// comes first: the reservation may outlast the slot (an attempt concludes
// aside) but is then no longer among the class's in flight. The count
// ends first: for a moment the shard counts both as in flight without a
// reservation and by its reservation, never as room it does not have.
func (w *Worker) holdScratch(class string, a *attemptState) (unhold func()) {
	w.mu.Lock()
	w.countHeldLocked(class)
	w.mu.Unlock()
	// No longer among those fetched without a reservation: fetch loops
	// that admission held back for them look again (scratchFit).
	w.wakeAll()
	return w.unholdWith(class, a)
}

// holdNoScratch counts a's shard, of a run whose class needs no scratch,
// as holding what it needs of it until the returned function or a.free,
// whichever comes first (a slot can also be freed without a.free, once
// the attempt has ended). Counted as fetched without a reservation, it
// held back the shards of the class's runs that do need scratch while it
// ran, and a run that stages and has not been staged here yet (one fetch
// at a time) held the whole class to one. Counted whether or not such a
// run is active yet: one may come while the shard runs. Called on every
// such shard, so it wakes no fetch loop.
func (w *Worker) holdNoScratch(class string, a *attemptState) (unhold func()) {
	w.mu.Lock()
	w.countHeldLocked(class)
	w.mu.Unlock()
	return w.unholdWith(class, a)
}

func (w *Worker) countHeldLocked(class string) {
	if w.scratchHeld == nil {
		w.scratchHeld = map[string]int{}
	}
	w.scratchHeld[class]++
}

// unholdWith returns the function that ends a count of class's held
// shards, once, and makes a.free call it first.
func (w *Worker) unholdWith(class string, a *attemptState) (unhold func()) {
	var once sync.Once
	unhold = func() {
		once.Do(func() {
			w.mu.Lock()
			w.scratchHeld[class]--
			w.mu.Unlock()
		})
	}
	free := a.free
	a.free = func() { unhold(); free() }
	return unhold
}
