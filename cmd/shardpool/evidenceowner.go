package main

import (
	"fmt"
	"path/filepath"

	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/stream"
)

// lastSummary is what the evidence folder dir says of its run last: the
// newer of final.json and progress.json (nil where neither is readable),
// and the forget noted after it (nil where the run was not forgotten
// since, or a run of the name came after the forget).
func lastSummary(dir string) (*coordinator.RunSummary, *coordinator.ForgottenNote) {
	var sum *coordinator.RunSummary
	if f, err := coordinator.ReadFinal(dir); err == nil && f != nil {
		sum = &f.RunSummary
	}
	if p, err := coordinator.ReadProgress(dir); err == nil && p != nil && (sum == nil || p.Written.After(sum.Written)) {
		sum = &p.RunSummary
	}
	if sum == nil {
		return nil, nil
	}
	return sum, coordinator.ForgottenSince(dir, sum.Written)
}

// notAnotherJobs refuses to write file (profile.json, plan.json) into
// the evidence folder of run spec.Name under the state directory data
// when that folder is another job's: a run of the name, not forgotten,
// with its outputs elsewhere than this spec's. Writing it would replace
// that job's file (its next plan would find the peaks of this spec, and
// run one shard at a time where its memory is not declared), for a job
// that `run` refuses in that state directory anyway (coordinator's
// movedOutput: another job of the same name).
func notAnotherJobs(data string, spec *stream.Spec, file string) error {
	dir := filepath.Join(data, "runs", spec.Name)
	sum, gone := lastSummary(dir)
	if sum == nil || gone != nil || sum.Output == "" || filepath.Clean(sum.Output) == spec.Output {
		return nil
	}
	abs, err := filepath.Abs(data)
	if err != nil {
		abs = data
	}
	return fmt.Errorf("%s: field %q: %w: the evidence of run %s in %s is another job's: its outputs are in %s (%s, %d of %d shard(s) validated, recorded %s), "+
		"and this spec names %s; %s written there would replace that job's, and `shardpool run` of this spec with this state directory is refused for the same reason. "+
		"Give this job another name, use another --data, or, to reuse the name, forget the old run first (shardpool forget --data %s %s: its outputs and evidence stay)",
		spec.At("", "output"), "output", coordinator.ErrSpecConflict, spec.Name, dir, sum.Output, sum.State, sum.Counts.Validated, sum.Counts.Total,
		sum.Written.Local().Format("2006-01-02 15:04:05"), spec.Output, file, shellQuote(abs), spec.Name)
}
