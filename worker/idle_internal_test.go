package worker

import (
	"testing"
	"time"

	"github.com/shardpool/shardpool/stream"
)

// TestKeptByAPeer: an idle worker leaves the class's shards out to a live
// peer whose report says it stays for them and whose name sorts first,
// or to an idle one that serves until stopped; not to one that drains or
// stops, serves other classes only, stays for another class, merely looks
// idle, or serves until stopped but runs a shard.
func TestKeptByAPeer(t *testing.T) {
	keeps := func(name string, classes ...string) stream.WorkerReport {
		return stream.WorkerReport{Name: name, Slots: map[string]int{"cpu": 2}, Keeping: classes}
	}
	draining := keeps("a", "cpu")
	draining.Draining = "SIGUSR1"
	stopping := keeps("a", "cpu")
	stopping.Stopping = "SIGTERM"
	other := keeps("a", "cpu")
	other.Slots = map[string]int{"gpu": 1}
	each := keeps("a", "cpu")
	each.Slots, each.SlotsEach = nil, 2
	stays := keeps("z")
	stays.Stays = true
	staysDraining := stays
	staysDraining.Draining = "SIGUSR1"
	staysStopping := stays
	staysStopping.Stopping = "SIGTERM"
	staysBusy := stays
	staysBusy.Running = map[string]int{"cpu": 1}
	staysOther := stays
	staysOther.Slots = map[string]int{"gpu": 1}
	for _, c := range []struct {
		name  string
		peers []stream.WorkerReport
		want  string
	}{
		{"alone", nil, ""},
		{"a peer sorting first stays", []stream.WorkerReport{keeps("c", "cpu"), keeps("a", "cpu")}, "a"},
		{"the peers that stay sort after", []stream.WorkerReport{keeps("c", "cpu"), keeps("d", "cpu")}, ""},
		{"the peer first is idle but does not say it stays", []stream.WorkerReport{keeps("a")}, ""},
		{"the peer first stays for another class", []stream.WorkerReport{keeps("a", "io")}, ""},
		{"the peer first drains", []stream.WorkerReport{draining}, ""},
		{"the peer first stops", []stream.WorkerReport{stopping}, ""},
		{"the peer first serves another class only", []stream.WorkerReport{other}, ""},
		{"the peer first serves each class as it appears", []stream.WorkerReport{each}, "a"},
		{"a peer that serves until stopped, whatever its name", []stream.WorkerReport{stays}, "z"},
		{"a peer that serves until stopped but runs a shard", []stream.WorkerReport{staysBusy}, ""},
		{"a peer that serves until stopped but drains", []stream.WorkerReport{staysDraining}, ""},
		{"a peer that serves until stopped but stops", []stream.WorkerReport{staysStopping}, ""},
		{"a peer that serves until stopped, of another class", []stream.WorkerReport{staysOther}, ""},
	} {
		if got := keptBy("b", c.peers, "cpu"); got != c.want {
			t.Errorf("%s: kept by %q, want %q", c.name, got, c.want)
		}
	}
}

// TestStaysInTheReport: a worker says it stays (serves until stopped)
// only without --idle-exit, and not while it holds its fetches, drains or
// stops.
func TestStaysInTheReport(t *testing.T) {
	for _, c := range []struct {
		name          string
		idle          time.Duration
		held, drained string
		stopped       string
		want          bool
	}{
		{"serves until stopped", 0, "", "", "", true},
		{"has --idle-exit", time.Minute, "", "", "", false},
		{"holds its fetches", 0, "held", "", "", false},
		{"drains", 0, "", "SIGUSR1", "", false},
		{"stops", 0, "", "", "SIGTERM", false},
	} {
		w := &Worker{cfg: Config{IdleExit: c.idle}, loneWhy: c.held, drainWhy: c.drained, stopWhy: c.stopped}
		if got := w.snapshot().Stays; got != c.want {
			t.Errorf("%s: stays %v, want %v", c.name, got, c.want)
		}
	}
}
