package worker

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
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
// scratch directory, then one line per event:
//
//	+ <pgid> [<lease key> <attempt> <ack subject>]  a command started
//	- <pgid>                                       its group is gone
//	h <lease key> <attempt> <ack subject>          a delivery held, from its fetch on
//	= <lease key> <attempt>                        the shard's message is settled
//
// A worker that exits normally removes it; one that runs long rewrites it
// to what is still live and held (compact).
//
// The message a dead worker held cannot be acknowledged by anyone else;
// JetStream would redeliver it only after the ack wait (the lease TTL),
// and its lease would keep every worker on other hosts off it as long.
// The worker that reaps the journal proves the owner gone, so it hands the
// message back at once: it deletes the dead owner's lease and naks the
// delivery (handBack). That covers a shard from its staging through its
// command to its settled message: a crashed `shardpool run` restarted at
// once resumes its shards at once instead of after the TTL, those it was
// committing too. Only a worker of the same coordinator can; another keeps
// them for one (keepForeign).

// childJournal records this worker's running process groups and the
// shards it holds.
type childJournal struct {
	mu     sync.Mutex
	f      *os.File
	path   string
	header string
	size   int64
	// What the journal says now, for compact: the live groups and the
	// held shards (by key and attempt).
	live map[int]bool
	held map[string]heldShard
	// settledLines are "=" lines not written yet: they go out with the
	// next line (no write of their own). One lost with the worker costs
	// nothing but a look: handBack finds the shard's lease released, taken
	// over, or left by an acked attempt whose message is gone, where a
	// nak changes nothing.
	settledLines []byte
}

// journalCompactAt is the size past which a journal is rewritten to what
// is still live and held: a line or two per shard adds up over a long run.
const journalCompactAt = 1 << 20

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
	header := journalHeader(boot, pid, start, pidns, coord, scratch)
	if _, err := f.WriteString(header); err != nil {
		f.Close()
		os.Remove(path)
		return nil, err
	}
	return &childJournal{f: f, path: path, header: header, size: int64(len(header)), live: map[int]bool{}, held: map[string]heldShard{}}, nil
}

// heldShard is the shard message a worker holds, as its journal lines
// keep it: enough for the worker that finds this one dead to hand the
// message back (handBack).
type heldShard struct {
	key     string // the shard's lease key
	attempt int    // the delivery count, as the lease's owner records it
	reply   string // the delivery's ack subject
}

// journaled reports whether h fits a journal line (fields without spaces).
func (h *heldShard) journaled() bool {
	return h != nil && h.reply != "" && h.key != "" && !strings.ContainsAny(h.key+h.reply, " \n")
}

func (h heldShard) id() string { return h.key + " " + strconv.Itoa(h.attempt) }

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
	if h.journaled() {
		b = appendShard(append(b, ' '), h)
	}
	j.write(append(b, '\n'), func() {
		j.live[pgid] = true
		if h.journaled() {
			j.held[h.id()] = *h
		}
	})
}

// ended notes that a command's process group is gone. The shard it ran
// for stays held until it is settled.
func (j *childJournal) ended(pgid int) {
	if j == nil {
		return
	}
	var b [24]byte
	j.write(append(strconv.AppendInt(append(b[:0], '-', ' '), int64(pgid), 10), '\n'), func() { delete(j.live, pgid) })
}

// holding notes a delivery held from its fetch on: before its lease, its
// inputs or its command, so that a worker killed at any point after the
// fetch has it in its journal.
func (j *childJournal) holding(h *heldShard) {
	if j == nil || !h.journaled() {
		return
	}
	j.write(appendHeld(nil, h), func() { j.held[h.id()] = *h })
}

// appendHeld appends the "h" line of h, which holding, compact and
// keepForeign write.
func appendHeld(b []byte, h *heldShard) []byte {
	return append(appendShard(append(b, "h "...), h), '\n')
}

// settled notes that the worker is done with a shard's delivery: its
// message is acked, naked or termed, or its lease was lost. The line goes
// out with the next one (see settledLines).
func (j *childJournal) settled(h *heldShard) {
	if j == nil || !h.journaled() {
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	b := append(append(j.settledLines, "= "...), h.key...)
	j.settledLines = append(strconv.AppendInt(append(b, ' '), int64(h.attempt), 10), '\n')
	delete(j.held, h.id())
}

func appendShard(b []byte, h *heldShard) []byte {
	b = append(append(b, h.key...), ' ')
	b = append(strconv.AppendInt(b, int64(h.attempt), 10), ' ')
	return append(b, h.reply...)
}

// write appends line and applies what it says to the journal's state.
func (j *childJournal) write(line []byte, apply func()) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if len(j.settledLines) > 0 {
		line = append(j.settledLines, line...)
		j.settledLines = j.settledLines[:0]
	}
	n, _ := j.f.Write(line)
	j.size += int64(n)
	apply()
	if j.size > journalCompactAt {
		j.compact()
	}
}

