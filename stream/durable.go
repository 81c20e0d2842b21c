package stream

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// Sync modes of the coordinator's store.
const (
	// SyncGroup (the default): the server writes every message to the kernel
	// before it acknowledges it, and a barrier (SubjectSync) makes every
	// write acknowledged before it durable with one syncfs of the store,
	// shared by every caller that asked while the previous one ran. Writers
	// ask for a barrier before they act on what they wrote.
	SyncGroup = "group"
	// SyncAlways: the server fsyncs every write before acknowledging it
	// (nats-server SyncAlways); barriers return at once.
	SyncAlways = "always"
	// SyncNone: writes reach the kernel before the ack (a process crash
	// loses nothing) but a host crash can lose the last two minutes;
	// barriers return at once.
	SyncNone = "none"
)

// ValidSync reports whether s names a sync mode.
func ValidSync(s string) bool { return s == SyncGroup || s == SyncAlways || s == SyncNone }

// How long Barrier asks again when no coordinator serves barriers yet.
var (
	noResponderWait  = 10 * time.Second
	noResponderRetry = 50 * time.Millisecond
)

// SubjectSync is the coordinator's durability barrier: a request returns
// "ok" once every write the server acknowledged before the request arrived
// is on disk.
const SubjectSync = "shardpool.sync"

// SubjectInfo answers with the coordinator's CoordinatorInfo (JSON).
const SubjectInfo = "shardpool.info"

// CoordinatorInfo tells a worker how the coordinator's store is synced and
// where it runs. A worker on the same boot of the same host crashes with
// the coordinator, which spares it the barriers that guard against the
// coordinator's host crashing alone.
type CoordinatorInfo struct {
	V      int    `json:"v"`
	Host   string `json:"host"`
	BootID string `json:"boot_id"`
	Sync   string `json:"sync"`
	// Store names the coordinator's store: the creation time of its
	// SHARDS stream, which the store of another coordinator (another data
	// directory, another `shardpool run`) does not share.
	Store string `json:"store,omitempty"`
	// StoreFull says why the store refuses writes, when it does: no shard
	// can be leased or recorded until space is freed on its file system
	// (the coordinator then raises its limit or reloads its store itself;
	// `run` stops and is resumed).
	StoreFull string `json:"store_full,omitempty"`
	// Clients names the coordinator's open client connections (sorted,
	// each once), so that a reader can tell a worker's report from a
	// connected worker (WorkerReport.Conn); absent from older coordinators.
	Clients []string `json:"clients,omitempty"`
	// PID, PIDNS and Start name the coordinator's process (Start: clock
	// ticks since boot), so that a worker on its host counts the
	// coordinator's CPU as shardpool's, not others' use; absent from
	// older coordinators.
	PID   int    `json:"pid,omitempty"`
	PIDNS string `json:"pid_ns,omitempty"`
	Start int64  `json:"start,omitempty"`
	// Name and Cluster are set by a coordinator in a cluster of
	// coordinators: its server name, and the cluster's name. Any one of
	// them answers; Clients then lists only its own connections.
	Name    string `json:"name,omitempty"`
	Cluster string `json:"cluster,omitempty"`
	// Coordinators is how many coordinators the cluster has (set in a
	// cluster only): every one answers an info request, and a reader
	// that heard them all knows every client of the cluster (AskInfoAll).
	Coordinators int `json:"coordinators,omitempty"`
	// Leader names, in a cluster, the coordinator that tracks the runs
	// (the cluster's JetStream meta leader) as the answering one knows
	// it; "" while none is elected.
	Leader string `json:"leader,omitempty"`
	// Version is the build of shardpool the coordinator runs
	// (Build.Version); absent from older coordinators.
	Version string `json:"version,omitempty"`
	// Versions is set by a reader (AskInfoAll), never by a coordinator:
	// in a cluster whose coordinators that answered run more than one
	// build (mid-upgrade), each one's by server name ("" for one too old
	// to say); absent when they agree.
	Versions map[string]string `json:"versions,omitempty"`
}

