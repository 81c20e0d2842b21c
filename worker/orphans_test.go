package worker

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shardpool/shardpool/stream"
)

// The journal's live groups are those started and not ended; a torn last
// line is skipped. A group is left alone when its id may name another
// group now: a leader that runs, or a member older than the dead worker.
func TestChildJournalAndGroupChecks(t *testing.T) {
	dir := t.TempDir()
	j, err := openChildJournal(dir, "h1", "/scratch with space", "w1", "boot-1", "pid:[1]", "coord-A", 4242, 1000)
	if err != nil {
		t.Fatal(err)
	}
	ack := func(n int) string { return fmt.Sprintf("$JS.ACK.SHARDS.cpu.2.%d.9.1764500000000000000.3", n) }
	held := &heldShard{key: "run.s1", attempt: 2, reply: ack(1)}
	j.started(10, held) // the command, then its validator: one shard
	j.ended(10)
	j.started(11, held)
	j.started(12, nil)
	j.started(13, &heldShard{key: "run.bad key", attempt: 1, reply: "x"}) // not a journal line's worth
	j.ended(13)
	done := &heldShard{key: "run.s2", attempt: 1, reply: ack(2)} // ran, settled
	j.started(14, done)
	j.ended(14)
	j.settled(done)
	committing := &heldShard{key: "run.s3", attempt: 1, reply: ack(3)} // its command ended, its message not settled
	j.started(15, committing)
	j.ended(15)
	staging := &heldShard{key: "run.s4", attempt: 3, reply: ack(4)} // no command yet
	j.holding(staging)
	staged := &heldShard{key: "run.s5", attempt: 1, reply: ack(5)} // staged, ran, settled
	j.holding(staged)
	j.started(16, staged)
	j.ended(16)
	j.settled(staged)
	retried := &heldShard{key: "run.s1", attempt: 1, reply: ack(6)} // an earlier delivery's release leaves attempt 2 held
	before, _ := os.Stat(j.path)
	j.settled(retried)
	if after, _ := os.Stat(j.path); after.Size() != before.Size() {
		t.Fatalf("a settled line was written on its own (%d -> %d bytes), want it to wait for the next line", before.Size(), after.Size())
	}
	j.started(17, nil) // "=" lines go out with the next line
	j.ended(17)
	j.f.WriteString("+ 1") // torn
	got, err := readJournal(filepath.Join(dir, "children", "h1", "4242.w1"))
	if err != nil || got.boot != "boot-1" || got.pid != 4242 || got.start != 1000 || got.pidns != "pid:[1]" || got.coord != "coord-A" || got.scratch != "/scratch with space" || len(got.live) != 2 || got.live[0] != 11 || got.live[1] != 12 {
		t.Fatalf("journal read back as %+v (%v), want boot-1, pid 4242, start 1000, pid:[1], its scratch, live [11 12]", got, err)
	}
	if want := []heldShard{*held, *committing, *staging}; !slices.Equal(got.held, want) {
		t.Fatalf("held messages read back as %+v, want %+v", got.held, want)
	}
	// A namespace or coordinator that could not be read stays unknown when
	// read back, and the fields after it stay in place.
	unknown, err := openChildJournal(dir, "h1", "/s", "w2", "boot-1", "", "", 4243, 1001)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := readJournal(unknown.path); err != nil || got.pidns != "" || got.coord != "" || got.scratch != "/s" {
		t.Fatalf("journal with unknown namespace and coordinator read back as %+v (%v)", got, err)
	}
	unknown.close()
	// A worker of another host sharing the state directory (an NFS home)
	// neither reads nor removes this host's journal: its boot differs, and
	// so would everything a pid means.
	other := &Worker{host: "h2", boot: "boot-2", log: slog.Default()}
	other.cfg.StateDir, other.cfg.ProcRoot = dir, "/proc"
	other.reapOrphans()
	if _, err := os.Stat(filepath.Join(dir, "children", "h1", "4242.w1")); err != nil {
		t.Fatalf("another host's worker removed this host's journal: %v", err)
	}
	// Nor does a worker of this host and boot in another pid namespace (a
	// container with the host's name): pid 4242 is not gone because it
	// does not exist over there.
	container := &Worker{host: "h1", boot: "boot-1", pidns: "pid:[2]", log: slog.Default()}
	container.cfg.StateDir, container.cfg.ProcRoot = dir, "/proc"
	container.reapOrphans()
	if _, err := os.Stat(filepath.Join(dir, "children", "h1", "4242.w1")); err != nil {
		t.Fatalf("a worker of another pid namespace removed the journal: %v", err)
	}
	j.close()
	if _, err := os.Stat(filepath.Join(dir, "children", "h1", "4242.w1")); !os.IsNotExist(err) {
		t.Fatalf("a closed journal is still there: %v", err)
	}

	procs := []procStat{{pid: 4242, start: 1000}, {pid: 4243, start: 1000, zombie: true}, {pid: 4244, start: 7}}
	for _, c := range []struct {
		pid   int
		alive bool
	}{{4242, true}, {4243, false}, {4244, false}, {4245, false}} {
		if got := workerAlive(procs, c.pid, 1000); got != c.alive {
			t.Errorf("worker %d started at 1000: alive %v, want %v (procs %+v)", c.pid, got, c.alive, procs)
		}
	}

	for _, c := range []struct {
		name  string
		procs []procStat
		why   string
	}{
		{"live leader", []procStat{{pid: 500, pgrp: 500, start: 2000}, {pid: 501, pgrp: 500, start: 2001}}, "leader runs"},
		{"older member", []procStat{{pid: 501, pgrp: 500, start: 999}}, "started before"},
		{"gone", []procStat{{pid: 500, pgrp: 500, start: 2000, zombie: true}, {pid: 7, pgrp: 7, start: 1}}, ""},
	} {
		n, why := killOrphanGroup(c.procs, 500, 1000)
		if n != 0 || (c.why == "" && why != "") || !strings.Contains(why, c.why) {
			t.Errorf("%s: killed %d, reason %q; want none, reason containing %q", c.name, n, why, c.why)
		}
	}
}