// compact rewrites the journal to its header, a line per live group and
// one per held shard, through a temporary file and a rename, so that a
// crash at any point leaves one whole journal. On failure the journal
// grows on and the next write tries again.
func (j *childJournal) compact() {
	b := []byte(j.header)
	for pgid := range j.live {
		b = append(strconv.AppendInt(append(b, "+ "...), int64(pgid), 10), '\n')
	}
	for _, h := range j.held {
		b = appendHeld(b, &h)
	}
	// As the journal was: other workers read it.
	f, err := replaceFile(j.path, ".compact-*", b, 0o644)
	if err != nil {
		return
	}
	// The temporary file, renamed, is the journal now; appends go to it.
	j.f.Close()
	j.f, j.size = f, int64(len(b))
	j.settledLines = j.settledLines[:0] // what they said is in held
}

// replaceFile puts content at path through a temporary file (named by
// pattern, in path's directory, with mode) and a rename, so that a reader
// or a crash sees the old file or the new one whole. It returns the new
// file open for appending; on error nothing is left behind.
func replaceFile(path, pattern string, content []byte, mode os.FileMode) (*os.File, error) {
	f, err := os.CreateTemp(filepath.Dir(path), pattern)
	if err != nil {
		return nil, err
	}
	_, err = f.Write(content)
	if err == nil {
		err = f.Chmod(mode)
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, err
	}
	return f, nil
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
	// held are the messages held and not settled, in order: their commands
	// ran or run, their inputs were being staged, or they were kept by a
	// worker of another coordinator for one of theirs ("h" lines).
	held []heldShard
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
	var order []int
	held := map[string]bool{} // by heldShard.id
	var heldOrder []heldShard
	hold := func(key, attempt, reply string) {
		n, err := strconv.Atoi(attempt)
		if err != nil {
			return
		}
		h := heldShard{key: key, attempt: n, reply: reply}
		if !held[h.id()] {
			heldOrder = append(heldOrder, h)
		}
		held[h.id()] = true
	}
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 4 && f[0] == "h":
			hold(f[1], f[2], f[3])
			continue
		case len(f) == 3 && f[0] == "=":
			delete(held, f[1]+" "+f[2])
			continue
		case len(f) < 2:
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
			if len(f) == 5 {
				hold(f[2], f[3], f[4])
			}
		case "-":
			delete(open, pgid)
		}
	}
	for _, g := range order {
		if open[g] {
			j.live = append(j.live, g)
			delete(open, g)
		}
	}
	for _, h := range heldOrder {
		if held[h.id()] {
			j.held = append(j.held, h)
			delete(held, h.id())
		}
	}
	return j, sc.Err()
}

// processStart is pid's start time in clock ticks since boot, or -1.
func processStart(procRoot string, pid int) int64 {
	st, err := probe.ReadStat(procRoot, pid)
	if err != nil {
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
		held := j.held
		for _, pgid := range j.live {
			n, why := killOrphanGroup(procs, pgid, j.start)
			if n > 0 {
				w.hostLog("-", "reap", fmt.Sprintf("killed %d process(es) of group %d left running by worker pid %d, which died without ending them", n, pgid, j.pid))
			} else if why != "" {
				w.hostLog("-", "reap-skip", fmt.Sprintf("group %d of dead worker pid %d left alone: %s", pgid, j.pid, why))
			}
		}
		if strays := killStrays(w.cfg.ProcRoot, procs, held, j.live, j.pid, j.start); len(strays) > 0 {
			w.hostLog("-", "reap", fmt.Sprintf("killed %d process(es) that attempts of worker pid %d, which died without ending them, left running outside their process groups: %s",
				len(strays), j.pid, strings.Join(strays, ", ")))
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
		// Nothing to rewrite (rewritten before, or its worker died with no
		// command running): keep it while it may matter, from its mtime.
		st, err := os.Stat(path)
		return err == nil && time.Since(st.ModTime()) < foreignKeep
	}
	b := []byte(journalHeader(j.boot, j.pid, j.start, j.pidns, j.coord, j.scratch))
	for _, h := range held {
		b = appendHeld(b, &h)
	}
	// A name of its own: two reapers may rewrite the same journal at once.
	// The mode is every journal's.
	f, err := replaceFile(path, ".keep-*", b, 0o644)
	if err != nil {
		return true
	}
	f.Close()
	w.hostLog("-", "reap", fmt.Sprintf("dead worker pid %d held %d shard(s) of another coordinator (%s); its journal waits up to %s for a worker of that one to hand them back", j.pid, len(held), j.coord, foreignKeep))
	return true
}

// handBack returns a message a dead worker held (its command ran, its
// inputs were being staged, or its output committed) to the queue at
// once, instead of after the ack wait: it deletes the shard's
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
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		// No lease: the dead worker was killed after the fetch and before
		// it took one (no command ran), or the lease lapsed with the TTL,
		// when the delivery is due back anyway. A delivery it already
		// settled (the journal's "=" line goes out with the next line) is
		// no longer pending, and a nak of it changes nothing.
		w.requeueHeld(h, j, "it held no lease (killed before it took one, or the lease lapsed)")
		return
	}
	if err != nil {
		return // the store did not answer: the lease expires as before
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
	w.requeueHeld(h, j, "its lease deleted")
}

