package worker

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cespare/xxhash/v2"
	"golang.org/x/sys/unix"

	"github.com/shardpool/shardpool/worker/probe"
)

// Adoption: what a command leaves running outside its process group (a
// process that called setsid, as a daemon does) escapes the SIGKILL to the
// group when the command ends. Where the shard has a cgroup of its own,
// killLeft finds it there. Elsewhere the worker makes itself its
// commands' subreaper (PR_SET_CHILD_SUBREAPER): such a process, once its
// parent has exited, becomes a child of the worker's main thread instead
// of init's, and its environment still names the attempt that started it
// (SHARDPOOL_RUN, SHARDPOOL_SHARD_ID, SHARDPOOL_FINGERPRINT,
// SHARDPOOL_ATTEMPT). When an attempt's command ends, the worker reads
// its main thread's children and kills those of that attempt; a sweep
// every adoptSweep kills any of attempts that ended since, and reaps
// every adopted child that has exited.
//
// Being a subreaper makes the worker the parent of every orphan of its
// commands, and an exited child stays a zombie until its parent waits for
// it; but the worker must never wait for a child that os/exec waits for
// (its Wait would then fail). So the state is process-wide (several
// workers may share a process) and:
//   - a command's pid is in commands from before anyone can see it (the
//     start holds starting for reading until the pid is recorded) until
//     os/exec has waited for it; a sweep holds starting for writing;
//   - only a child outside commands is waited for, only once it has
//     exited, and never one in this process's own process group, which
//     is where any other child of the worker runs (git, scontrol): a
//     command runs in a group of its own, and its descendants cannot
//     join the worker's;
//   - only a live child whose environment names an attempt that has
//     ended in this process, and none running, is killed.
//
// A process that cleared its environment is not recognised and runs on
// (it is still reaped when it exits); so does one that becomes the
// worker's child more than adoptKeep after its attempt ended. What the
// attempts of a worker killed with SIGKILL leave is the reaping worker's
// (killStrays).
type adopter struct {
	starting sync.RWMutex // read: a command starting; write: a sweep

	// children is /proc/self/task/<pid>/children, kept open: reading it
	// again from offset 0 costs a tenth of opening it (a sweep per
	// attempt); list is its last content. Under starting's write lock.
	children int
	list     []byte

	mu       sync.Mutex
	commands map[int]bool   // pids os/exec waits for
	active   map[uint64]int // attempts with a command running, by identity
	// ended holds the attempts whose last command ended in the last
	// adoptKeep, and endedAt the same in the order they ended: a worker
	// of short shards ends thousands a minute.
	ended   map[uint64]bool
	endedAt []endedAttempt
	killed  map[int]bool // pids killed here, not yet reaped
	// found holds what a sweep killed of an attempt whose end is under
	// way (ending) but is not the sweep's own, for that end to report:
	// sweeps run one at a time, and another attempt's may come first.
	// What a sweep kills of an attempt that has finished ending goes to
	// late.
	ending map[uint64]bool
	// dying are the process groups of those attempts' commands, just
	// killed: a member still alive is dying, not left outside.
	dying map[int]bool
	found map[uint64][]string
	late  func(msg string)
	pgrp  int
}

type endedAttempt struct {
	ident uint64
	at    time.Time
}

// adoption is the process's adopter, nil until adopt succeeds.
var (
	adoption     *adopter
	adoptionOnce sync.Once
	adoptionWhy  string
)

// Timing of adoption's sweeps.
const (
	adoptSweep = 10 * time.Second // reap what exited; kill what a sweep missed
	adoptKeep  = time.Minute      // how long an ended attempt's processes are looked for
)