// handBack deletes a dead worker's lease and naks its delivery only when
// the lease is still that worker's, for that delivery, and clear of its
// TTL, or naks the delivery when there is no lease (the worker died
// between its fetch and its lease); anything else is left to expire.
func TestHandBackOnlyWhatTheDeadWorkerStillHolds(t *testing.T) {
	ctx := context.Background()
	w := workerOnServer(t, Config{StateDir: t.TempDir()})
	w.ttl, w.boot, w.host, w.pid, w.pidns = 8*time.Second, "boot-1", "h1", 1, "pid:[1]"
	nc := w.cfg.JetStream.Conn()
	naks := ackResponder(t, nc)
	dead := deadJournal{boot: "boot-1", pid: 4242, pidns: "pid:[1]"}
	mine := stream.Owner{Worker: "dead", Host: "h1", BootID: "boot-1", PID: 4242, PIDNS: "pid:[1]", Attempt: 2}
	handed := 0 // hand-backs so far, in the run's own admission.log
	for _, tc := range []struct {
		name    string
		owner   stream.Owner
		age     time.Duration
		handed  bool
		logPart string
	}{
		{"still the dead worker's", mine, time.Second, true, "decision=hand-back shard r.a (delivery 2 of dead worker pid 4242"},
		{"taken over by another pid", stream.Owner{Worker: "new", Host: "h1", BootID: "boot-1", PID: 4243, Attempt: 3}, time.Second, false, ""},
		{"an earlier delivery's", stream.Owner{Worker: "dead", Host: "h1", BootID: "boot-1", PID: 4242, Attempt: 1}, time.Second, false, ""},
		{"another boot's", stream.Owner{Worker: "dead", Host: "h1", BootID: "boot-0", PID: 4242, PIDNS: "pid:[1]", Attempt: 2}, time.Second, false, ""},
		{"another pid namespace's", stream.Owner{Worker: "dead", Host: "h1", BootID: "boot-1", PID: 4242, PIDNS: "pid:[2]", Attempt: 2}, time.Second, false, ""},
		{"near its TTL", mine, 7 * time.Second, false, "near its TTL of 8s; left to expire"},
		// Killed between its fetch and its lease: nothing ran, nothing
		// to wait out but the ack wait.
		{"no lease taken", stream.Owner{}, 0, true, "decision=hand-back shard r.a (delivery 2 of dead worker pid 4242 on this host back to the queue now: it held no lease"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "r.a"
			_ = w.b.Leases.Purge(ctx, key)
			if tc.owner != (stream.Owner{}) {
				l := stream.Lease{Owner: tc.owner, Taken: time.Now().Add(-tc.age), Renewed: time.Now().Add(-tc.age).UTC()}
				data, _ := stream.Encode(&l)
				if _, err := w.b.Leases.Put(ctx, key, data); err != nil {
					t.Fatal(err)
				}
			}
			w.handBack(heldShard{key: key, attempt: 2, reply: "ack." + strings.ReplaceAll(tc.name, " ", "-")}, dead)
			_, gerr := w.b.Leases.Get(ctx, key)
			msg, nerr := naks.NextMsg(300 * time.Millisecond)
			if tc.handed {
				if gerr == nil || nerr != nil || string(msg.Data) != string(nakNow) {
					t.Fatalf("lease left (%v) or no nak (%v %v): want both handed back", gerr, msg, nerr)
				}
			} else if gerr != nil || nerr == nil {
				t.Fatalf("lease gone (%v) or nak sent (%v): want both left alone", gerr, msg)
			}
			log, _ := os.ReadFile(filepath.Join(w.cfg.StateDir, "admission.log"))
			if tc.logPart != "" && !strings.Contains(string(log), tc.logPart) {
				t.Fatalf("admission.log lacks %q:\n%s", tc.logPart, log)
			}
			if tc.handed {
				handed++
			}
			runLog, _ := os.ReadFile(filepath.Join(w.evidenceDir("r"), "admission.log"))
			if got := strings.Count(string(runLog), "run=r shard=a class=- decision=hand-back delivery 2"); got != handed {
				t.Fatalf("run r's admission.log records %d hand-back(s), want %d:\n%s", got, handed, runLog)
			}
		})
	}
}

