package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardpool/shardpool/checkpoint"
	"github.com/shardpool/shardpool/coordinator/plan"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker"
)

// workerOverhead is what a node's allocation holds beyond its slots'
// peaks: the worker process and its commits (about 30 MiB measured), and
// room so that N slots of the peak fit in the allocation's memory budget.
const workerOverhead = 256 << 20

// sbatchSignalMax is the largest lead Slurm's --signal takes (seconds).
const sbatchSignalMax = 65535

// allocation is what one node asks Slurm for: one worker, slots shards of
// the most demanding class at once.
type allocation struct {
	CPUs   int
	Memory int64 // 0: not asked (the partition's default)
	GPUs   int
	Notes  []string
}

// sizeAllocation asks for slots times each class's peak (measured in
// profile.json where it holds for this job, else declared, or what the
// run's shards reached where that is well above it: seen, the run
// record's peaks_seen), the largest over the run's classes, plus
// workerOverhead of memory.
func sizeAllocation(spec *stream.Spec, man *stream.Manifest, prof *plan.Profile, seen map[string]stream.PeakSeen, slots int) allocation {
	var a allocation
	classes := map[string]bool{}
	for _, sh := range man.Shards {
		classes[sh.Class] = true
	}
	unknown := []string{}
	for _, c := range slices.Sorted(maps.Keys(classes)) {
		cls := spec.Classes[c]
		mem, from := cls.Memory, "declared"
		if prof != nil {
			if m, ok := prof.Classes[c]; ok && m.Memory > 0 {
				mem, from = m.Memory, "measured (profile.json)"
			}
		}
		if p := seen[c]; plan.WellAbove(p.Bytes, mem) {
			// As the workers' admission does (docs/admission.md).
			a.Notes = append(a.Notes, fmt.Sprintf("class %s: sized by the %s its shard %s reached in this run (the run record's peaks_seen), above the %s %s",
				c, stream.FormatSize(p.Bytes), p.Shard, stream.FormatSize(mem), from))
			mem = p.Bytes
		}
		a.CPUs = max(a.CPUs, slots*max(cls.CPUs, 1))
		a.GPUs = max(a.GPUs, slots*cls.GPUs)
		if mem <= 0 {
			unknown = append(unknown, c)
			continue
		}
		a.Memory = max(a.Memory, int64(slots)*mem)
	}
	if len(unknown) > 0 {
		a.Notes = append(a.Notes, fmt.Sprintf("class %s: no memory peak, measured or declared: each worker runs one of its shards at a time (run `shardpool profile %s`, or declare memory in [class.%s])",
			strings.Join(unknown, ", "), shellQuote(spec.SpecPath), unknown[0]))
	}
	if a.Memory > 0 {
		a.Memory += workerOverhead
	} else {
		a.Notes = append(a.Notes, "no --mem: the allocation takes the partition's default memory")
	}
	return a
}

// runPeaks is the peaks_seen of the run's record at the coordinator (a
// second sbatch of a run under way: nodes sized by what its shards
// reached), nil where the run is not there yet, is another version of the
// job, or the coordinator does not answer from here within a few seconds
// (--server is the URL as the compute nodes reach it), which it says.
func runPeaks(ctx context.Context, server string, acc access, spec *stream.Spec, man *stream.Manifest, stderr io.Writer) map[string]stream.PeakSeen {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var r stream.RunRecord
	err := func() error {
		nc, js, err := connect(ctx, server, &acc, "shardpool sbatch", 0, io.Discard, nats.Timeout(3*time.Second))
		if err != nil {
			return err
		}
		defer nc.Close()
		b, err := stream.WaitBuckets(ctx, js, 3*time.Second)
		if err != nil {
			return err
		}
		e, err := b.Runs.Get(ctx, spec.Name)
		if err != nil {
			return err
		}
		return stream.Decode(e.Value(), &r)
	}()
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return nil // not submitted yet
	case err != nil:
		fmt.Fprintf(stderr, "sbatch: the run's record could not be read (%v): sizing without the peaks its shards reached\n", err)
		return nil
	case r.Fingerprint != stream.Fingerprint(spec, man.Hash):
		return nil
	}
	return r.PeaksSeen
}

// slurmTime spells d as Slurm's D-HH:MM:SS, rounded up to the second.
func slurmTime(d time.Duration) string {
	s := int64((d + time.Second - 1) / time.Second)
	return fmt.Sprintf("%d-%02d:%02d:%02d", s/86400, s%86400/3600, s%3600/60, s%60)
}

// defaultWarn is how long before the time limit the workers are warned:
// the longest per-attempt time of the run's classes and a minute for the
// commit, or 10 minutes where no class has one.
func defaultWarn(spec *stream.Spec, man *stream.Manifest) time.Duration {
	var longest time.Duration
	for _, sh := range man.Shards {
		longest = max(longest, spec.TimeoutFor(sh.Class))
	}
	if longest == 0 {
		return 10 * time.Minute
	}
	return longest + time.Minute
}