// AskInfoAll is AskInfo that, in a cluster of coordinators, waits up to
// wait for each of them to answer and lists in Clients every client of
// the cluster; when not all answered, Clients is nil (unknown: a worker
// may be connected to the one that did not). Versions names each build
// where those that answered run more than one. A single coordinator's
// answer returns at once.
func AskInfoAll(ctx context.Context, nc *nats.Conn, wait time.Duration) (CoordinatorInfo, error) {
	var first CoordinatorInfo
	inbox := nats.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return first, fmt.Errorf("coordinator info: %w", err)
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest(SubjectInfo, inbox, nil); err != nil {
		return first, fmt.Errorf("coordinator info: %w", err)
	}
	m, err := sub.NextMsgWithContext(ctx)
	if err != nil {
		return first, fmt.Errorf("coordinator info: %w", err)
	}
	if err := Decode(m.Data, &first); err != nil {
		return first, fmt.Errorf("coordinator info: %w", err)
	}
	if first.Coordinators <= 1 {
		return first, nil
	}
	seen := map[string]bool{first.Name: true}
	versions := map[string]string{first.Name: first.Version}
	clients := first.Clients
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for len(seen) < first.Coordinators {
		m, err := sub.NextMsgWithContext(wctx)
		if err != nil {
			break // the others did not answer in time
		}
		var ci CoordinatorInfo
		if Decode(m.Data, &ci) == nil {
			seen[ci.Name] = true
			versions[ci.Name] = ci.Version
			clients = append(clients, ci.Clients...)
		}
	}
	for _, v := range versions {
		if v != first.Version {
			first.Versions = versions
			break
		}
	}
	first.Clients = nil
	if len(seen) >= first.Coordinators {
		clients = slices.Clone(clients)
		slices.Sort(clients)
		first.Clients = slices.Compact(clients)
	}
	return first, nil
}

// AskInfo requests the coordinator's CoordinatorInfo: the first answer,
// as a reader that needs no cluster-wide Clients takes it.
func AskInfo(ctx context.Context, nc *nats.Conn) (CoordinatorInfo, error) {
	return AskInfoAll(ctx, nc, 0)
}

// BootID identifies this boot of the host ("unknown" when unreadable); an
// owner with another boot ID is certainly gone. It is read under procRoot
// so tests can point it elsewhere.
func BootID(procRoot string) string {
	b, err := os.ReadFile(filepath.Join(procRoot, "sys/kernel/random/boot_id"))
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}

// PIDNamespace names this process's pid namespace ("pid:[4026531836]"),
// or "" when it cannot be read. Pids are compared only within one.
func PIDNamespace() string {
	ns, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return ""
	}
	return ns
}

// KnownBootID reports whether id names a boot: two owners that both failed
// to read theirs ("unknown", or empty in records that predate it) are not
// on the same boot, so nothing about one can be proven on the other.
func KnownBootID(id string) bool { return id != "" && id != "unknown" }

// SamePIDSpace reports whether a pid recorded under bootID and pidNS names
// a process that this one (of boot hereBoot, pid namespace herePIDNS) can
// judge: the same boot, known, and the same pid namespace. Only then can
// a pid not running prove its process gone.
func SamePIDSpace(hereBoot, herePIDNS, bootID, pidNS string) bool {
	return KnownBootID(hereBoot) && bootID == hereBoot && herePIDNS != "" && pidNS == herePIDNS
}

// Barrier asks the coordinator on nc to make every write acknowledged so
// far durable. Use it through a Group so that concurrent callers share
// requests.
//
// A coordinator accepts connections a moment before it serves barriers
// (it opens its store and makes the layout durable first): a client that
// connected as soon as it could, `submit` in a script right after
// `coordinator`, got "no responders". Barrier asks again every
// noResponderRetry for up to noResponderWait, or until ctx ends.
func Barrier(ctx context.Context, nc *nats.Conn) error {
	return barrier(ctx, nc, nil)
}

// SettleBarrier is Barrier for a write that may wait a few milliseconds
// to be durable: the final record of a shard whose slot is free already.
// The coordinator lets its syncfs wait for others, so that one serves
// more writes (coordinator's settleGather). A coordinator built before
// this takes it as a Barrier.
func SettleBarrier(ctx context.Context, nc *nats.Conn) error {
	return barrier(ctx, nc, mayGather)
}

// mayGather is the body of a SettleBarrier request.
var mayGather = []byte("gather")

// MayGather reports whether a barrier request's body lets it wait.
func MayGather(body []byte) bool {
	return string(body) == string(mayGather)
}

