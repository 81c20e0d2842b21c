package worker

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker/probe"
)

// A worker killed with SIGKILL takes its commands with it (Pdeathsig), but
// not what they started: a job script's python, a shell's sleep. Those stay
// behind in the shard's process group, using CPU, memory and GPUs that no
// one accounts for while the shard runs again elsewhere. So each worker
// keeps a journal of the process groups it runs, in its state directory
// (shared by the workers of one user on a host by default), and every
// worker reaps the groups of a dead worker's journal: at start and every
// third of the lease TTL, so before the dead worker's shards come back
// from their expired leases.
//
// The journal is <state>/children/<host>/<pid>.<worker name>: a header
// with the boot ID, the worker's pid, start time, pid namespace (a journal
// of another namespace is left alone) and coordinator, a line with its
// scratch directory, then "+ <pgid> [<lease key> <attempt> <ack subject>]"
// when a command starts and "- <pgid>" when its group is gone. A worker
// that exits normally removes it.
//
// The message a dead worker's command ran for cannot be acknowledged by
// anyone else; JetStream would redeliver it only after the ack wait (the
// lease TTL), and its lease would keep every worker on other hosts off it
// as long. The worker that reaps the journal proves the owner gone, so it
// hands the message back at once: it deletes the dead owner's lease and
// naks the delivery (handBack). A crashed `shardpool run` restarted at once
// resumes its shards at once instead of after the TTL. Only a worker of
// the same coordinator can; another keeps them for one (keepForeign).

// childJournal records this worker's running process groups.
type childJournal struct {
	mu   sync.Mutex
	f    *os.File
	path string
}

// journalDir holds one host's journals: a state directory on a shared
// file system (an NFS home) is seen by workers of many hosts, and pids
// and boot IDs mean something only on their own host.
func journalDir(state, host string) string {
	if host == "" {
		host = "unknown-host"
	}
	return filepath.Join(state, "children", host)
}

// openChildJournal starts the journal of worker name (several workers can
// share a process in tests, hence the name beside the pid).
func openChildJournal(state, host, scratch, name, boot, pidns, coord string, pid int, start int64) (*childJournal, error) {
	dir := journalDir(state, host)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, strconv.Itoa(pid)+"."+name)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	if _, err := f.WriteString(journalHeader(boot, pid, start, pidns, coord, scratch)); err != nil {
		f.Close()
		os.Remove(path)
		return nil, err
	}
	return &childJournal{f: f, path: path}, nil
}

// heldShard is the shard message a command runs for, as its journal line
// keeps it: enough for the worker that finds this one dead to hand the
// message back (handBack).
type heldShard struct {
	key     string // the shard's lease key
	attempt int    // the delivery count, as the lease's owner records it
	reply   string // the delivery's ack subject
}

// journalHeader is a journal's first two lines, written by its worker and
// again by keepForeign. An unknown pid namespace or coordinator is "-", so
// that the header keeps its fields in place.
func journalHeader(boot string, pid int, start int64, pidns, coord, scratch string) string {
	dash := func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	}
	return fmt.Sprintf("boot %s pid %d start %d pidns %s coord %s\nscratch %s\n", boot, pid, start, dash(pidns), dash(coord), scratch)
}

// started notes a command's process group, with the message it runs for.
func (j *childJournal) started(pgid int, h *heldShard) {
	if j == nil {
		return
	}
	b := make([]byte, 0, 160)
	b = strconv.AppendInt(append(b, '+', ' '), int64(pgid), 10)
	if h != nil && h.reply != "" && !strings.ContainsAny(h.key+h.reply, " \n") {
		b = append(append(append(b, ' '), h.key...), ' ')
		b = append(strconv.AppendInt(b, int64(h.attempt), 10), ' ')
		b = append(b, h.reply...)
	}
	j.write(append(b, '\n'))
}