func cmdSbatch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var extra []string
	if i := slices.Index(args, "--"); i >= 0 {
		args, extra = args[:i], args[i+1:]
	}
	fs := newFlags("sbatch", "shardpool sbatch --server URL [--nodes N] [--slots N] [--time D] [--warn D] [--dry-run] SPEC [-- SBATCH-OPTION...]", stderr)
	server := fs.String("server", "", "coordinator `URL` the workers connect to, as the compute nodes reach it (several, comma-separated, are tried in turn)")
	nodes := fs.Int("nodes", 1, "`N` nodes, one worker on each")
	slots := fs.Int("slots", 1, "`N` shards at once per node: each node asks for N times the peak of the run's most demanding class (CPUs, memory, GPUs)")
	limit := fs.Duration("time", 0, "the job's time limit (sbatch --time); 0: the partition's default")
	warn := fs.Duration("warn", 0, "how long before the time limit Slurm sends SIGUSR1, on which each worker fetches no more and finishes what runs (default: the longest per-attempt time of the run's classes plus 1m; 10m where none is set)")
	idle := fs.Duration("idle-exit", 2*time.Minute, "a worker that has had nothing to run for this long exits, releasing its node (0: it serves until the time limit)")
	data := fs.String("data", worker.DefaultStateDir(), "`DIR` for the batch script, the sbatch command and Slurm's output (runs/<run>/slurm/), and where profile.json is read; put it where the compute nodes can write")
	dry := fs.Bool("dry-run", false, "print the sbatch command and the script; submit nothing")
	acc := registerAccess(fs)
	spec, man, err := parseSpec(fs, args)
	if err != nil {
		return err
	}
	switch {
	case *server == "":
		return exitErr{code: exitUsage, msg: "sbatch: --server is required: the coordinator's URL as the compute nodes reach it (not 127.0.0.1)"}
	case *nodes < 1:
		return exitErr{code: exitUsage, msg: fmt.Sprintf("sbatch: --nodes %d: want at least 1", *nodes)}
	case *slots < 1:
		return exitErr{code: exitUsage, msg: fmt.Sprintf("sbatch: --slots %d: want at least 1", *slots)}
	case *limit < 0 || *warn < 0 || *idle < 0:
		return exitErr{code: exitUsage, msg: "sbatch: --time, --warn and --idle-exit cannot be negative"}
	}
	for _, one := range strings.Split(*server, ",") {
		if u, err := url.Parse(one); err == nil && (u.Hostname() == "127.0.0.1" || u.Hostname() == "localhost" || u.Hostname() == "::1") {
			fmt.Fprintf(stderr, "sbatch: --server %s is loopback: only a worker on this host reaches it\n", redactURL(one))
		}
	}
	plan.SplitOutliers(spec, man)
	evidence := filepath.Join(absPath(*data), "runs", spec.Name)
	prof, err := plan.LoadProfile(filepath.Join(evidence, "profile.json"))
	if err != nil {
		return err
	}
	if prof != nil && prof.Job != plan.JobFingerprint(spec) {
		fmt.Fprintf(stderr, "sbatch: %s measured another version of this job: sizing from the declared classes\n", filepath.Join(evidence, "profile.json"))
		prof = nil
	}
	if *warn == 0 {
		*warn = defaultWarn(spec, man)
	}
	if *limit > 0 && *warn >= *limit {
		return exitErr{code: exitUsage, msg: fmt.Sprintf("sbatch: --warn %s is not shorter than --time %s: the workers would drain at once", *warn, *limit)}
	}
	warnS := int64((*warn + time.Second - 1) / time.Second)
	if warnS > sbatchSignalMax {
		return exitErr{code: exitUsage, msg: fmt.Sprintf("sbatch: --warn %s: Slurm's --signal takes at most %d s", *warn, sbatchSignalMax)}
	}
	bin, err := os.Executable()
	if err != nil {
		return fmt.Errorf("sbatch: this program's path: %w", err)
	}
	a := sizeAllocation(spec, man, prof, runPeaks(ctx, *server, acc.get(), spec, man, stderr), *slots)
	dir := filepath.Join(evidence, "slurm")

	// A worker that stops by itself for its node's fault exits 1: where
	// the site sets KillOnBadExit, that would end the workers of every
	// other node too, their shards handed back and the job over.
	workerArgv := []string{"srun", "--ntasks-per-node=1", "--kill-on-bad-exit=0", bin, "worker", "--server", *server}
	a2 := acc.get()
	if a2.token != "" {
		workerArgv = append(workerArgv, "--token-file", absPath(a2.token))
	} else if u, err := url.Parse(strings.Split(*server, ",")[0]); err != nil || u.User == nil {
		fmt.Fprintln(stderr, "sbatch: no --token-file: the workers present no token, and a coordinator that asks for one (the default) refuses them")
	}
	if a2.ca != "" {
		workerArgv = append(workerArgv, "--tls-ca", absPath(a2.ca))
	}
	if *idle > 0 {
		workerArgv = append(workerArgv, "--idle-exit", idle.String())
	}
	script := fmt.Sprintf("#!/bin/sh\n# shardpool sbatch: workers for run %s (%s), written %s.\n# The options are on the sbatch command line: %s\n%s\n",
		spec.Name, shellQuote(spec.SpecPath), time.Now().UTC().Format(time.RFC3339), filepath.Join(dir, "sbatch.txt"), quoteArgs(workerArgv))

	sbatchArgs := []string{"--parsable", "--job-name=shardpool-" + spec.Name, fmt.Sprintf("--nodes=%d", *nodes), "--ntasks-per-node=1",
		fmt.Sprintf("--cpus-per-task=%d", a.CPUs)}
	mib := (a.Memory + (1 << 20) - 1) >> 20
	if a.Memory > 0 {
		sbatchArgs = append(sbatchArgs, fmt.Sprintf("--mem=%dM", mib))
	}
	if a.GPUs > 0 {
		sbatchArgs = append(sbatchArgs, fmt.Sprintf("--gpus-per-node=%d", a.GPUs))
	}
	if *limit > 0 {
		sbatchArgs = append(sbatchArgs, "--time="+slurmTime(*limit))
	}
	sbatchArgs = append(sbatchArgs, fmt.Sprintf("--signal=USR1@%d", warnS), "--output="+filepath.Join(dir, "%j.out"))
	sbatchArgs = append(sbatchArgs, extra...)

	for _, n := range a.Notes {
		fmt.Fprintln(stderr, "sbatch: "+n)
	}
	if *dry {
		fmt.Fprintf(stdout, "sbatch %s SCRIPT\n\nSCRIPT:\n%s", quoteArgs(sbatchArgs), script)
		return nil
	}
	sbatchPath, err := exec.LookPath("sbatch")
	if err != nil {
		return fmt.Errorf("sbatch: %w: this host has no Slurm client (--dry-run prints the command and the script)", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("sbatch: %w", err)
	}
	scriptPath := filepath.Join(dir, "workers-"+time.Now().UTC().Format("20060102T150405.000")+".sh")
	if err := checkpoint.WriteFile(scriptPath, []byte(script)); err != nil {
		return fmt.Errorf("sbatch: %w", err)
	}
	if err := os.Chmod(scriptPath, 0o755); err != nil {
		return fmt.Errorf("sbatch: %w", err)
	}
	cmd := exec.CommandContext(ctx, sbatchPath, append(sbatchArgs, scriptPath)...)
	var errb strings.Builder
	cmd.Stderr = &errb
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return fmt.Errorf("sbatch refused the job (%v): %s; the script is %s", err, strings.TrimSpace(errb.String()), scriptPath)
		}
		return fmt.Errorf("sbatch: %w", err)
	}
	job, _, _ := strings.Cut(strings.TrimSpace(string(out)), ";")
	line := fmt.Sprintf("%s job %s: sbatch %s %s\n", time.Now().UTC().Format(time.RFC3339), job, quoteArgs(sbatchArgs), shellQuote(scriptPath))
	if f, err := os.OpenFile(filepath.Join(dir, "sbatch.txt"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644); err == nil {
		_, _ = f.WriteString(line)
		_ = f.Close()
	}
	mem := "the partition's default memory"
	if a.Memory > 0 {
		mem = fmt.Sprintf("%dMiB", mib)
	}
	fmt.Fprintf(stdout, "submitted Slurm job %s: %d node(s), each one worker with %d CPU(s), %s", job, *nodes, a.CPUs, mem)
	if a.GPUs > 0 {
		fmt.Fprintf(stdout, ", %d GPU(s)", a.GPUs)
	}
	fmt.Fprintf(stdout, " for %d slot(s)\n", *slots)
	fmt.Fprintf(stdout, "SIGUSR1 %s before its time limit: the workers finish what runs and exit; scancel %s ends it now (its shards handed back)\n", warn, job)
	fmt.Fprintf(stdout, "script: %s\nSlurm's output: %s\nthe compute nodes run %s: it must be there (a shared file system)\n",
		scriptPath, filepath.Join(dir, job+".out"), bin)
	return nil
}

// quoteArgs is argv as a shell would need it typed.
func quoteArgs(argv []string) string {
	q := make([]string, len(argv))
	for i, s := range argv {
		q[i] = shellQuote(s)
	}
	return strings.Join(q, " ")
}
