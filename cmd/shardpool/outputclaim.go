package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker"
)

// claimOutput holds, for as long as this `run` lives, an exclusive flock
// on <output>/.shardpool/run-<name>.lock, whose content says who holds it.
//
// The store's lock keeps one run from being run twice from one state
// directory. From two (the default one and a --data, or two terminals
// with different --data), each run has its own store and queue, and each
// would run almost every shard: an output is committed once, but the
// work is done twice. The claim is the run's name in its output
// directory, which both see; other runs into the same directory (another
// name) are not held back.
//
// A directory where the lock cannot be made or taken (read-only outputs
// of a COMPLETE run, a file system without locks) is warned about and the
// run goes on: the claim saves work, it does not guard results (the
// commit's marker does).
func claimOutput(spec *stream.Spec, data string, stderr io.Writer) (release func(), err error) {
	path := filepath.Join(spec.Output, worker.MetaDir, "run-"+spec.Name+".lock")
	noop := func() {}
	// Where nothing can be written (read-only outputs: `run` has warned
	// already) there is nothing to claim.
	unclaimed := func(err error) (func(), error) {
		if !errors.Is(err, unix.EROFS) && !errors.Is(err, unix.EACCES) {
			fmt.Fprintf(stderr, "warning: cannot claim the output directory for run %s: %v; a run of it from another state directory at the same time would not be told apart\n", spec.Name, err)
		}
		return noop, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return unclaimed(err)
	}
	for tries := 1; ; tries++ {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return unclaimed(err)
		}
		release, err := lockClaim(f, spec, path, data)
		if errors.Is(err, errNoLocks) {
			return unclaimed(err)
		}
		if !errors.Is(err, errClaimRemoved) {
			return release, err
		}
		if tries == 5 {
			return unclaimed(fmt.Errorf("%s is removed each time it is locked", path))
		}
	}
}

// errNoLocks: the file system refused the lock (one without locks, or
// NFS without its lock service).
var errNoLocks = errors.New("the file system takes no lock here")

// errClaimRemoved: the lock file was taken after its holder removed it on
// its way out; a lock on it holds nothing, so the file is opened again.
var errClaimRemoved = errors.New("claim removed by its holder")

// lockClaim takes the flock of f, opened at path, and says who holds it;
// on an error it has closed f and returns no release.
// Its release removes the file before it lets go of the lock. The
// directory it was in stays (empty, unless checkpoints or packs are
// there): removed, it could vanish under a worker of another run making
// its first checkpoint directory in it.
func lockClaim(f *os.File, spec *stream.Spec, path, data string) (func(), error) {
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("%w: lock %s: %w", errNoLocks, path, err)
		}
		// The holder writes its line right after it takes the lock: a
		// look in between may find the file empty.
		var holder string
		for range 10 {
			b, _ := io.ReadAll(io.LimitReader(f, 4096))
			if holder = strings.TrimSpace(string(b)); holder != "" {
				break
			}
			time.Sleep(20 * time.Millisecond)
			f.Seek(0, io.SeekStart)
		}
		f.Close()
		return nil, claimedErr(spec, path, holder)
	}
	var held, named unix.Stat_t
	if unix.Fstat(int(f.Fd()), &held) != nil || unix.Stat(path, &named) != nil || held.Ino != named.Ino || held.Dev != named.Dev {
		f.Close()
		return nil, errClaimRemoved
	}
	host, _ := os.Hostname()
	line := fmt.Sprintf("pid %d on %s since %s, state directory %s\n", os.Getpid(), host, time.Now().UTC().Format(time.RFC3339), data)
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(line), 0)
	}
	return func() {
		os.Remove(path)
		f.Close()
	}, nil
}

// claimedErr says that another `run` of the same name writes into the
// same output directory, and how to follow it instead.
func claimedErr(spec *stream.Spec, path, holder string) error {
	follow := ""
	if _, dir, ok := strings.Cut(holder, ", state directory "); ok {
		follow = fmt.Sprintf("; to follow it: shardpool status --data %s %s", shellQuote(dir), spec.Name)
	}
	if holder == "" {
		holder = "a process that has not said which (" + path + ")"
	}
	return exitErr{code: exitFailure, msg: fmt.Sprintf("run %s is running already into %s, held by %s: a second run of it from another state directory would run its shards again. "+
		"Wait for it to end (its outputs are then skipped here), or stop it%s", spec.Name, spec.Output, holder, follow)}
}
