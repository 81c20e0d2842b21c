package worker

import (
	"testing"
	"time"
)

// TestInfoMissesWarnOnlyPastTheGrace: asks for the coordinator's info that
// find no responder are a restart's moment (logged at debug) until they
// have gone on for infoMissGrace; an answer starts the count afresh.
func TestInfoMissesWarnOnlyPastTheGrace(t *testing.T) {
	w := &Worker{}
	// The first miss starts the count; the second is within it.
	if first, second := w.infoMissRecent(), w.infoMissRecent(); !first || !second {
		t.Fatalf("misses just begun are not recent: first %v, second %v", first, second)
	}
	w.infoMissedAt.Store(time.Now().Add(-infoMissGrace - time.Second).UnixNano())
	if w.infoMissRecent() {
		t.Fatalf("misses for longer than %s are still recent", infoMissGrace)
	}
	w.infoMissedAt.Store(0) // an answer (learnCoordinator)
	if !w.infoMissRecent() {
		t.Fatal("a miss after an answer is not recent")
	}
}