// A long-running worker's journal is rewritten to what is still live and
// held once it passes journalCompactAt; appends go on in the new file.
func TestChildJournalCompacts(t *testing.T) {
	dir := t.TempDir()
	j, err := openChildJournal(dir, "h1", "/s", "w1", "boot-1", "pid:[1]", "coord-A", 4242, 1000)
	if err != nil {
		t.Fatal(err)
	}
	defer j.close()
	long := &heldShard{key: "run.long", attempt: 1, reply: "$JS.ACK.SHARDS.cpu.1.1.1.1.1"}
	j.started(7, long)
	staging := &heldShard{key: "run.staging", attempt: 2, reply: "$JS.ACK.SHARDS.cpu.1.2.2.2.2"}
	j.holding(staging)
	for i := range 20_000 {
		h := &heldShard{key: fmt.Sprintf("run.s%05d", i), attempt: 1, reply: fmt.Sprintf("$JS.ACK.SHARDS.cpu.1.%d.%d.1764500000000000000.0", i, i)}
		j.started(100+i, h)
		j.ended(100 + i)
		j.settled(h)
	}
	last := &heldShard{key: "run.last", attempt: 1, reply: "$JS.ACK.SHARDS.cpu.1.3.3.3.3"}
	j.started(99, last)
	st, err := os.Stat(j.path)
	if err != nil || st.Size() > journalCompactAt {
		t.Fatalf("journal after 20,000 shards: %v bytes (%v), want it compacted below %d", st.Size(), err, journalCompactAt)
	}
	got, err := readJournal(j.path)
	if err != nil || !slices.Equal(got.live, []int{7, 99}) && !slices.Equal(got.live, []int{99, 7}) {
		t.Fatalf("live groups after compaction: %v (%v), want 7 and 99", got.live, err)
	}
	slices.SortFunc(got.held, func(a, b heldShard) int { return strings.Compare(a.key, b.key) })
	if want := []heldShard{*last, *long, *staging}; !slices.Equal(got.held, want) {
		t.Fatalf("held shards after compaction: %+v, want %+v", got.held, want)
	}
	if entries, _ := os.ReadDir(filepath.Dir(j.path)); len(entries) != 1 {
		t.Fatalf("journal directory after compaction: %v, want the journal alone", entries)
	}
}

