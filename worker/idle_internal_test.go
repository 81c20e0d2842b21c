package worker

import (
	"testing"

	"github.com/shardpool/shardpool/stream"
)

// TestKeptByAPeer: an idle worker leaves the class's shards out to a live
// peer whose report says it stays for them and whose name sorts first;
// not to one that drains, serves other classes only, stays for another
// class, or merely looks idle.
func TestKeptByAPeer(t *testing.T) {
	keeps := func(name string, classes ...string) stream.WorkerReport {
		return stream.WorkerReport{Name: name, Slots: map[string]int{"cpu": 2}, Keeping: classes}
	}
	draining := keeps("a", "cpu")
	draining.Draining = "SIGUSR1"
	other := keeps("a", "cpu")
	other.Slots = map[string]int{"gpu": 1}
	each := keeps("a", "cpu")
	each.Slots, each.SlotsEach = nil, 2
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
		{"the peer first serves another class only", []stream.WorkerReport{other}, ""},
		{"the peer first serves each class as it appears", []stream.WorkerReport{each}, "a"},
	} {
		if got := keptBy("b", c.peers, "cpu"); got != c.want {
			t.Errorf("%s: kept by %q, want %q", c.name, got, c.want)
		}
	}
}