// requeueHeld naks a dead worker's delivery so that it comes back now, and
// says so in the host's and the run's admission logs.
func (w *Worker) requeueHeld(h heldShard, j deadJournal, how string) {
	if err := w.requeueNow(h.reply); err != nil {
		w.hostLog("-", "reap", fmt.Sprintf("shard %s of dead worker pid %d: %s; the nak failed (%v), so it comes back after the ack wait", h.key, j.pid, how, err))
		return
	}
	why := fmt.Sprintf("delivery %d of dead worker pid %d on this host back to the queue now: %s, its delivery naked", h.attempt, j.pid, how)
	w.hostLog("-", "hand-back", fmt.Sprintf("shard %s (%s)", h.key, why))
	if run, id, ok := strings.Cut(h.key, "."); ok {
		// The run's own evidence says why its next attempt came early.
		w.admission(run, id, "-", "hand-back", why)
	}
}

// removeDeadCgroups removes dead workers' shard cgroups, killing what
// their commands left running in them, and says so in the host's
// admission.log (removeDeadOwners).
func (w *Worker) removeDeadCgroups() {
	for _, line := range w.cgroups.removeDeadOwners() {
		w.hostLog("-", "reap", line)
		w.log.Warn("reaped", "what", line)
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

// workerProcVar names, in every command's environment, the worker
// process that started it (workerProc): its descendants inherit it.
const workerProcVar = "SHARDPOOL_WORKER_PROC"

// workerProc identifies a worker process on its host: pid and start time.
func workerProc(pid int, start int64) string { return fmt.Sprintf("%d:%d", pid, start) }

// killStrays kills what a dead worker's attempts (held) left running
// outside their process groups (setsid, a daemon), which killOrphanGroup
// cannot find by group: a process whose environment says the dead worker
// started it (workerProcVar: its pid and start time) and names one of
// those attempts (SHARDPOOL_RUN, SHARDPOOL_SHARD_ID, SHARDPOOL_ATTEMPT).
// It returns what it killed, as "comm (pid N)". Members of the worker's
// own groups (groups) are killOrphanGroup's.
func killStrays(procRoot string, procs []procStat, held []heldShard, groups []int, workerPID int, workerStart int64) []string {
	if len(held) == 0 {
		return nil
	}
	want := make(map[string]bool, len(held))
	for _, h := range held {
		want[h.id()] = true
	}
	self := os.Getpid()
	by := workerProcVar + "=" + workerProc(workerPID, workerStart)
	var killed []string
	for _, p := range procs {
		if p.zombie || p.start < workerStart || p.pid == self || slices.Contains(groups, p.pgrp) {
			continue
		}
		vars, midExec := shardEnviron(procRoot, p.pid)
		for i := 0; midExec && i < killRounds; i++ {
			time.Sleep(killPause)
			vars, midExec = shardEnviron(procRoot, p.pid)
		}
		if !slices.Contains(vars, by) || !want[heldIdentity(vars)] {
			continue
		}
		killed = append(killed, killWithGroup(p.pid, p.pgrp))
	}
	return killed
}

// heldIdentity is the heldShard.id of the attempt an environment names,
// or "".
func heldIdentity(env []string) string {
	v := attemptVarsOf(env)
	if v.run == "" || v.id == "" || v.attempt == "" {
		return ""
	}
	return stream.ShardKey(v.run, v.id) + " " + v.attempt
}

// readComm is a process's command name, or "".
func readComm(procRoot string, pid int) string {
	b, _ := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "comm"))
	return strings.TrimSpace(string(b))
}
