package plan

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"

	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker/probe"
)

// Profile is the part of profile.json the plan reads: measured peaks per class.
type Profile struct {
	Classes map[string]Peak `json:"classes"`
	// Job is the JobFingerprint of the spec it measured.
	Job string `json:"job_fingerprint"`
	// Spec is the spec file it measured ("" in older files).
	Spec string `json:"spec,omitempty"`
	// Notes say what its samples could not tell (worker.ProfileReport).
	Notes []string `json:"notes,omitempty"`
}

// JobFingerprint identifies the job a profile measured: the run's
// fingerprint inputs but the manifest (command, env, classes, validator,
// code_rev, the files the command names), without the outlier classes
// SplitOutliers adds (a profile sees the spec before the split, a run
// after it). A measurement holds for any manifest of the same job, and
// for no other job: an edited job may need more memory than its old
// version's peak.
func JobFingerprint(spec *stream.Spec) string {
	s := *spec
	s.Classes = map[string]stream.Class{}
	for name, c := range spec.Classes {
		if base, ok := strings.CutSuffix(name, OutlierSuffix); ok {
			if bc, has := spec.Classes[base]; has && reflect.DeepEqual(bc, c) {
				continue // a copy of its class, as SplitOutliers makes
			}
		}
		s.Classes[name] = c
	}
	return stream.Fingerprint(&s, "")
}

// LoadProfile reads profile.json; a missing file is no profile.
func LoadProfile(path string) (*Profile, error) {
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var p Profile
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &p, nil
}

// PeakAboveMin is the least excess of a measured peak over a reserved one
// that WellAbove counts.
const PeakAboveMin = 16 << 20

// WellAbove says whether got, a peak measured of a shard, is well above
// reserved, the peak admission reserves per shard: by a quarter and by
// PeakAboveMin at least, the margins that keep apart two ways of
// measuring one peak (a cgroup's; sampled RSS, which counts the shared
// libraries of a pipeline's processes once each). Nothing is well above
// an unknown (0) peak.
func WellAbove(got, reserved int64) bool {
	return reserved > 0 && got > reserved+reserved/4 && got-reserved >= PeakAboveMin
}

// Declared is a class's peak from the spec's request.
func Declared(c stream.Class) Peak {
	return Peak{CPU: int64(c.CPUs) * 1000, Memory: c.Memory, GPUs: int64(c.GPUs), VRAM: c.VRAM, Source: "declared (spec)"}
}

// ClassPlan is one class in plan.json.
type ClassPlan struct {
	Class    string   `json:"class"`
	Shards   int      `json:"shards"`
	Cost     int64    `json:"cost"`
	Peak     Peak     `json:"peak"`
	Slots    Slots    `json:"slots"`
	Outliers []string `json:"outliers,omitempty"`
	Blocked  string   `json:"blocked,omitempty"`
}

// Plan is plan.json.
type Plan struct {
	Run      string      `json:"run"`
	Host     string      `json:"host"`
	Budget   Budget      `json:"budget"`
	Hard     Budget      `json:"hard_limits"`
	Classes  []ClassPlan `json:"classes"`
	Blocked  string      `json:"blocked,omitempty"`
	Enforced string      `json:"limits"`
	// ProfileUnused says why profile.json's peaks were not used (and,
	// from makePlan, the command that measures them again).
	ProfileUnused string `json:"profile_unused,omitempty"`
	// ProfileNotes are the notes of the profile whose peaks it uses, such
	// as a class whose shards all had one cost.
	ProfileNotes []string `json:"profile_notes,omitempty"`
}

// OutlierFactor is how many times its class's median a shard may cost
// before it is listed as an outlier.
const OutlierFactor = 4

