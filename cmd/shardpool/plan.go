package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"

	"github.com/shardpool/shardpool/checkpoint"
	"github.com/shardpool/shardpool/coordinator/plan"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker"
	"github.com/shardpool/shardpool/worker/probe"
)

// makePlan plans the run on this host; savePlan writes it to the run's
// evidence.
func makePlan(ctx context.Context, spec *stream.Spec, man *stream.Manifest, data string) (*plan.Plan, error) {
	pr, err := probe.New(probe.Config{})
	if err != nil {
		return nil, err
	}
	snap, err := pr.Snapshot(ctx, nil)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(data, "runs", spec.Name)
	prof, err := plan.LoadProfile(filepath.Join(dir, "profile.json"))
	if err != nil {
		return nil, err
	}
	p := plan.Make(spec, man, snap.Hostname, plan.FromProbe(snap.Budget), plan.HardFromProbe(snap.Budget), prof, worker.LimitsMode())
	if p.ProfileUnused != "" {
		// The profile that replaces it goes where this plan reads it.
		p.ProfileUnused += fmt.Sprintf("; run `%s` again", profileCommand(spec, data))
	}
	return p, nil
}

// savePlan writes plan.json to the evidence of run name. `run` calls it
// once its submission has been taken (or the plan blocks the run before
// queuing): a submission the store refuses, such as another job of the
// same name, leaves the evidence of the run it names as it was.
func savePlan(data, name string, p *plan.Plan) error {
	dir := filepath.Join(data, "runs", name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, _ := json.MarshalIndent(p, "", "  ")
	return checkpoint.WriteFile(filepath.Join(dir, "plan.json"), append(b, '\n'))
}

func printPlan(w io.Writer, p *plan.Plan) {
	// A VRAM column where a class asks for GPUs: a shard's over all its
	// GPUs, as the spec's vram is (admission looks for its share free on
	// each device it places the shard on).
	gpu := false
	for _, c := range p.Classes {
		gpu = gpu || c.Peak.GPUs > 0
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	head := "CLASS\tSHARDS\tPEAK MEMORY\tPEAK CPUS\tGPUS"
	if gpu {
		head += "\tVRAM"
	}
	fmt.Fprintln(tw, head+"\tSLOTS\tWHY\tOUTLIERS")
	for _, c := range p.Classes {
		out := "-"
		if len(c.Outliers) > 0 {
			out = fmt.Sprintf("%d (%v)", len(c.Outliers), c.Outliers[:min(3, len(c.Outliers))])
		}
		// As admission does: a class with no memory peak runs one shard
		// at a time (plan.json keeps the computed 0 and its reason).
		slots, _ := plan.Unmeasured(c.Slots, c.Peak)
		mem := stream.FormatSize(c.Peak.Memory)
		if c.Peak.Memory <= 0 {
			mem = "unknown"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%.2f\t%d", c.Class, c.Shards, mem, float64(c.Peak.CPU)/1000, c.Peak.GPUs)
		if gpu {
			vram := "-"
			switch {
			case c.Peak.GPUs > 0 && c.Peak.VRAM > 0:
				vram = stream.FormatSize(c.Peak.VRAM)
			case c.Peak.GPUs > 0:
				vram = "not declared"
			}
			fmt.Fprintf(tw, "\t%s", vram)
		}
		fmt.Fprintf(tw, "\t%d\t%s [%s]\t%s\n", slots.N, slots.Reason, c.Peak.Source, out)
	}
	tw.Flush()
	fmt.Fprintf(w, "limits: %s\n", p.Enforced)
	if p.ProfileUnused != "" {
		fmt.Fprintln(w, p.ProfileUnused)
	}
	for _, n := range p.ProfileNotes {
		fmt.Fprintln(w, profileNote(n))
	}
	if p.Blocked != "" {
		fmt.Fprintf(w, "BLOCKED: %s\n", p.Blocked)
	}
}

// profileNote is a note of the profile whose peaks plan, run and submit
// go by (worker.ProfileReport's Notes), as each of them repeats it.
func profileNote(n string) string { return "profile.json note: " + n }

func cmdPlan(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("plan", "shardpool plan [--data DIR] [--json] SPEC", stderr)
	data := fs.String("data", worker.DefaultStateDir(), "state `DIR` (reads runs/<run>/profile.json, writes plan.json)")
	asJSON := fs.Bool("json", false, "print plan.json")
	spec, man, err := parseSpec(fs, args)
	if err != nil {
		return err
	}
	plan.SplitOutliers(spec, man)
	p, err := makePlan(ctx, spec, man, *data)
	if err != nil {
		return err
	}
	// The plan is shown either way; another job's evidence keeps its own.
	if err := notAnotherJobs(*data, spec, "plan.json"); err != nil {
		fmt.Fprintf(stderr, "plan.json not written: %v\n", err)
	} else if err := savePlan(*data, spec.Name, p); err != nil {
		return err
	}
	if *asJSON {
		if err := writeJSON(stdout, p); err != nil {
			return err
		}
	} else {
		printPlan(stdout, p)
	}
	if p.Blocked != "" {
		if *asJSON {
			return exitErr{code: exitBlocked, msg: "run " + spec.Name + " is BLOCKED: " + p.Blocked}
		}
		return blockedErr(stdout, stderr, "run "+spec.Name+" is BLOCKED", p.Blocked)
	}
	return nil
}
