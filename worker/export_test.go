package worker

import (
	"os"

	"github.com/shardpool/shardpool/stream"
)

// ScratchHeld is how many of class's shards in flight count as holding
// what they need of the scratch (scratchadmit.go): for tests, which check
// that every count ends with its shard.
func (w *Worker) ScratchHeld(class string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.scratchHeld[class]
}

// HoldGPUsInLedger writes a record in the host ledger in dir, of this
// process as a worker named name whose shards hold the GPUs uuids, until
// release: for tests of what reads the ledger.
func HoldGPUsInLedger(dir, name string, uuids ...string) (release func(), err error) {
	pid := os.Getpid()
	l, err := openLedger(dir, "/proc", ledgerRec{Host: "h", Boot: stream.BootID("/proc"), PIDNS: stream.PIDNamespace(), PID: pid,
		Start: processStart("/proc", pid), Name: name})
	if err != nil {
		return nil, err
	}
	if _, err := l.begin(""); err != nil {
		l.close()
		return nil, err
	}
	if err := l.commit(Hold{GPUs: uuids}); err != nil {
		l.close()
		return nil, err
	}
	return l.close, nil
}
