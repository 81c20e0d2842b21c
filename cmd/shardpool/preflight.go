package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker"
	"github.com/shardpool/shardpool/worker/probe"
)

// pathsFlag collects --path NAME=PATH.
type pathsFlag map[string]string

func (p pathsFlag) String() string { return fmt.Sprint(map[string]string(p)) }

func (p pathsFlag) Set(v string) error {
	name, path, ok := strings.Cut(v, "=")
	if !ok || name == "" || path == "" {
		return fmt.Errorf("--path %q: want NAME=PATH", v)
	}
	if was, dup := p[name]; dup {
		return fmt.Errorf("--path %q: %s is already %s", v, name, was)
	}
	p[name] = path
	return nil
}

func cmdPreflight(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("preflight", "shardpool preflight [--json] [--path NAME=PATH ...] [--spec SPEC] [--data DIR]", stderr)
	asJSON := fs.Bool("json", false, "print the snapshot as JSON (docs/preflight.md)")
	paths := pathsFlag{}
	fs.Var(paths, "path", "a storage path to probe, `NAME=PATH` (repeatable)")
	specPath := fs.String("spec", "", "probe this run's output, inputs and scratch (the run's `SPEC` file), and write the snapshot to its evidence folder")
	data := fs.String("data", worker.DefaultStateDir(), "state `DIR` (evidence goes to DIR/runs/<run>/preflight/)")
	scratch := fs.String("scratch", "", "the local scratch `DIR` to probe (default: where workers make theirs, the policy's first scratch directory this host has, or $TMPDIR)")
	pol := fs.String("policy", "", "policy `FILE` (default $XDG_CONFIG_HOME/shardpool/policy.toml)")
	if err := parseNone(fs, args); err != nil {
		return err
	}
	if *scratch == "" {
		// The policy's own errors are the snapshot's to report.
		if p, err := probe.LoadPolicy(policyPath(*pol)); err == nil {
			base, err := worker.ScratchBase(p)
			if err != nil {
				fmt.Fprintf(stderr, "warning: %v\n", err)
			}
			*scratch = base
		}
	}
	if *scratch != "" {
		paths["scratch"] = *scratch
	}
	// Where stores and evidence go: a home directory on NFS is common.
	paths["state"] = *data
	var spec *stream.Spec
	if *specPath != "" {
		var err error
		if spec, err = stream.LoadSpec(*specPath); err != nil {
			return err
		}
		paths["output"] = spec.Output
		paths["checkpoints"] = filepath.Join(spec.Output, worker.MetaDir)
		if man, err := stream.LoadManifest(spec); err == nil && len(man.Shards) > 0 && len(man.Shards[0].Inputs) > 0 {
			paths["inputs"] = filepath.Dir(man.Shards[0].Inputs[0])
		}
	}
	probe.Existing(paths)
	// Others' CPU use over a second, as a worker's budget counts it (over
	// ten seconds there): preflight is one look, not a window. This user's
	// workers on the host are not others: what their shards hold is shared
	// through the ledger (printHostWorkers).
	meter, err := probe.NewCPUMeter(probe.CPUMeterConfig{Least: time.Second})
	if err != nil {
		return err
	}
	if ws, err := worker.HostWorkers(worker.DefaultLedgerDir()); err == nil && len(ws) > 0 {
		roots := make([]probe.ProcID, len(ws))
		for i, w := range ws {
			roots[i] = probe.ProcID{PID: w.PID, Start: w.Start}
		}
		meter.SetRoots(func() []probe.ProcID { return roots })
	}
	pr, err := probe.New(probe.Config{Users: true, PolicyPath: *pol, CPUUse: meter})
	if err != nil {
		return err
	}
	snap, err := pr.Snapshot(ctx, paths)
	if err != nil {
		return err
	}
	if spec != nil {
		file, err := worker.SavePreflight(filepath.Join(*data, "runs", spec.Name), snap, "preflight")
		if err != nil {
			return err
		}
		fmt.Fprintf(stderr, "preflight written to %s\n", file)
	}
	if *asJSON {
		return writeJSON(stdout, snap)
	}
	printSnapshot(stdout, snap)
	printHostWorkers(stdout, worker.DefaultLedgerDir())
	return nil
}