// ended notes that a command's process group is gone.
func (j *childJournal) ended(pgid int) {
	if j == nil {
		return
	}
	var b [24]byte
	j.write(append(strconv.AppendInt(append(b[:0], '-', ' '), int64(pgid), 10), '\n'))
}

func (j *childJournal) write(line []byte) {
	j.mu.Lock()
	_, _ = j.f.Write(line)
	j.mu.Unlock()
}

// close removes the journal: every group it listed has ended.
func (j *childJournal) close() {
	if j == nil {
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	j.f.Close()
	os.Remove(j.path)
}

// deadJournal is what a journal says, read back.
type deadJournal struct {
	boot    string
	pid     int
	start   int64
	pidns   string // "" in journals older than the field
	coord   string // the store of the coordinator its shards came from (CoordinatorInfo.Store); "" if unknown
	scratch string
	live    []int // groups started and not ended, in order
	// held is the message each live group ran for, where the line said.
	held map[int]heldShard
	// pending are messages whose groups were reaped already, by a worker
	// of another coordinator, which kept them for one of theirs ("h" lines).
	pending []heldShard
}

func readJournal(path string) (deadJournal, error) {
	f, err := os.Open(path)
	if err != nil {
		return deadJournal{}, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	var j deadJournal
	if !sc.Scan() {
		return j, fmt.Errorf("%s: no header", path)
	}
	if _, err := fmt.Sscanf(sc.Text(), "boot %s pid %d start %d", &j.boot, &j.pid, &j.start); err != nil {
		return j, fmt.Errorf("%s: header %q: %v", path, sc.Text(), err)
	}
	undash := func(s string) string {
		if s == "-" {
			return ""
		}
		return s
	}
	if f := strings.Fields(sc.Text()); len(f) >= 8 && f[6] == "pidns" {
		j.pidns = undash(f[7])
		if len(f) == 10 && f[8] == "coord" {
			j.coord = undash(f[9])
		}
	}
	if !sc.Scan() || !strings.HasPrefix(sc.Text(), "scratch ") {
		return j, fmt.Errorf("%s: no scratch line", path)
	}
	j.scratch = strings.TrimPrefix(sc.Text(), "scratch ")
	open := map[int]bool{}
	held := map[int]heldShard{}
	var order []int
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 4 && f[0] == "h" {
			if n, err := strconv.Atoi(f[2]); err == nil {
				j.pending = append(j.pending, heldShard{key: f[1], attempt: n, reply: f[3]})
			}
			continue
		}
		if len(f) < 2 {
			continue // a torn last line
		}
		pgid, err := strconv.Atoi(f[1])
		if err != nil || pgid <= 1 {
			continue
		}
		switch f[0] {
		case "+":
			open[pgid] = true
			order = append(order, pgid)
			delete(held, pgid)
			if len(f) == 5 {
				if n, err := strconv.Atoi(f[3]); err == nil {
					held[pgid] = heldShard{key: f[2], attempt: n, reply: f[4]}
				}
			}
		case "-":
			delete(open, pgid)
		}
	}
	for _, g := range order {
		if open[g] {
			j.live = append(j.live, g)
			if h, ok := held[g]; ok {
				if j.held == nil {
					j.held = map[int]heldShard{}
				}
				j.held[g] = h
			}
			delete(open, g)
		}
	}
	return j, sc.Err()
}

// processStart is pid's start time in clock ticks since boot, or -1.
func processStart(procRoot string, pid int) int64 {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "stat"))
	if err != nil {
		return -1
	}
	st, ok := probe.ParseStat(b)
	if !ok {
		return -1
	}
	return st.Start
}