// deadWorkerJournal makes a worker on a real server that can reap on this
// host (host h1, this boot and pid namespace) and the open journal of a
// dead worker there: its pid is a process that has exited, its
// coordinator coord.
func deadWorkerJournal(t *testing.T, coord string) (*Worker, *childJournal, int) {
	t.Helper()
	w := workerOnServer(t, Config{StateDir: t.TempDir()})
	w.host, w.ttl, w.boot, w.pidns = "h1", 8*time.Second, stream.BootID("/proc"), stream.PIDNamespace()
	w.cfg.ProcRoot = "/proc"
	if !stream.KnownBootID(w.boot) || w.pidns == "" {
		t.Fatal("boot ID or pid namespace unreadable: nothing can be reaped here")
	}
	exited := exec.Command("true")
	if err := exited.Run(); err != nil {
		t.Fatal(err)
	}
	dead := exited.Process.Pid
	j, err := openChildJournal(w.cfg.StateDir, "h1", t.TempDir(), "dead", w.boot, w.pidns, coord, dead, 1)
	if err != nil {
		t.Fatal(err)
	}
	return w, j, dead
}

// A worker killed after its command ended but before its message was
// settled (committing the output), or before its command started (staging
// the inputs), held shards all the same: a worker that reaps its journal
// hands them back at once. One it had settled is left alone.
func TestDeadWorkersCommittingAndStagingShardsComeBack(t *testing.T) {
	ctx := context.Background()
	w, j, dead := deadWorkerJournal(t, "")
	done := &heldShard{key: "r.done", attempt: 1, reply: "ack.done"}
	j.started(4_000_001, done)
	j.ended(4_000_001)
	j.settled(done)
	committing := &heldShard{key: "r.committing", attempt: 1, reply: "ack.committing"}
	j.started(4_000_000, committing)
	j.ended(4_000_000)
	staging := &heldShard{key: "r.staging", attempt: 2, reply: "ack.staging"}
	j.holding(staging)
	j.f.Close()
	for _, h := range []*heldShard{committing, staging, done} {
		l := stream.Lease{Owner: stream.Owner{Worker: "dead", Host: "h1", BootID: w.boot, PID: dead, PIDNS: w.pidns, Attempt: h.attempt}, Taken: time.Now(), Renewed: time.Now().UTC()}
		data, _ := stream.Encode(&l)
		if _, err := w.b.Leases.Put(ctx, h.key, data); err != nil {
			t.Fatal(err)
		}
	}
	naks := ackResponder(t, w.cfg.JetStream.Conn())
	w.reapOrphans()
	var got []string
	for {
		m, err := naks.NextMsg(500 * time.Millisecond)
		if err != nil {
			break
		}
		got = append(got, m.Subject+" "+string(m.Data))
	}
	slices.Sort(got)
	if want := []string{"ack.committing " + string(nakNow), "ack.staging " + string(nakNow)}; !slices.Equal(got, want) {
		t.Fatalf("naks after the reap: %q, want %q", got, want)
	}
	for key, want := range map[string]bool{"r.committing": false, "r.staging": false, "r.done": true} {
		if _, err := w.b.Leases.Get(ctx, key); (err == nil) != want {
			t.Errorf("lease %s after the reap: %v, want it there: %v", key, err, want)
		}
	}
}