// adopt makes this process its commands' subreaper, once; it returns the
// adopter, or nil and why not.
func adopt() (*adopter, string) {
	adoptionOnce.Do(func() {
		path := filepath.Join("/proc/self/task", strconv.Itoa(os.Getpid()), "children")
		children, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			adoptionWhy = fmt.Sprintf("cannot list this process's children (%v): a kernel without CONFIG_PROC_CHILDREN", err)
			return
		}
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			unix.Close(children)
			adoptionWhy = fmt.Sprintf("PR_SET_CHILD_SUBREAPER: %v", err)
			return
		}
		a := &adopter{children: children, list: make([]byte, 4096), commands: map[int]bool{}, active: map[uint64]int{},
			ended: map[uint64]bool{}, killed: map[int]bool{}, ending: map[uint64]bool{}, dying: map[int]bool{}, found: map[uint64][]string{}, pgrp: syscall.Getpgrp()}
		go func() {
			for range time.Tick(adoptSweep) {
				a.sweep(0)
			}
		}()
		adoption = a
	})
	return adoption, adoptionWhy
}

// attemptIdentity is the attempt a child's environment names (a hash of
// its run, shard, fingerprint and attempt), or 0 when it names none.
func attemptIdentity(env []string) uint64 {
	v := attemptVarsOf(env)
	if v.run == "" || v.id == "" {
		return 0
	}
	return max(1, xxhash.Sum64String(v.run+"\x00"+v.id+"\x00"+v.fp+"\x00"+v.attempt))
}

// attemptVars are the variables of a command's environment that name its
// attempt.
type attemptVars struct{ run, id, fp, attempt string }

// attemptVarsOf reads them from an environment (a worker gives each
// variable once: shardEnv).
func attemptVarsOf(env []string) attemptVars {
	var v attemptVars
	for _, kv := range env {
		k, val, _ := strings.Cut(kv, "=")
		switch k {
		case "SHARDPOOL_RUN":
			v.run = val
		case "SHARDPOOL_SHARD_ID":
			v.id = val
		case "SHARDPOOL_FINGERPRINT":
			v.fp = val
		case "SHARDPOOL_ATTEMPT":
			v.attempt = val
		}
	}
	return v
}

// environIdentity is attemptIdentity of a process's environment as it
// was exec'd (shardEnviron); 0 when unreadable or naming no attempt.
func environIdentity(procRoot string, pid int) (ident uint64, midExec bool) {
	vars, midExec := shardEnviron(procRoot, pid)
	return attemptIdentity(vars), midExec
}

// shardEnviron is the SHARDPOOL_ entries of a process's environment as
// it was exec'd (none when unreadable: another user's process, or gone),
// and whether the process is in the middle of an exec: its environment
// and its command line both read empty, between its new memory map and
// the argument and environment tables the kernel then writes into it,
// and a look a moment later finds them (a daemon's `exec sleep` just as
// its command ends: CI saw one such daemon go unnoticed). A process that
// cleared its environment keeps a command line.
func shardEnviron(procRoot string, pid int) (vars []string, midExec bool) {
	dir := filepath.Join(procRoot, strconv.Itoa(pid))
	for range 2 {
		b, err := readAtOnce(filepath.Join(dir, "environ"))
		if err != nil {
			return nil, false
		}
		if len(b) > 0 {
			return shardVarsOf(b), false
		}
		if cl, err := readAtOnce(filepath.Join(dir, "cmdline")); err == nil && len(cl) == 0 {
			// So do a process that has exited (a zombie) and a kernel
			// thread, on kernels that open their environ at all (this
			// one refuses, ESRCH): neither is an exec under way.
			st, err := probe.ReadStat(procRoot, pid)
			return nil, err == nil && st.State != 'Z' && st.State != 'X' && !st.Kernel
		}
		// A command line and no environment: cleared (env -i), or the
		// exec ended between the two reads; read it once more.
	}
	return nil, false
}