// reapOrphans kills what dead workers of this boot left running, hands
// back the shards their commands ran for (handBack; another coordinator's
// are kept for it, keepForeign), then removes their journals and scratch
// pairs. A journal's worker is dead when no process has its pid, the one
// that has it started at another time (the pid was reused), or it is a
// zombie. A group is killed only when its leader (the command, which
// Pdeathsig killed) is gone and every member started after the dead worker
// did; a live leader means the pgid names another group now.
func (w *Worker) reapOrphans() {
	if !stream.KnownBootID(w.boot) {
		return // nothing about another process can be proven (ownerGone)
	}
	paths, _ := filepath.Glob(filepath.Join(journalDir(w.cfg.StateDir, w.host), "*"))
	if len(paths) == 0 {
		return
	}
	var procs []procStat
	for _, path := range paths {
		if path == w.journal.pathOrEmpty() {
			continue
		}
		j, err := readJournal(path)
		if err != nil {
			// A header torn by a crash as the journal was opened: once it is
			// clearly not being written, it names nothing that can be reaped.
			if st, serr := os.Stat(path); serr == nil && time.Since(st.ModTime()) > time.Minute {
				w.log.Warn("removing an unreadable child journal", "path", path, "err", err)
				os.Remove(path)
			}
			continue
		}
		if !stream.KnownBootID(j.boot) || j.boot != w.boot {
			os.Remove(path) // from before a reboot of this host: its processes are gone
			continue
		}
		if w.pidns == "" || j.pidns != w.pidns {
			// Another pid namespace's (a container sharing this host's name
			// and state directory): its pids mean nothing here.
			continue
		}
		if procs == nil {
			procs = procStats(w.cfg.ProcRoot)
		}
		if workerAlive(procs, j.pid, j.start) {
			continue
		}
		held := j.pending
		for _, pgid := range j.live {
			n, why := killOrphanGroup(procs, pgid, j.start)
			if n > 0 {
				w.hostLog("-", "reap", fmt.Sprintf("killed %d process(es) of group %d left running by worker pid %d, which died without ending them", n, pgid, j.pid))
			} else if why != "" {
				w.hostLog("-", "reap-skip", fmt.Sprintf("group %d of dead worker pid %d left alone: %s", pgid, j.pid, why))
			}
			if h, ok := j.held[pgid]; ok {
				held = append(held, h)
			}
		}
		removeDeadPairs(j.scratch, j.pid)
		if store := w.view().store; len(held) > 0 && j.coord != "" && store != "" && j.coord != store {
			// Another coordinator's shards (another run sharing this state
			// directory): only a worker of theirs can hand them back.
			if w.keepForeign(path, j, held) {
				continue
			}
		} else {
			for _, h := range held {
				w.handBack(h, j)
			}
		}
		os.Remove(path)
	}
}

// foreignKeep bounds how long a dead worker's journal waits for a worker
// of its own coordinator: past a lease TTL or two its leases have expired
// and there is nothing left to hand back.
const foreignKeep = 10 * time.Minute

// keepForeign keeps a reaped journal of another coordinator's worker for a
// worker of that coordinator: rewritten to its header and one "h" line per
// held message, its groups gone. It reports false, and the journal is to
// be removed, once the rewritten journal has waited foreignKeep. A rewrite
// that fails is tried again at the next reap.
func (w *Worker) keepForeign(path string, j deadJournal, held []heldShard) bool {
	if len(j.live) == 0 {
		// Rewritten before (its mtime is when): keep it while it may matter.
		st, err := os.Stat(path)
		return err == nil && time.Since(st.ModTime()) < foreignKeep
	}
	var b strings.Builder
	b.WriteString(journalHeader(j.boot, j.pid, j.start, j.pidns, j.coord, j.scratch))
	for _, h := range held {
		fmt.Fprintf(&b, "h %s %d %s\n", h.key, h.attempt, h.reply)
	}
	// A name of its own: two reapers may rewrite the same journal at once.
	f, err := os.CreateTemp(filepath.Dir(path), ".keep-*")
	if err != nil {
		return true
	}
	_, err = f.WriteString(b.String())
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
		return true
	}
	w.hostLog("-", "reap", fmt.Sprintf("dead worker pid %d held %d shard(s) of another coordinator (%s); its journal waits up to %s for a worker of that one to hand them back", j.pid, len(held), j.coord, foreignKeep))
	return true
}