func barrier(ctx context.Context, nc *nats.Conn, body []byte) error {
	deadline := time.Now().Add(noResponderWait)
	m, err := nc.RequestWithContext(ctx, SubjectSync, body)
	for errors.Is(err, nats.ErrNoResponders) && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: sync barrier: %v (no coordinator answered before)", ErrNotDurable, ctx.Err())
		case <-time.After(noResponderRetry):
		}
		m, err = nc.RequestWithContext(ctx, SubjectSync, body)
	}
	if err != nil {
		return fmt.Errorf("%w: sync barrier: %v", ErrNotDurable, err)
	}
	if reply := string(m.Data); reply != "ok" {
		return fmt.Errorf("%w: sync barrier: %s", ErrNotDurable, strings.TrimPrefix(reply, "error: "))
	}
	return nil
}

// Group runs one function on behalf of many callers (group commit): every
// call waits for a run of Fn that began after the call did, so one fsync
// serves every caller that arrived while the previous one ran. Its
// goroutine runs only while calls are pending; a caller that stops waiting
// (Do's ctx) does not stop a run already started.
type Group struct {
	Fn func() error
	// Gather, when set, is how long Do and Go let a run wait: after their
	// call, and after the previous run ended, so that callers arriving
	// just after share it. It trades each caller's latency for fewer
	// runs. DoWithin and GoWithin give their own; a run starts once the
	// first of its callers is due.
	Gather time.Duration

	mu      sync.Mutex
	running bool
	waiting []waiter
	lastEnd time.Time     // when the last run ended
	asleep  time.Time     // while the loop sleeps: when it wakes
	wake    chan struct{} // a caller due before asleep
}

type waiter struct {
	done   func(error)
	at     time.Time
	gather time.Duration
}

// due is when w lets a run start: gather after its call and after the
// previous run ended.
func (w *waiter) due(lastEnd time.Time) time.Time {
	if w.at.After(lastEnd) {
		return w.at.Add(w.gather)
	}
	return lastEnd.Add(w.gather)
}

// Do waits for a run of Fn that began after the call and returns its error.
func (g *Group) Do(ctx context.Context) error {
	return g.DoWithin(ctx, g.Gather)
}

// DoWithin is Do that lets the run wait at most gather for other callers.
func (g *Group) DoWithin(ctx context.Context, gather time.Duration) error {
	ch := make(chan error, 1)
	g.GoWithin(gather, func(err error) { ch <- err })
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Go is Do without waiting: done is called with the error of a run of Fn
// that began after the call. done must not block.
func (g *Group) Go(done func(error)) {
	g.GoWithin(g.Gather, done)
}

// GoWithin is Go that lets the run wait at most gather for other callers.
func (g *Group) GoWithin(gather time.Duration, done func(error)) {
	w := waiter{done: done, at: time.Now(), gather: gather}
	g.mu.Lock()
	g.waiting = append(g.waiting, w)
	start := !g.running
	g.running = true
	// The loop sleeps until a caller is due; one due sooner wakes it.
	sooner := !start && !g.asleep.IsZero() && w.due(g.lastEnd).Before(g.asleep)
	if g.wake == nil {
		g.wake = make(chan struct{}, 1)
	}
	g.mu.Unlock()
	if start {
		go g.loop()
	} else if sooner {
		select {
		case g.wake <- struct{}{}:
		default:
		}
	}
}

func (g *Group) loop() {
	var timer *time.Timer
	for {
		g.mu.Lock()
		g.asleep = time.Time{}
		if len(g.waiting) == 0 {
			g.running = false
			g.mu.Unlock()
			return
		}
		due := g.waiting[0].due(g.lastEnd)
		for i := 1; i < len(g.waiting); i++ {
			if d := g.waiting[i].due(g.lastEnd); d.Before(due) {
				due = d
			}
		}
		if wait := time.Until(due); wait > 0 {
			g.asleep = due
			g.mu.Unlock()
			if timer == nil {
				timer = time.NewTimer(wait)
			} else {
				timer.Reset(wait)
			}
			select {
			case <-timer.C:
			case <-g.wake:
				timer.Stop()
			}
			continue
		}
		batch := g.waiting
		g.waiting = nil
		g.mu.Unlock()
		err := g.Fn()
		g.mu.Lock()
		g.lastEnd = time.Now()
		g.mu.Unlock()
		for _, w := range batch {
			w.done(err)
		}
	}
}
