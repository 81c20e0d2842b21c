package stream

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// FSSync is a group commit of syncfs(2) for one file system, shared by
// everything in this process that needs that file system durable: the
// coordinator's store and a worker's outputs, in `shardpool run` often on
// one disk. A syncfs of any file there flushes all of the file system, so
// one call serves every caller. Before, each had its own syncfs stream,
// and the disk flushed for each. Callers say how long a run may wait for
// others (Do's gather); a run starts once the first of them is due.
type FSSync struct {
	dev  uint64
	f    *os.File
	g    Group
	refs int // under fsSyncs.mu
	// flush is a moving average of how long a syncfs took, in ns.
	flush atomic.Int64
}

var fsSyncs struct {
	mu sync.Mutex
	m  map[uint64]*FSSync
}

// OpenFSSync returns the FSSync of the file system that holds dir, the
// same for every caller on that file system (st_dev) until each has closed
// it.
func OpenFSSync(dir string) (*FSSync, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("stat %s: %w", dir, err)
	}
	fsSyncs.mu.Lock()
	defer fsSyncs.mu.Unlock()
	if s := fsSyncs.m[st.Dev]; s != nil {
		s.refs++
		f.Close()
		return s, nil
	}
	s := &FSSync{dev: st.Dev, f: f, refs: 1}
	s.g.Fn = func() error {
		start := time.Now()
		if err := unix.Syncfs(int(s.f.Fd())); err != nil {
			return fmt.Errorf("syncfs of the file system of %s: %w", s.f.Name(), err)
		}
		d := int64(time.Since(start))
		if old := s.flush.Load(); old > 0 {
			d = old + (d-old)/8
		}
		s.flush.Store(d) // one loop runs Fn at a time
		return nil
	}
	if fsSyncs.m == nil {
		fsSyncs.m = make(map[uint64]*FSSync)
	}
	fsSyncs.m[st.Dev] = s
	return s, nil
}

// Do waits for a syncfs that began after the call, letting it wait up to
// gather for other callers.
func (s *FSSync) Do(ctx context.Context, gather time.Duration) error {
	return s.g.DoWithin(ctx, gather)
}

// Gather is how long a caller that may wait between least and most lets
// a syncfs wait for others: per times a syncfs takes here, on average
// of the last few. Waiting pays where a flush is dear (a slow disk,
// where it took 2.8 ms at the median and a wait of 10 ms gained a
// third), and only costs latency where it is cheap.
func (s *FSSync) Gather(per int, least, most time.Duration) time.Duration {
	return min(max(time.Duration(per)*time.Duration(s.flush.Load()), least), most)
}

// Go is Do without waiting: done gets the error of a syncfs that began
// after the call. done must not block.
func (s *FSSync) Go(gather time.Duration, done func(error)) {
	s.g.GoWithin(gather, done)
}

// Close gives up this caller's share; the last one closes the file.
func (s *FSSync) Close() {
	fsSyncs.mu.Lock()
	s.refs--
	last := s.refs == 0
	if last && fsSyncs.m[s.dev] == s {
		delete(fsSyncs.m, s.dev)
	}
	fsSyncs.mu.Unlock()
	if last {
		s.f.Close()
	}
}