// Make plans spec's shards on one host: slots from the budget (headroom),
// and a class whose peak exceeds the host's hard limits (capacity) blocks
// the run, naming a shard and the resource, since waiting cannot fix it.
func Make(spec *stream.Spec, man *stream.Manifest, host string, b, hard Budget, prof *Profile, limits string) *Plan {
	p := &Plan{Run: spec.Name, Host: host, Budget: b, Hard: hard, Enforced: limits}
	if prof != nil && prof.Job != JobFingerprint(spec) {
		why := "it measured another version of this job: its command, env, classes, validator, code_rev or a file the command names changed since"
		switch {
		case prof.Job == "":
			why = "it does not say which version of the job it measured (written before 2026-12-01)"
		case prof.Spec != "" && prof.Spec != spec.SpecPath:
			// A profile is kept per run name: another project's job of
			// the same name, or this one moved.
			why = "it measured the job of another spec, " + prof.Spec + " (profiles are kept per run name)"
		}
		p.ProfileUnused = "profile.json is not used: " + why // the caller adds the profile command, which knows the state directory
		prof = nil
	}
	if prof != nil {
		p.ProfileNotes = prof.Notes
	}
	by := map[string][]stream.Shard{}
	for _, sh := range man.Shards {
		by[sh.Class] = append(by[sh.Class], sh)
	}
	classes := make([]string, 0, len(by))
	for c := range by {
		classes = append(classes, c)
	}
	sort.Strings(classes)
	for _, c := range classes {
		shards := by[c]
		cls := spec.Classes[c]
		peak := Declared(cls)
		if prof != nil {
			if m, ok := prof.Classes[c]; ok {
				peak = m
				peak.Source = "measured (profile.json)"
			}
		}
		cp := ClassPlan{Class: c, Shards: len(shards), Peak: peak, Slots: Compute(b, Peak{}, peak, cls.GPUs > 0)}
		costs := make([]int64, len(shards))
		for i, sh := range shards {
			costs[i] = sh.Cost
			cp.Cost += sh.Cost
		}
		for _, i := range Outliers(costs, OutlierFactor) {
			cp.Outliers = append(cp.Outliers, shards[i].ID)
		}
		if ok, why := Fits(hard, peak, cls.GPUs > 0); !ok {
			cp.Blocked = fmt.Sprintf("shard %s (class %s) %s on host %s: no worker here can ever run it", shards[0].ID, c, why, host)
			if p.Blocked == "" {
				p.Blocked = cp.Blocked
			}
		}
		p.Classes = append(p.Classes, cp)
		if cls.Memory == 0 && strings.HasPrefix(limits, "enforced") {
			// Only a declared memory becomes a hard limit: a measured peak
			// is one sample's, and a larger input may need more.
			p.Enforced += fmt.Sprintf("; not for class %s, which declares no memory (watched: admission reserves its peak, nothing caps a shard)", c)
		}
	}
	return p
}

// OutlierSuffix names the class that a class's outliers move to.
const OutlierSuffix = "-outlier"

// SplitOutliers moves each class's outliers (cost above OutlierFactor times
// the class median) to a class of their own, "<class>-outlier", with the
// same request: it gets its own consumer and slots, so one huge shard
// cannot stall the others, and its own measured peak when profiled. The
// split depends only on the spec and manifest, so the run's fingerprint
// does not change with measurements. It returns the classes it created.
func SplitOutliers(spec *stream.Spec, man *stream.Manifest) []string {
	by := map[string][]int{}
	for i, sh := range man.Shards {
		by[sh.Class] = append(by[sh.Class], i)
	}
	var made []string
	for _, class := range slices.Sorted(maps.Keys(by)) {
		if strings.HasSuffix(class, OutlierSuffix) {
			continue
		}
		idx := by[class]
		costs := make([]int64, len(idx))
		for j, i := range idx {
			costs[j] = man.Shards[i].Cost
		}
		out := Outliers(costs, OutlierFactor)
		name := class + OutlierSuffix
		if len(out) == 0 || !stream.ValidClass(name) {
			continue
		}
		if _, exists := spec.Classes[name]; !exists {
			spec.Classes[name] = spec.Classes[class]
		}
		for _, j := range out {
			man.Shards[idx[j]].Class = name
		}
		made = append(made, name)
	}
	return made
}

// Worker is a live worker's hard limits, from its report.
type Worker struct {
	Name string
	// Hard is the worker's capacity, with "scratch" the size of its
	// scratch file system where it reports one.
	Hard Budget
}

// FitsScratch says whether a shard that declares need bytes of scratch
// fits a scratch file system of size total: one that could not hold it
// even empty never runs it. An unknown size judges nothing.
func FitsScratch(total probe.Value, need int64) (bool, string) {
	if need <= 0 || total.IsUnknown() || total.Unlimited || need <= total.N {
		return true, ""
	}
	return false, fmt.Sprintf("declares %s of scratch, more than the whole file system of its scratch directory holds (%s, %s)", stream.FormatSize(need), stream.FormatSize(total.N), total.Source)
}

// FleetBlocked checks each class of the run against every live worker's
// hard limits: a class that fits none blocks the run. With no live worker
// nothing can be judged and nothing blocks (one may join). peaks gives each
// class's peak.
func FleetBlocked(spec *stream.Spec, man *stream.Manifest, peaks map[string]Peak, workers []Worker) string {
	if len(workers) == 0 {
		return ""
	}
	first := map[string]string{}
	for _, sh := range man.Shards {
		if _, ok := first[sh.Class]; !ok {
			first[sh.Class] = sh.ID
		}
	}
	for _, class := range slices.Sorted(maps.Keys(first)) {
		peak := peaks[class]
		gpu := spec.Classes[class].GPUs > 0
		var whys []string
		fits := false
		for _, w := range workers {
			ok, why := Fits(w.Hard, peak, gpu)
			if total, has := w.Hard["scratch"]; ok && has {
				ok, why = FitsScratch(total, spec.Classes[class].Scratch)
			}
			if ok {
				fits = true
				break
			}
			whys = append(whys, w.Name+": "+why)
		}
		if !fits {
			return fmt.Sprintf("shard %s (class %s) fits no live worker: %s", first[class], class, strings.Join(whys, "; "))
		}
	}
	return ""
}
