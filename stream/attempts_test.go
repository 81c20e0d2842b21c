package stream

import (
	"slices"
	"testing"
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
