package staging

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Copies and bandwidth are bounded for the host, not only for one
// process. Until the sixty-eighth session Concurrency and BytesPerSec
// held for each stager alone, though their flags said "on this host":
// two `shardpool run`s of one user, or a `shardpool worker` and a
// `shardpool stage`, each copied at the whole bound, twice what the user
// gave the file server. Now the stagers that share a host directory
// (Config.HostDir: the workers' host ledger directory, per user) share
// both:
//
//   - a copy holds one byte of <HostDir>/.copies (an open file
//     description lock, as useLocks): byte i for slot i, of slots 0 to
//     Concurrency-1. A stager whose slots are all held by others' copies
//     waits for one, so copies on the host stay within the largest
//     Concurrency among them;
//   - each stager copies at BytesPerSec times its own share of the
//     copies under way on the host (its own, over all the bytes held),
//     looked at again every shareEvery while it copies: together they
//     stay within the largest BytesPerSec among them.
//
// Where the file cannot be opened or locked (a file system without such
// locks), each stager keeps its bounds to itself, as before.

const (
	copiesName = ".copies"
	// copiesScan is how many slots a look at the others' copies counts:
	// the copies of a --stage-concurrency above it are not seen.
	copiesScan = 1024
	shareEvery = 250 * time.Millisecond
)

// hostCopies are a stager's slots among the host's copies.
type hostCopies struct {
	path string
	n    int // slots 0..n-1 are this stager's to take

	mu    sync.Mutex
	tried bool
	f     *os.File // nil before the first copy, or where it cannot be opened
	mine  []bool   // the slots this stager's copies hold
}

func newHostCopies(dir string, n int) *hostCopies {
	return &hostCopies{path: filepath.Join(dir, copiesName), n: n, mine: make([]bool, n)}
}

// file opens the slots' file at the first copy; under h.mu.
func (h *hostCopies) file() *os.File {
	if !h.tried {
		h.tried = true
		if f, err := os.OpenFile(h.path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600); err == nil {
			h.f = f
		}
	}
	return h.f
}

// take holds a slot for one copy until the returned release, waiting
// while other processes' copies hold every slot (waiting, when set, is
// called once as the wait begins). Its error is ctx's.
func (h *hostCopies) take(ctx context.Context, waiting func()) (release func(), err error) {
	slot := -1
	tries := 0
	err = pollLock(ctx, func() bool {
		if tries++; tries == 2 && waiting != nil {
			waiting()
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		f := h.file()
		for i := range h.n {
			if h.mine[i] {
				continue
			}
			err := error(nil)
			if f != nil {
				err = setRange(f, unix.F_WRLCK, int64(i))
			}
			if busy(err) {
				continue
			}
			// Taken; or no lock to be had there: the slot is this
			// process's alone, as the stager's own bound already is.
			h.mine[i], slot = true, i
			return false
		}
		return true
	})
	if err != nil {
		return nil, err
	}
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.f != nil {
			setRange(h.f, unix.F_UNLCK, int64(slot))
		}
		h.mine[slot] = false
	}, nil
}

// share is the part of the host's copies under way that are this
// stager's: 1 alone, or where the others cannot be seen.
func (h *hostCopies) share() float64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	own := 0
	for _, m := range h.mine {
		if m {
			own++
		}
	}
	if h.f == nil || own == 0 {
		return 1
	}
	others := 0
	for start := int64(0); start < copiesScan; {
		lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart, Start: start, Len: copiesScan - start}
		if unix.FcntlFlock(h.f.Fd(), unix.F_OFD_GETLK, &lk) != nil || lk.Type == unix.F_UNLCK || lk.Len <= 0 {
			break
		}
		// Adjacent bytes of one other process come back as one range.
		end := min(lk.Start+lk.Len, copiesScan)
		others += int(end - lk.Start)
		start = end
	}
	return float64(own) / float64(own+others)
}

// close lets go of every slot (the stager's Close).
func (h *hostCopies) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.f != nil {
		h.f.Close()
		h.f = nil
	}
}
