package stream

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// TestOpenAttemptsNamesEveryAttemptWithoutOutcome: the drill and the soak
// find a record that ended with an attempt left open through
// OpenAttempts, wherever in the record it is; CloseLost closes only the
// running one.
func TestOpenAttemptsNamesEveryAttemptWithoutOutcome(t *testing.T) {
	r := ShardRecord{State: ShardRunning, Attempts: []Attempt{
		{N: 1, Worker: "a", Outcome: OutcomeOK},
		{N: 2, Worker: "b"},
		{N: 3, Worker: "c", Outcome: OutcomeDiscarded},
		{N: 4, Worker: "d"},
	}}
	if got, want := r.OpenAttempts(), []string{"attempt 2 of b", "attempt 4 of d"}; !slices.Equal(got, want) {
		t.Fatalf("open attempts %q, want %q", got, want)
	}
	r.CloseLost()
	if r.Attempts[3].Outcome != OutcomeLost {
		t.Fatalf("the running attempt after CloseLost: %q, want lost", r.Attempts[3].Outcome)
	}
	if got, want := r.OpenAttempts(), []string{"attempt 2 of b"}; !slices.Equal(got, want) {
		t.Fatalf("open attempts after CloseLost %q, want %q", got, want)
	}
	if got := (&ShardRecord{State: ShardValidated}).OpenAttempts(); got != nil {
		t.Fatalf("a record of no attempts: %q open, want none", got)
	}
}

// TestCheckClosedNamesWhatIsLeftOpen: the check the drill and the soak
// make of each shard's last record once a run is over.
func TestCheckClosedNamesWhatIsLeftOpen(t *testing.T) {
	enc := func(r ShardRecord) []byte {
		b, err := Encode(&r)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	closed := enc(ShardRecord{State: ShardValidated, Attempts: []Attempt{{N: 1, Worker: "a", Outcome: OutcomeLost}, {N: 2, Worker: "b", Outcome: OutcomeOK}}})
	if err := CheckClosed(closed); err != nil {
		t.Fatalf("every attempt closed: %v, want nil", err)
	}
	open := enc(ShardRecord{State: ShardValidated, Attempts: []Attempt{{N: 1, Worker: "a", Outcome: OutcomeDiscarded}, {N: 2, Worker: "b"}}})
	if err := CheckClosed(open); err == nil || err.Error() != "attempt 2 of b left with no outcome, under validated" {
		t.Fatalf("attempt 2 open: %v", err)
	}
	if err := CheckClosed([]byte("{")); err == nil || !strings.HasPrefix(err.Error(), "record: ") {
		t.Fatalf("a record that does not decode: %v", err)
	}
}

// TestShardTimesReadTheValidatingAttempt: what a validated shard took is
// its last attempt's, where that ended ok with its command timed; its
// peak is the cgroup's where measured, else the command's RSS; a shard
// validated with no such attempt (an output found committed) has none.
func TestShardTimesReadTheValidatingAttempt(t *testing.T) {
	rec := func(attempts ...Attempt) []byte {
		b, err := Encode(&ShardRecord{Run: "r", ID: "s", State: ShardValidated, Attempts: attempts})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	failed := Attempt{N: 1, Outcome: OutcomeExit, Duration: Seconds(9 * time.Second), PeakRSS: 9 << 20}
	for _, c := range []struct {
		name string
		data []byte
		d    time.Duration
		peak int64
		ok   bool
	}{
		{"cgroup peak", rec(failed, Attempt{N: 2, Outcome: OutcomeOK, Duration: Seconds(1500 * time.Millisecond), PeakRSS: 1 << 20, PeakMemory: 3 << 20}), 1500 * time.Millisecond, 3 << 20, true},
		{"RSS alone", rec(Attempt{N: 1, Outcome: OutcomeOK, Duration: Seconds(time.Second), PeakRSS: 2 << 20}), time.Second, 2 << 20, true},
		{"no attempt", rec(), 0, 0, false},
		{"closed lost, found committed", rec(Attempt{N: 1, Outcome: OutcomeLost}), 0, 0, false},
		{"ok, untimed", rec(Attempt{N: 1, Outcome: OutcomeOK}), 0, 0, false},
	} {
		var tm ShardTimes
		if err := Decode(c.data, &tm); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if d, peak, ok := tm.Validated(); d != c.d || peak != c.peak || ok != c.ok {
			t.Errorf("%s: %v, %d, %v; want %v, %d, %v", c.name, d, peak, ok, c.d, c.peak, c.ok)
		}
	}
}

// TestNearestRankIsTheLowerMedian: the quantiles final.json's timing and
// profile's sustained figures both give: the lower median of an even
// count, the 95th percentile of 20 values the 19th, of one value that
// value.
func TestNearestRankIsTheLowerMedian(t *testing.T) {
	var twenty []float64
	for i := 1; i <= 20; i++ {
		twenty = append(twenty, float64(i))
	}
	for _, c := range []struct {
		vs        []float64
		q         float64
		want      float64
		aboutWhat string
	}{
		{[]float64{1, 2, 3, 4}, 0.5, 2, "median of 4"},
		{[]float64{1, 2, 3}, 0.5, 2, "median of 3"},
		{twenty, 0.95, 19, "p95 of 20"},
		{twenty, 1, 20, "maximum"},
		{[]float64{7}, 0.95, 7, "p95 of one"},
		{[]float64{7}, 0.01, 7, "a low quantile of one"},
	} {
		if got := NearestRank(c.vs, c.q); got != c.want {
			t.Errorf("%s: NearestRank(%v, %v) = %v, want %v", c.aboutWhat, c.vs, c.q, got, c.want)
		}
	}
}
