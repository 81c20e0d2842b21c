package coordinator

import "time"

// PaceWindow is how far back a Pace looks: long enough to smooth shards
// that end in bursts, short enough to follow a change of pace.
const PaceWindow = 60 * time.Second

// Pace follows how fast a run's shards end (validated, or failed after
// their retries) over the last PaceWindow: run's progress line and the
// tracker (the run record's pace, which status prints) both keep one.
type Pace struct {
	seen []paceSample
}

type paceSample struct {
	at    time.Time
	ended int
}

// Observe notes that ended shards had ended at now, and returns the rate
// over the window (shards a second) and the time left for left more at
// it; ok is false until a few seconds have seen shards end, and once none
// is left.
func (p *Pace) Observe(now time.Time, ended, left int) (perSec float64, eta time.Duration, ok bool) {
	switch n := len(p.seen); {
	case n > 0 && ended < p.seen[n-1].ended:
		// Fewer ended than before (failed shards requeued): a new start.
		p.seen = append(p.seen[:0], paceSample{now, ended})
	case n == 0 || now.Sub(p.seen[n-1].at) >= time.Second:
		p.seen = append(p.seen, paceSample{now, ended})
	}
	// Keep one sample at or beyond the window's start.
	for len(p.seen) > 2 && now.Sub(p.seen[1].at) >= PaceWindow {
		p.seen = p.seen[1:]
	}
	first := p.seen[0]
	span := now.Sub(first.at)
	done := ended - first.ended
	if span < 3*time.Second || done <= 0 || left == 0 {
		return 0, 0, false
	}
	perSec = float64(done) / span.Seconds()
	return perSec, time.Duration(float64(left) / perSec * float64(time.Second)), true
}