// printHostWorkers names this user's live workers on this host and what
// their shards hold: the budget above is shared with them.
func printHostWorkers(w io.Writer, dir string) {
	ws, err := worker.HostWorkers(dir)
	if err != nil {
		fmt.Fprintf(w, "workers: unknown (%v)\n", err)
		return
	}
	var profiles []worker.HostWorker
	ws = slices.DeleteFunc(ws, func(h worker.HostWorker) bool {
		if h.Share == worker.ProfileShare {
			profiles = append(profiles, h)
			return true
		}
		return false
	})
	if len(ws) == 0 {
		fmt.Fprintf(w, "workers: none of this user's running on this host (ledger %s)\n", dir)
	} else {
		printWorkerHolds(w, dir, ws)
	}
	// A profile holds devices for its samples, nothing of the budget.
	for _, h := range profiles {
		fmt.Fprintf(w, "%s (pid %d) holds GPUs %s for its samples\n", h.Name, h.PID, cmp.Or(strings.Join(h.GPUs, ","), "none now"))
	}
}

// printWorkerHolds is printHostWorkers's line of the live workers ws.
func printWorkerHolds(w io.Writer, dir string, ws []worker.HostWorker) {
	fmt.Fprintf(w, "workers: %d of this user's on this host, admitting against the budget above (ledger %s):", len(ws), dir)
	for _, h := range ws {
		fmt.Fprintf(w, " %s (pid %d) holds %s, %s still to grow (shards running or being fetched)", h.Name, h.PID, showCPU(probe.Known(h.CPU, "")), stream.FormatSize(h.Memory))
		if len(h.GPUs) > 0 || h.GPUPending > 0 {
			fmt.Fprintf(w, ", GPUs %s and %d to place", strings.Join(h.GPUs, ","), h.GPUPending)
		}
		if h.Wants {
			fmt.Fprint(w, ", wants more")
		}
		fmt.Fprint(w, ";")
	}
	fmt.Fprintln(w)
}

func show(v probe.Value, bytes bool) string {
	switch {
	case v.IsUnknown():
		return "unknown (" + v.Unknown + ")"
	case v.Unlimited:
		return "unlimited"
	case bytes:
		return stream.FormatSize(v.N)
	}
	return fmt.Sprint(v.N)
}

func showCPU(v probe.Value) string {
	if v.IsKnown() {
		return fmt.Sprintf("%.2f CPUs", float64(v.N)/1000)
	}
	return show(v, false)
}

func ratio(r probe.Ratio) string {
	if r.Unknown != "" {
		return "unknown (" + r.Unknown + ")"
	}
	return fmt.Sprintf("%.2f", r.F)
}

