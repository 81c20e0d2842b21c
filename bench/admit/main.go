// Command admit is the admission benchmark behind `make bench`: memory-
// heavy synthetic shards (examples/memhog) in a cgroup v1 memory limit that
// nproc such shards at once would exceed. In that cgroup, in the same run:
// shardpool at every fixed concurrency 1..nproc, shardpool with measured
// admission (profile, then run with --slots auto), and GNU parallel
// -j nproc. It prints throughput, OOM kills and failed shards. It needs
// root for the cgroup and asserts nothing.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

func main() {
	bin := flag.String("bin", "bin/shardpool", "shardpool binary")
	shards := flag.Int("shards", 8, "shards")
	mib := flag.Int("mib", 400, "MiB each shard holds")
	burn := flag.Int("seconds", 1, "seconds each shard burns a CPU")
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Println("admission benchmark: needs root to create a cgroup; not run")
		return
	}
	abs, _ := filepath.Abs(*bin)
	n := runtime.NumCPU()
	limit := int64(float64(*mib*n)*0.85) << 20
	cg := fmt.Sprintf("/sys/fs/cgroup/memory/shardpool-bench-%d", os.Getpid())
	check(os.Mkdir(cg, 0o755))
	defer os.Remove(cg)
	check(os.WriteFile(filepath.Join(cg, "memory.limit_in_bytes"), []byte(strconv.FormatInt(limit, 10)), 0o644))
	os.WriteFile(filepath.Join(cg, "memory.memsw.limit_in_bytes"), []byte(strconv.FormatInt(limit, 10)), 0o644)
	fmt.Printf("admission benchmark: %d shards holding %d MiB for %ds each; %d CPUs; cgroup limit %d MiB (%d shards at once would need %d MiB)\n\n",
		*shards, *mib, *burn, n, limit>>20, n, *mib*n)

	job := func() string {
		dir, err := os.MkdirTemp("", "shardpool-admit-")
		check(err)
		src, _ := filepath.Abs("examples/memhog")
		for _, f := range []string{"job.sh", "shardpool.toml"} {
			b, err := os.ReadFile(filepath.Join(src, f))
			check(err)
			check(os.WriteFile(filepath.Join(dir, f), b, 0o755))
		}
		var m strings.Builder
		for i := range *shards {
			fmt.Fprintf(&m, "{\"id\":\"h%d\",\"params\":{\"mib\":\"%d\",\"seconds\":\"%d\"}}\n", i, *mib, *burn)
		}
		check(os.WriteFile(filepath.Join(dir, "manifest.jsonl"), []byte(m.String()), 0o644))
		return dir
	}
	type result struct {
		name         string
		secs         float64
		done, failed int
		oom          int64
	}
	var results []result
	inCgroup := func(args ...string) (float64, int64) {
		before := oomKills(cg)
		start := time.Now()
		cmd := exec.Command("sh", append([]string{"-c", `echo $$ > "$1/cgroup.procs" && shift && exec "$@"`, "sh", cg}, args...)...)
		cmd.Run()
		return time.Since(start).Seconds(), oomKills(cg) - before
	}
	counts := func(data string) (int, int) {
		var f struct {
			Counts struct{ Validated, Failed int } `json:"counts"`
		}
		b, err := os.ReadFile(filepath.Join(data, "runs", "memhog", "final.json"))
		if err == nil {
			json.Unmarshal(b, &f)
		}
		return f.Counts.Validated, f.Counts.Failed
	}
	for c := 1; c <= n; c++ {
		dir := job()
		secs, oom := inCgroup(abs, "run", "--quiet", "--data", filepath.Join(dir, "state"), "--slots", strconv.Itoa(c), filepath.Join(dir, "shardpool.toml"))
		done, failed := counts(filepath.Join(dir, "state"))
		results = append(results, result{fmt.Sprintf("shardpool --slots %d", c), secs, done, failed, oom})
		os.RemoveAll(dir)
	}
	dir := job()
	psecs, _ := inCgroup(abs, "profile", "--data", filepath.Join(dir, "state"), filepath.Join(dir, "shardpool.toml"))
	secs, oom := inCgroup(abs, "run", "--quiet", "--data", filepath.Join(dir, "state"), filepath.Join(dir, "shardpool.toml"))
	done, failed := counts(filepath.Join(dir, "state"))
	results = append(results, result{"shardpool --slots auto (after profile)", secs, done, failed, oom})
	admitLog, _ := os.ReadFile(filepath.Join(dir, "state", "admission.log"))
	os.RemoveAll(dir)

	if _, err := exec.LookPath("parallel"); err == nil {
		dir := job()
		var args []string
		for i := range *shards {
			args = append(args, strconv.Itoa(i))
		}
		run := filepath.Join(dir, "run.sh")
		check(os.WriteFile(run, []byte(fmt.Sprintf("#!/bin/sh\nmkdir -p %q/out/$1 && SHARDPOOL_PARAM_MIB=%d SHARDPOOL_PARAM_SECONDS=%d exec %q/job.sh %q/out/$1\n", dir, *mib, *burn, dir, dir)), 0o755))
		joblog := filepath.Join(dir, "joblog")
		secs, oom := inCgroup(append([]string{"parallel", "--will-cite", "-j", strconv.Itoa(n), "--joblog", joblog, run, ":::"}, args...)...)
		ok, bad := joblogCounts(joblog)
		results = append(results, result{fmt.Sprintf("GNU parallel -j %d", n), secs, ok, bad, oom})
		os.RemoveAll(dir)
	}
	fmt.Printf("%-40s %8s %10s %9s %7s %9s\n", "", "seconds", "shards/s", "complete", "failed", "OOM kills")
	best := 0.0
	for _, r := range results {
		fmt.Printf("%-40s %8.2f %10.3f %9d %7d %9d\n", r.name, r.secs, float64(r.done)/r.secs, r.done, r.failed, r.oom)
		if strings.HasPrefix(r.name, "shardpool --slots ") && !strings.Contains(r.name, "auto") && r.done == *shards && r.oom == 0 {
			best = max(best, float64(r.done)/r.secs)
		}
	}
	auto := results[n]
	fmt.Printf("\nprofile took %.2fs (not counted)\n", psecs)
	if best > 0 {
		fmt.Printf("measured admission: %d OOM kills, %.0f%% of the best fixed concurrency that completed without OOM kills (target: 0 and >= 90%%)\n",
			auto.oom, 100*float64(auto.done)/auto.secs/best)
	}
	for _, line := range strings.Split(string(admitLog), "\n") {
		if strings.Contains(line, "decision=fetch") {
			fmt.Println("first admission decision:", line[strings.Index(line, "class="):])
			break
		}
	}
}

func oomKills(cg string) int64 {
	f, err := os.Open(filepath.Join(cg, "memory.oom_control"))
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "oom_kill "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

func joblogCounts(path string) (ok, bad int) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, 0
	}
	for i, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Split(line, "\t")
		if i == 0 || len(f) < 7 {
			continue
		}
		if f[6] == "0" && f[7] == "0" {
			ok++
		} else {
			bad++
		}
	}
	return ok, bad
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}