// readAtOnce reads a file of /proc/PID whole in one read from its start
// (again with a larger buffer while it fills the buffer). environ and
// cmdline read the memory the process had when the file was opened: of
// several reads, the later ones find nothing once it has exec'd
// meanwhile, and what the first read returned looks whole. os.ReadFile
// reads 512 bytes first, so an environment read across an exec came back
// cut short, its SHARDPOOL_ entries (set last) missing: a daemon that
// exec'd in a loop went unnoticed about once in 60.
func readAtOnce(path string) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	return preadAll(fd, make([]byte, 16<<10))
}

// shardVarsOf are the SHARDPOOL_ entries of an environ file's content.
func shardVarsOf(b []byte) []string {
	var env []string
	for _, kv := range bytes.Split(b, []byte{0}) {
		if bytes.HasPrefix(kv, []byte("SHARDPOOL_")) {
			env = append(env, string(kv))
		}
	}
	return env
}

// start starts a command with cmdStart and records its pid before a sweep
// can see it; ident is the attempt its environment names.
func (a *adopter) start(ident uint64, cmdStart func() (int, error)) error {
	if a == nil {
		_, err := cmdStart()
		return err
	}
	a.starting.RLock()
	defer a.starting.RUnlock()
	a.mu.Lock()
	if ident != 0 {
		a.active[ident]++
	}
	a.mu.Unlock()
	pid, err := cmdStart()
	a.mu.Lock()
	if err == nil {
		a.commands[pid] = true
	} else if ident != 0 {
		a.endLocked(ident)
	}
	a.mu.Unlock()
	return err
}

// waited notes that os/exec has waited for pid.
func (a *adopter) waited(pid int) {
	if a == nil {
		return
	}
	a.mu.Lock()
	delete(a.commands, pid)
	a.mu.Unlock()
}

func (a *adopter) endLocked(ident uint64) {
	if a.active[ident]--; a.active[ident] <= 0 {
		delete(a.active, ident)
		if !a.ended[ident] {
			a.ended[ident] = true
			a.endedAt = append(a.endedAt, endedAttempt{ident, time.Now()})
		}
	}
}

// forgetLocked drops the attempts that ended more than adoptKeep ago.
// The queue's head is cut off, not the rest copied down: every end
// forgets about one attempt once the worker has run a minute, and the
// copy of the minute's queue (about 78,000 attempts of /bin/true) was 6%
// of a long run's CPU. append moves the queue to a new array when it
// outgrows what is left of the old one.
func (a *adopter) forgetLocked(now time.Time) {
	n := 0
	for n < len(a.endedAt) && now.Sub(a.endedAt[n].at) > adoptKeep {
		delete(a.ended, a.endedAt[n].ident)
		n++
	}
	a.endedAt = a.endedAt[n:]
}

// end notes that a command of the attempt has ended (and been waited
// for) and kills what that attempt left among the worker's children:
// what it found, as "comm (pid N)". pgid is the command's group, just
// killed: its members still dying are not counted as left outside it, by
// this sweep or another attempt's.
func (a *adopter) end(ident uint64, pgid int) []string {
	if a == nil || ident == 0 {
		return nil
	}
	a.mu.Lock()
	a.endLocked(ident)
	a.forgetLocked(time.Now())
	a.ending[ident] = true
	a.dying[pgid] = true
	a.mu.Unlock()
	var left []string
	if a.strangers() {
		left = a.sweep(ident)
	}
	a.mu.Lock()
	left = append(a.found[ident], left...)
	delete(a.found, ident)
	delete(a.ending, ident)
	delete(a.dying, pgid)
	a.mu.Unlock()
	return left
}