func printSnapshot(w io.Writer, s *probe.Snapshot) {
	fmt.Fprintf(w, "host %s  boot %s  %s  snapshot took %.1f ms\n\n", s.Hostname, s.BootID, s.Time.Format(time.RFC3339), s.Seconds*1000)
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "CPU\tonline %s, affinity %s (%s), cgroup cpuset %s, quota %s\n", show(s.Host.OnlineCPUs, false), show(s.Host.Affinity, false), s.Host.AffinityList, show(s.Cgroups.Cpuset, false), showCPU(s.Cgroups.CPUQuota))
	if o := s.Host.OthersCPU; o != nil {
		fmt.Fprintf(tw, "others\t%s in use by all but shardpool's workers and the kernel's threads: other users, this user's other processes, daemons, steal (%s)\n", showCPU(*o), o.Source)
	}
	fmt.Fprintf(tw, "load\t%s %s %s (1/5/15 min)\n", ratio(s.Host.Load1), ratio(s.Host.Load5), ratio(s.Host.Load15))
	fmt.Fprintf(tw, "memory\ttotal %s, available %s, swap %s used of %s, host OOM kills %s\n", show(s.Host.MemTotal, true), show(s.Host.MemAvailable, true), show(s.Host.SwapUsed, true), show(s.Host.SwapTotal, true), show(s.Host.OOMKills, false))
	fmt.Fprintf(tw, "cgroups\t%s; memory cgroup %s: limit %s (binds at %s), working set %s, OOM kills %s\n", s.Cgroups.Version, s.Cgroups.MemoryPath, show(s.Cgroups.MemoryLimit, true), orDash(s.Cgroups.MemoryBinds), show(s.Cgroups.WorkingSet, true), show(s.Cgroups.OOMKills, false))
	for _, l := range s.Cgroups.MemoryLevels {
		fmt.Fprintf(tw, "\t  %s: %s\n", l.Path, show(l.Limit, true))
	}
	fmt.Fprintf(tw, "pressure\tcpu %s, memory %s (full %s), io %s (avg10, host)\n", ratio(s.PSI.CPUSome10), ratio(s.PSI.MemorySome10), ratio(s.PSI.MemoryFull10), ratio(s.PSI.IOSome10))
	if s.Slurm != nil {
		fmt.Fprintf(tw, "slurm\tjob %s: cpus %s, memory %s, gpus %s, cgroup %s\n", s.Slurm.JobID, show(s.Slurm.CPUs, false), show(s.Slurm.Memory, true), show(s.Slurm.GPUs, false), orDash(s.Slurm.Cgroup))
	}
	fmt.Fprintf(tw, "GPUs\t%s", show(s.GPUs.Count, false))
	if s.GPUs.Reason != "" {
		fmt.Fprintf(tw, " (%s)", s.GPUs.Reason)
	}
	fmt.Fprintln(tw)
	for _, g := range s.GPUs.Devices {
		state := "usable"
		if !g.Usable {
			state = "not usable: " + g.Why
		}
		fmt.Fprintf(tw, "\t  %d %s %s: %s free of %s, util %d%%, %d process(es); %s\n", g.Index, g.Name, g.UUID, stream.FormatSize(g.MemFree), stream.FormatSize(g.MemTotal), g.UtilGPU, len(g.Processes), state)
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PATH\tTYPE\tLOCALITY\tFREE\tINODES FREE\tMOUNT\tSOURCE")
	for _, p := range s.Storage {
		typ := p.Type
		if p.Subtype != "" {
			typ += "." + p.Subtype
		}
		if p.Unknown != "" {
			fmt.Fprintf(tw, "%s=%s\tunknown\t-\t-\t-\t-\t%s\n", p.Name, p.Path, p.Unknown)
			continue
		}
		fmt.Fprintf(tw, "%s=%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.Name, p.Resolved, typ, p.Locality, show(p.BytesFree, true), show(p.InodesFree, false), p.MountPoint, p.Source)
	}
	tw.Flush()
	if len(s.Users) > 0 {
		fmt.Fprintf(w, "\nusers (%d processes, CPU over %.0f ms):", s.Procs, s.UsersSec*1000)
		for i, u := range s.Users {
			if i == 5 {
				fmt.Fprintf(w, " ...")
				break
			}
			fmt.Fprintf(w, " uid %d: %d procs, %s RSS, %.2f cores;", u.UID, u.Processes, stream.FormatSize(u.RSS), u.CPUCores)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "BUDGET\tEFFECTIVE\tBINDING LIMIT\tRESERVE")
	for _, b := range []struct {
		name  string
		line  probe.Line
		bytes bool
		cpu   bool
	}{{"cpu", s.Budget.CPU, false, true}, {"memory", s.Budget.Memory, true, false}, {"gpus", s.Budget.GPUs, false, false}, {"vram", s.Budget.VRAM, true, false}} {
		eff := show(b.line.Effective, b.bytes)
		if b.cpu {
			eff = showCPU(b.line.Effective)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\n", b.name, eff, b.line.Binding, b.line.Reserve)
	}
	tw.Flush()
	if s.Policy.Loaded && s.Policy.Tier != "" {
		fmt.Fprintf(w, "policy: %s, tier %s (this host's name matches its hosts)\n", s.Policy.Path, s.Policy.Tier)
	} else if s.Policy.Loaded {
		fmt.Fprintf(w, "policy: %s\n", s.Policy.Path)
	} else {
		fmt.Fprintf(w, "policy: none (%s absent)\n", s.Policy.Path)
	}
	for _, e := range s.Errors {
		fmt.Fprintln(w, "error:", e)
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// policyPath is the policy file a --policy flag names, or the user's.
func policyPath(flag string) string {
	if flag != "" {
		return flag
	}
	return probe.DefaultPolicyPath(os.Getenv)
}