// A dead worker's journal whose shards came from another coordinator
// (another run sharing the state directory) is reaped, but its held
// messages wait for a worker of that coordinator, which hands them back.
func TestAnotherCoordinatorsShardsWaitForItsOwnWorker(t *testing.T) {
	ctx := context.Background()
	w, j, dead := deadWorkerJournal(t, "coord-A")
	j.started(4_000_000, &heldShard{key: "r.a", attempt: 1, reply: "ack.a"}) // a group long gone
	j.f.Close()
	l := stream.Lease{Owner: stream.Owner{Worker: "dead", Host: "h1", BootID: w.boot, PID: dead, PIDNS: w.pidns, Attempt: 1}, Taken: time.Now(), Renewed: time.Now().UTC()}
	data, _ := stream.Encode(&l)
	if _, err := w.b.Leases.Put(ctx, "r.a", data); err != nil {
		t.Fatal(err)
	}
	naks := ackResponder(t, w.cfg.JetStream.Conn())
	path := filepath.Join(w.cfg.StateDir, "children", "h1", fmt.Sprintf("%d.dead", dead))

	w.coord.Store(&coordView{sync: stream.SyncGroup, store: "coord-B"})
	w.reapOrphans()
	b, err := os.ReadFile(path)
	if err != nil || !strings.Contains(string(b), "\nh r.a 1 ack.a\n") || strings.Contains(string(b), "+ ") {
		t.Fatalf("journal after another coordinator's worker reaped it: %q (%v), want its held shard kept as an h line", b, err)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o644 {
		t.Fatalf("kept journal's mode: %v (%v), want 0644 as every journal", st.Mode(), err)
	}
	if _, err := w.b.Leases.Get(ctx, "r.a"); err != nil {
		t.Fatalf("another coordinator's worker touched the lease: %v", err)
	}
	if m, err := naks.NextMsg(300 * time.Millisecond); err == nil {
		t.Fatalf("another coordinator's worker sent %q", m.Data)
	}
	w.reapOrphans() // again: nothing changes, nothing is logged twice
	if b2, _ := os.ReadFile(path); string(b2) != string(b) {
		t.Fatalf("a second reap rewrote the kept journal: %q", b2)
	}

	w.coord.Store(&coordView{sync: stream.SyncGroup, store: "coord-A"})
	w.reapOrphans()
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("its own coordinator's worker left the journal: %v", err)
	}
	if _, err := w.b.Leases.Get(ctx, "r.a"); err == nil {
		t.Fatal("its own coordinator's worker did not delete the lease")
	}
	if m, err := naks.NextMsg(time.Second); err != nil || string(m.Data) != string(nakNow) || m.Subject != "ack.a" {
		t.Fatalf("its own coordinator's worker did not nak the delivery: %v %v", m, err)
	}
	log, _ := os.ReadFile(filepath.Join(w.cfg.StateDir, "admission.log"))
	if n := strings.Count(string(log), "of another coordinator (coord-A)"); n != 1 {
		t.Fatalf("the kept journal is logged %d times, want once:\n%s", n, log)
	}
}

// ackResponder stands in for the server's ack handling on the made-up ack
// subjects "ack.>": it answers each nak, as the server does a nak sent as a
// request, and keeps it for NextMsg.
func ackResponder(t *testing.T, nc *nats.Conn) *nats.Subscription {
	t.Helper()
	answer, err := nc.Subscribe("ack.>", func(m *nats.Msg) { _ = m.Respond(nil) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = answer.Unsubscribe() })
	naks, err := nc.SubscribeSync("ack.>")
	if err != nil {
		t.Fatal(err)
	}
	return naks
}

// TestZombieIsNotAlive: a process that exited and was not reaped (a worker
// SIGKILLed under a parent that does not wait for it) is dead for every
// proof of an owner gone: leases, worker names, kept cgroups.
func TestZombieIsNotAlive(t *testing.T) {
	pid := zombieChild(t)
	if pidAlive(pid) {
		t.Errorf("zombie pid %d counts as alive", pid)
	}
	if !pidAlive(os.Getpid()) {
		t.Errorf("this process counts as dead")
	}
}

// zombieChild starts `true` and waits until it has exited and is a zombie
// (this test has not waited for it yet); it is reaped at cleanup.
func zombieChild(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Wait() })
	pid := cmd.Process.Pid
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if strings.Contains(string(b), ") Z ") {
			return pid
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d did not become a zombie: %s", pid, b)
		}
	}
}