// strangers reports whether the worker's main thread has a child that
// is none of its running commands: only then can a sweep find anything
// to reap or kill. It reads the list without the starting lock, which a
// sweep waits for while any command starts: at 1,000 short shards a
// second, the end of each attempt waited about 0.4 ms there for another
// slot's fork and exec, its slot held. A command starting meanwhile may
// show as a stranger; its sweep then waits, as before.
func (a *adopter) strangers() bool {
	buf, err := preadAll(a.children, make([]byte, 512))
	if err != nil {
		return true
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, pid := range procList(buf, 0) {
		if !a.commands[pid] {
			return true
		}
	}
	return false
}

// reportLate sets where kills of attempts that had finished ending are
// told (the first worker of the process that adopts).
func (a *adopter) reportLate(f func(msg string)) {
	a.mu.Lock()
	if a.late == nil {
		a.late = f
	}
	a.mu.Unlock()
}

// sweep reaps the adopted children that have exited and kills the live
// ones of attempts that have ended (not members of a group in dying). It
// repeats while what it killed is dying, since what a killed process had
// started becomes the worker's child in turn, or while a child is in the
// middle of an exec (killRounds at most), and returns what it killed of
// the attempt mine.
func (a *adopter) sweep(mine uint64) []string {
	var left, late []string
	for round := range killRounds {
		more := a.sweepOnce(mine, &left, &late)
		if !more || round == killRounds-1 {
			break
		}
		time.Sleep(killPause) // not holding starting: commands start meanwhile
	}
	a.mu.Lock()
	tell := a.late
	a.mu.Unlock()
	if len(late) > 0 && tell != nil {
		tell(fmt.Sprintf("killed %d process(es) that commands which had ended left running outside their process groups: %s", len(late), strings.Join(late, ", ")))
	}
	return left
}

// sweepOnce is one round of sweep; it reports whether to look again: a
// process it killed may still be dying, or a child was in the middle of
// an exec.
func (a *adopter) sweepOnce(mine uint64, left, late *[]string) bool {
	a.starting.Lock()
	defer a.starting.Unlock()
	b, err := a.readChildren()
	if err != nil {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.forgetLocked(time.Now())
	again := false
	for _, pid := range procList(b, 0) {
		if a.commands[pid] {
			continue
		}
		st, err := probe.ReadStat("/proc", pid)
		if err != nil || st.PGrp == a.pgrp {
			continue
		}
		if st.State == 'Z' {
			var ws syscall.WaitStatus
			if got, _ := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil); got == pid {
				delete(a.killed, pid)
			}
			continue
		}
		if a.killed[pid] || a.dying[st.PGrp] {
			// Dying: killed here, or with its command's group just now.
			again = true
			continue
		}
		ident, midExec := environIdentity("/proc", pid)
		if midExec {
			again = true // its environment is readable in a moment
			continue
		}
		if ident == 0 || a.active[ident] > 0 || !a.ended[ident] {
			continue
		}
		name := killWithGroup(pid, st.PGrp)
		a.killed[pid] = true
		again = true
		switch {
		case ident == mine:
			*left = append(*left, name)
		case a.ending[ident]:
			a.found[ident] = append(a.found[ident], name)
		default:
			*late = append(*late, name)
		}
	}
	return again
}

// readChildren reads the children list afresh; under starting's write
// lock.
func (a *adopter) readChildren() ([]byte, error) {
	b, err := preadAll(a.children, a.list)
	if err == nil {
		a.list = b[:cap(b)]
	}
	return b, err
}

// preadAll reads fd whole from offset 0 into buf, or into a buffer twice
// as large, and so on, until the content fits.
func preadAll(fd int, buf []byte) ([]byte, error) {
	for {
		n, err := unix.Pread(fd, buf, 0)
		if err != nil {
			return nil, err
		}
		if n < len(buf) {
			return buf[:n], nil
		}
		buf = make([]byte, 2*len(buf))
	}
}

// killWithGroup SIGKILLs a process that left its command's group, and
// the group it leads, if it leads one (a daemon's own children are in
// it); it returns what it killed, as "comm (pid N)" and " with its
// process group".
func killWithGroup(pid, pgrp int) string {
	name := processName(pid)
	_ = syscall.Kill(pid, syscall.SIGKILL)
	if pgrp == pid {
		if syscall.Kill(-pid, syscall.SIGKILL) == nil {
			name += " with its process group"
		}
	}
	return name
}
