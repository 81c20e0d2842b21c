package worker

import (
	"fmt"
	"sync"

	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker/probe"
)

// Scratch in admission. A class that declares scratch is fetched only as
// many at a time as the scratch ledger (the stager's) has room for beside
// what running shards hold. Before, every free slot fetched one, and a
// shard without room waited in its slot, its lease renewed, for a running
// one to end: on one host the same wait, but a shard that another host
// could have run at once was held here.
//
// Staged inputs are not in the count: their sizes are known only once a
// shard is fetched. The ledger still makes a staged shard wait at run
// time where its inputs do not fit.

// scratchFit caps k, the shards of class admission would fetch now, to
// the room in the scratch ledger: whole shards of the class's declared
// scratch, less those of its shards in flight that hold no reservation
// yet (fetched or being fetched; holdScratch counts those that do). It
// returns k unchanged and "" where scratch did not bind, otherwise the
// cap and why.
func (w *Worker) scratchFit(class string, inflight, k int) (int, string) {
	needs, holding := w.scratchState(class)
	if len(needs) == 0 || k <= 0 {
		return k, ""
	}
	room, free, unwritten, err := w.hostStager().Room()
	if err != nil {
		return 0, fmt.Sprintf("scratch free space unknown (%v): fetching none of class %s", err, class)
	}
	// The largest that can fit at all: a run whose class declares more
	// than the whole file system holds is left out, as no wait makes
	// room for it; its attempts fail at once with the numbers
	// (reserveScratch), and submit blocks such a class where it knows
	// the workers' scratch.
	var need int64
	total, terr := w.scratchTotal()
	for _, n := range needs {
		if terr != nil || n <= total {
			need = max(need, n)
		}
	}
	if need == 0 {
		return k, ""
	}
	pending := max(inflight-holding, 0)
	fits := int(max(room, 0)/need) - pending
	if fits >= k {
		return k, ""
	}
	fits = max(fits, 0)
	why := fmt.Sprintf("scratch at %s has room for %d more shard(s) declaring %s: %s free, %s reserved by running shards and not yet written",
		w.cfg.Scratch, fits, stream.FormatSize(need), stream.FormatSize(free), stream.FormatSize(unwritten))
	if pending > 0 {
		why += fmt.Sprintf(", %d fetched not yet reserved", pending)
	}
	return fits, why
}

// scratchTotal is the size of the scratch directory's file system.
func (w *Worker) scratchTotal() (int64, error) {
	st, err := (probe.SysStatFS{}).Statfs(w.cfg.Scratch)
	return st.Total(), err
}

// scratchState is class's declared scratch in each active run that
// declares one, and how many of its shards in flight hold their
// reservation now.
func (w *Worker) scratchState(class string) (needs []int64, holding int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.scratchNeed[class], w.scratchHeld[class]
}

// holdScratch counts a's shard, in its slot, as holding its reservation
// in the scratch ledger, until the returned function or a.free, whichever
// comes first: the reservation may outlast the slot (an attempt concludes
// aside) but is then no longer among the class's in flight. The count
// ends first: for a moment the shard counts both as in flight without a
// reservation and by its reservation, never as room it does not have.
func (w *Worker) holdScratch(class string, a *attemptState) (unhold func()) {
	w.mu.Lock()
	if w.scratchHeld == nil {
		w.scratchHeld = map[string]int{}
	}
	w.scratchHeld[class]++
	w.mu.Unlock()
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