// handBack returns the message a dead worker's command ran for to the
// queue at once, instead of after the ack wait: it deletes the shard's
// lease, if that is still the dead worker's for this very delivery, and
// naks the delivery. A lease that changed hands, or that is near its
// expiry (the message may be redelivered by now, and a nak of the old
// delivery would send it out twice), is left to expire.
func (w *Worker) handBack(h heldShard, j deadJournal) {
	if w.b == nil || w.cfg.JetStream == nil {
		return // not connected: the lease expires as before
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	e, err := w.b.Leases.Get(ctx, h.key)
	if err != nil {
		return // released, expired or taken over since: nothing is held
	}
	var l stream.Lease
	if stream.Decode(e.Value(), &l) != nil {
		return
	}
	o := l.Owner
	if o.Host != w.host || o.BootID != j.boot || o.PIDNS != j.pidns || o.PID != j.pid || o.Attempt != h.attempt {
		return // another owner's, or another delivery's
	}
	// The heartbeat sends InProgress just before it renews the lease, so
	// the delivery cannot come back before Renewed + TTL, give or take
	// that gap: stay clear of the end.
	if age := time.Since(l.Renewed); age > w.ttl-min(2*time.Second, w.ttl/4) {
		w.hostLog("-", "reap-skip", fmt.Sprintf("shard %s of dead worker pid %d: its lease is %s old, near its TTL of %s; left to expire", h.key, j.pid, age.Round(time.Millisecond), w.ttl))
		return
	}
	if err := w.b.Leases.Delete(ctx, h.key, jetstream.LastRevision(e.Revision())); err != nil {
		return
	}
	nc := w.cfg.JetStream.Conn()
	if err := nc.Publish(h.reply, []byte("-NAK")); err == nil {
		err = nc.FlushWithContext(ctx)
	}
	if err != nil {
		w.hostLog("-", "reap", fmt.Sprintf("shard %s of dead worker pid %d: lease deleted; the nak failed (%v), so it comes back after the ack wait", h.key, j.pid, err))
		return
	}
	why := fmt.Sprintf("delivery %d of dead worker pid %d on this host back to the queue now: its lease deleted, its delivery naked", h.attempt, j.pid)
	w.hostLog("-", "hand-back", fmt.Sprintf("shard %s (%s)", h.key, why))
	if run, id, ok := strings.Cut(h.key, "."); ok {
		// The run's own evidence says why its next attempt came early.
		w.admission(run, id, "-", "hand-back", why)
	}
}

func (j *childJournal) pathOrEmpty() string {
	if j == nil {
		return ""
	}
	return j.path
}

// workerAlive: a zombie is dead (a container whose pid 1 does not reap
// keeps a killed worker as one indefinitely).
func workerAlive(procs []procStat, pid int, start int64) bool {
	for _, p := range procs {
		if p.pid == pid {
			return p.start == start && !p.zombie
		}
	}
	return false
}

// killOrphanGroup SIGKILLs the members of pgid when the group is still the
// one a dead worker started (see reapOrphans); it returns how many, or why
// it left the group alone ("" when the group is gone).
func killOrphanGroup(procs []procStat, pgid int, workerStart int64) (int, string) {
	var members []int
	for _, p := range procs {
		if p.pgrp != pgid || p.zombie {
			// A zombie is dead; one that is the leader (the command, which
			// Pdeathsig killed, reparented to an init that has not reaped it
			// yet) still holds the id, so the group is the original.
			continue
		}
		if p.pid == pgid {
			return 0, "its leader runs, so the id names a live group"
		}
		if p.start < workerStart {
			return 0, fmt.Sprintf("member %d started before the dead worker did", p.pid)
		}
		members = append(members, p.pid)
	}
	if len(members) == 0 {
		return 0, ""
	}
	if err := syscall.Kill(-pgid, syscall.SIGKILL); err != nil {
		return 0, err.Error()
	}
	return len(members), ""
}
