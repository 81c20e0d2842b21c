package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/shardpool/shardpool/checkpoint"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker"
	"github.com/shardpool/shardpool/worker/probe"
)

func cmdProfile(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("profile", "shardpool profile [--sweep] [--data DIR] [--json] SPEC", stderr)
	data := fs.String("data", worker.DefaultStateDir(), "state `DIR` (writes runs/<run>/profile.json)")
	sweep := fs.Bool("sweep", false, "raise concurrency 1, 2, 4, ... while throughput improves by more than 10%")
	asJSON := fs.Bool("json", false, "print profile.json")
	spec, man, err := parseSpec(fs, args)
	if err != nil {
		return err
	}
	dir := filepath.Join(*data, "runs", spec.Name)
	// Before any sample runs: its profile.json could not be written.
	if err := notAnotherJobs(*data, spec, "profile.json"); err != nil {
		return err
	}
	pol, err := probe.LoadPolicy(policyPath(""))
	if err != nil {
		return err
	}
	base, err := worker.ScratchBase(pol)
	if err != nil {
		return err
	}
	scratch, err := os.MkdirTemp(base, "shardpool-profile-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(scratch)
	rep, perr := worker.Profile(ctx, worker.ProfileConfig{Spec: spec, Manifest: man, Scratch: scratch, LogDir: filepath.Join(dir, "profile-logs"), Sweep: *sweep, AdoptOrphans: true})
	if rep != nil {
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.MkdirAll(dir, 0o755); err == nil {
			if err := checkpoint.WriteFile(filepath.Join(dir, "profile.json"), append(b, '\n')); err != nil {
				return err
			}
		}
		if *asJSON {
			writeJSON(stdout, rep)
		} else {
			printProfile(stdout, rep)
			if len(spec.Profile.Malformed) == 0 && rep.Error == "" {
				// The fourth kind of sample is the user's to name.
				fmt.Fprintf(stdout, "malformed: none declared; to check that bad input fails cleanly (non-zero, within the timeout), add to %s:\n  [profile]\n  malformed = [\"PATH\"]\n", spec.SpecPath)
			}
			fmt.Fprintf(stdout, "profile.json: %s\n", filepath.Join(dir, "profile.json"))
		}
	}
	if errors.Is(perr, worker.ErrProfile) {
		return exitErr{code: exitFailure, msg: perr.Error()}
	}
	return perr
}

func printProfile(w io.Writer, r *worker.ProfileReport) {
	// The GPU columns where a sample's class has GPUs or a sample's VRAM
	// was measured; a figure NVML could not give is "unknown" in the
	// table and its reason said once below it.
	gpu := false
	for _, s := range r.Samples {
		if _, err := strconv.ParseInt(s.PeakVRAM, 10, 64); err == nil || r.Classes[s.Class].GPUs > 0 {
			gpu = true
		}
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	head := "SAMPLE\tSHARD\tCOST\tSECONDS\tCOST/S\tPEAK MEMORY\tCPU DUTY"
	if gpu {
		head += "\tPEAK VRAM\tGPU DUTY"
	}
	fmt.Fprintln(tw, head+"\tDISK READ\tDISK WRITE\tOUTPUT\tOUTCOME")
	var unknownGPU []string           // NVML's reasons, in the order first met
	bySample := map[string][]string{} // the samples each reason is of
	for _, s := range r.Samples {
		if s.Outcome == stream.OutcomeStart {
			// Its command never ran: nothing was measured.
			fmt.Fprintf(tw, "%s\t%s\t%d\t-\t-\t-\t-", s.Kind, s.ID, s.Cost)
			if gpu {
				fmt.Fprint(tw, "\t-\t-")
			}
			fmt.Fprintf(tw, "\t-\t-\t-\t%s\n", outcomeText(s.Outcome, s.Reason))
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.3f\t%.0f\t%s\t%.2f", s.Kind, s.ID, s.Cost, s.Seconds, s.ItemsPerSec, peakText(s.PeakMemory), s.CPUDuty)
		if gpu {
			vram := gpuText(s.PeakVRAM)
			if n, err := strconv.ParseInt(s.PeakVRAM, 10, 64); err == nil {
				vram = stream.FormatSize(n)
			}
			fmt.Fprintf(tw, "\t%s\t%s", vram, gpuText(s.GPUDuty))
			for _, f := range []string{s.PeakVRAM, s.GPUDuty} {
				if why, ok := strings.CutPrefix(f, "unknown: "); ok {
					if bySample[why] == nil {
						unknownGPU = append(unknownGPU, why)
					}
					if k := bySample[why]; len(k) == 0 || k[len(k)-1] != s.Kind {
						bySample[why] = append(k, s.Kind)
					}
				}
			}
		}
		fmt.Fprintf(tw, "\t%s\t%s\t%s\t%s\n", stream.FormatSize(s.ReadBytes), stream.FormatSize(s.WriteBytes), stream.FormatSize(s.OutputBytes), outcomeText(s.Outcome, s.Reason))
	}
	tw.Flush()
	for _, why := range unknownGPU {
		fmt.Fprintf(w, "peak VRAM and GPU duty unknown (%s): %s\n", strings.Join(bySample[why], ", "), why)
	}
	for _, s := range r.Samples {
		if s.LeftRunning != "" {
			fmt.Fprintf(w, "%s %s: %s (a run kills them too when each attempt ends)\n", s.Kind, s.ID, s.LeftRunning)
		}
	}
	// Said of the first sample whose command ran; none ran where the
	// first could not start (its class's GPUs not to be had here).
	for _, s := range r.Samples {
		if s.Outcome != stream.OutcomeStart && s.PeakSource != "" {
			fmt.Fprintf(w, "peak memory measured by: %s\n", s.PeakSource)
			fmt.Fprintln(w, "disk read and write: what the command's processes read from and wrote to storage (getrusage's blocks; reads the page cache served are not counted)")
			break
		}
	}
	if s := r.Sustained; s != nil {
		fmt.Fprintf(w, "sustained: %d shards, p50 %s, p95 %s, %s between shards\n", s.Shards, shardSeconds(s.P50), shardSeconds(s.P95), shardSeconds(s.Overhead))
	}
	if o := r.Overhead; o != nil {
		fmt.Fprintf(w, "profiler overhead: %.3fs with sampling, %.3fs without (%+.3fs)\n", o.With, o.Without, o.Diff)
	}
	for _, p := range r.Sweep {
		fmt.Fprintf(w, "sweep: concurrency %d, %d shards in %.2fs, %.0f cost/s\n", p.Concurrency, p.Shards, p.Seconds, p.Throughput)
	}
	if r.SweepStop != "" {
		fmt.Fprintf(w, "sweep stopped: %s; knee at %d\n", r.SweepStop, r.Knee)
	}
	for c, p := range r.Classes {
		mem := stream.FormatSize(p.Memory)
		if p.Memory <= 0 {
			mem = "unknown (no sample's peak was caught; admission uses the declared memory)"
		}
		gpus := ""
		if p.GPUs > 0 {
			gpus = fmt.Sprintf(", %d GPU(s) with %s of VRAM over them (as declared, or as measured where above it)", p.GPUs, stream.FormatSize(p.VRAM))
		}
		fmt.Fprintf(w, "class %s: measured peak memory %s, cpu %.2f%s\n", c, mem, float64(p.CPU)/1000, gpus)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	if r.Error != "" {
		fmt.Fprintf(w, "STOPPED: %s\n", r.Error)
	}
}

// outcomeText is a sample's outcome and its reason, the outcome's word
// said once: "exit status 5; last output: ..." for outcome exit, not
// "exit exit status 5".
func outcomeText(outcome, reason string) string {
	switch {
	case reason == "":
		return outcome
	case strings.HasPrefix(reason, outcome):
		return reason
	}
	return outcome + ": " + reason
}

// gpuText is a sample's GPU figure as the table shows it: "unknown" for
// one NVML could not give (its reason is said below the table), "-" for
// none.
func gpuText(f string) string {
	switch {
	case strings.HasPrefix(f, "unknown"):
		return "unknown"
	case f == "":
		return "-"
	}
	return f
}

// peakText is a sample's peak memory; 0 means none was caught (a command
// that ended before the first look, where no cgroup measures it).
func peakText(n int64) string {
	if n <= 0 {
		return "unknown"
	}
	return stream.FormatSize(n)
}
