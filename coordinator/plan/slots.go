package plan

import (
	"fmt"
	"sort"
	"strings"

	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker/probe"
)

// Resources in budget order.
var Resources = []string{"cpu", "memory", "gpus", "vram"}

// Peak is what one shard of a class uses at most, per resource (CPU in
// millicores). Source says whether it was measured or declared.
type Peak struct {
	CPU    int64  `json:"cpu_millicores"`
	Memory int64  `json:"memory"`
	GPUs   int64  `json:"gpus"`
	VRAM   int64  `json:"vram"`
	Source string `json:"source"` // "measured (profile.json)" or "declared (spec)"
}

func (p Peak) get(r string) int64 {
	switch r {
	case "cpu":
		return p.CPU
	case "memory":
		return p.Memory
	case "gpus":
		return p.GPUs
	}
	return p.VRAM
}

// Budget is a host's effective budget per resource.
type Budget map[string]probe.Value

// FromProbe takes the effective lines of a probe budget.
func FromProbe(b probe.Budget) Budget {
	return Budget{"cpu": b.CPU.Effective, "memory": b.Memory.Effective, "gpus": b.GPUs.Effective, "vram": b.VRAM.Effective}
}

// HardFromProbe takes a probe budget's capacity lines: what a host could
// give one shard if nothing else ran.
func HardFromProbe(b probe.Budget) Budget {
	return Budget{"cpu": b.Hard.CPU.Effective, "memory": b.Hard.Memory.Effective, "gpus": b.Hard.GPUs.Effective, "vram": b.Hard.VRAM.Effective}
}

// Slots is the answer for one class on one host.
type Slots struct {
	N           int            `json:"slots"`
	Binding     string         `json:"binding"`
	PerResource map[string]int `json:"per_resource"`
	Reason      string         `json:"reason"`
}

// Unlimited per-resource slots are reported as this many.
const noBound = 1 << 30

// Compute applies the slot formula. needs says which resources the class
// uses (memory and CPU always; GPUs and VRAM when the class asks for GPUs);
// shared is what other work already holds of the budget.
func Compute(b Budget, shared Peak, peak Peak, needsGPU bool) Slots {
	s := Slots{N: noBound, PerResource: map[string]int{}}
	var why []string
	for _, r := range Resources {
		if (r == "gpus" || r == "vram") && !needsGPU {
			continue
		}
		v, ok := b[r]
		p := peak.get(r)
		switch {
		case !ok || v.IsUnknown():
			reason := "not probed"
			if ok {
				reason = v.Unknown
			}
			s.PerResource[r] = 0
			why = append(why, fmt.Sprintf("%s budget unknown (%s)", r, reason))
		case p <= 0 && r != "vram":
			s.PerResource[r] = 0
			why = append(why, fmt.Sprintf("no measured or declared %s peak (run shardpool profile, or declare it in the class)", r))
		case p <= 0 || v.Unlimited:
			s.PerResource[r] = noBound
		default:
			n := (v.N - shared.get(r)) / p
			if n < 0 {
				n = 0
			}
			s.PerResource[r] = int(min(n, noBound))
		}
		if s.PerResource[r] < s.N {
			s.N, s.Binding = s.PerResource[r], r
		}
	}
	if len(why) > 0 {
		// A resource whose formula gives 0 is said too: lifting the
		// missing peak alone would not admit a shard (Unmeasured).
		for _, r := range Resources {
			if n, ok := s.PerResource[r]; ok && n == 0 && b[r].IsKnown() && peak.get(r) > 0 {
				why = append(why, fmt.Sprintf("%s: (%s - %s shared) / %s peak = 0", r, Amount(r, b[r].N), Amount(r, shared.get(r)), Amount(r, peak.get(r))))
			}
		}
		s.N = 0
		s.Reason = strings.Join(why, "; ")
		return s
	}
	if s.N == noBound {
		s.Reason = "no resource bounds this class"
		return s
	}
	v := b[s.Binding]
	r := s.Binding
	s.Reason = fmt.Sprintf("%s binds: (%s - %s shared) / %s peak = %d (budget from %s)", r, Amount(r, v.N), Amount(r, shared.get(r)), Amount(r, peak.get(r)), s.N, v.Source)
	return s
}

// Unmeasured is admission's rule for a class whose memory peak is neither
// measured nor declared while every budget is known: one shard at a time
// until a profile or a declaration says more. Otherwise it returns s
// unchanged and false.
func Unmeasured(s Slots, peak Peak) (Slots, bool) {
	if s.N != 0 || peak.Memory > 0 || strings.Contains(s.Reason, "unknown") {
		return s, false
	}
	for r, n := range s.PerResource {
		if r != "memory" && n == 0 {
			// Another resource admits nothing either (a GPU class on a
			// host without GPUs): one shard would not fit.
			return s, false
		}
	}
	s.N, s.Reason = 1, "one shard at a time: "+s.Reason
	return s, true
}

// Fits reports whether one shard of peak fits the budget at all (with
// nothing else running); it names the first resource that does not.
func Fits(b Budget, peak Peak, needsGPU bool) (bool, string) {
	for _, r := range Resources {
		if (r == "gpus" || r == "vram") && !needsGPU {
			continue
		}
		v, ok := b[r]
		p := peak.get(r)
		if !ok || v.IsUnknown() || v.Unlimited || p <= 0 {
			continue
		}
		if p > v.N {
			of := ""
			if r == "memory" || r == "vram" {
				of = " of " + r
			}
			return false, fmt.Sprintf("needs %s%s, the budget is %s (%s)", Amount(r, p), of, Amount(r, v.N), v.Source)
		}
	}
	return true, ""
}

// Amount is n of resource r as a person reads it: CPUs from millicores
// ("1.50 CPUs"), memory and VRAM as sizes ("64.0MiB"), GPUs counted.
func Amount(r string, n int64) string {
	switch r {
	case "cpu":
		return fmt.Sprintf("%.2f CPUs", float64(n)/1000)
	case "memory", "vram":
		return stream.FormatSize(n)
	case "gpus":
		return fmt.Sprintf("%d GPU(s)", n)
	}
	return fmt.Sprintf("%d %s", n, r)
}

// Outliers returns the indexes of costs above factor times the median:
// shards that would stall a barrier if mixed with normal ones.
func Outliers(costs []int64, factor float64) []int {
	if len(costs) < 4 {
		return nil
	}
	sorted := append([]int64(nil), costs...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	median := sorted[len(sorted)/2]
	var out []int
	for i, c := range costs {
		if median > 0 && float64(c) > factor*float64(median) {
			out = append(out, i)
		}
	}
	return out
}
