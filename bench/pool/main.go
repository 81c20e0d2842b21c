// Command pool is the worker-pool benchmark behind `make bench`: N shards
// of /bin/true through `shardpool run` (all state durable: the default
// group sync, and --sync always for comparison), against GNU parallel
// --joblog and a bare Go fork/exec loop at the same concurrency, in the
// same run. It prints shards/s, both ratios and the peak RSS of the
// shardpool processes. A fourth baseline, bare exec plus a directory, a
// marker and a rename per shard, shows the file system's share of the
// gap. It is a benchmark, not a test: it asserts nothing and never fails
// on a slow machine.
//
// It measures everything once per round (-rounds, default 3) and prints
// medians with their range; each ratio pairs measurements of one round,
// so a machine that slows down between rounds does not bias it.
//
// Nothing is deleted until the end: on ext4 without a journal, inodes
// freed in the last minutes slow every later allocation in their group
// (ext4's recently_deleted check), so cleaning up between the
// measurements would tax the next one.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/shardpool/shardpool/coordinator"
)

func main() {
	bin := flag.String("bin", "bin/shardpool", "shardpool binary")
	n := flag.Int("n", 5000, "shards")
	j := flag.Int("j", 4, "concurrency for all three")
	rounds := flag.Int("rounds", 3, "rounds; each measures everything once, in the same order")
	flag.Parse()
	if err := run(*bin, *n, *j, max(*rounds, 1)); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// measurement is one row of the table: its wall time and the CPU time of
// this process and its waited-for children, per round.
type measurement struct {
	name string
	wall []time.Duration
	cpu  []time.Duration
	err  error
}

func (m *measurement) add(wall, cpu time.Duration, err error) {
	if err != nil {
		m.err = err
		return
	}
	m.wall = append(m.wall, wall)
	m.cpu = append(m.cpu, cpu)
}

// Rows of the table, in the order they are measured within a round.
const (
	rowBare = iota
	rowFloor
	rowParallel
	rowRun
	rowAlways
	rowDist
	rowAuto
)

func run(bin string, n, j, rounds int) error {
	bin, _ = filepath.Abs(bin)
	dir, err := os.MkdirTemp("", "shardpool-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	writeManifest(dir, n)
	fmt.Printf("shardpool pool benchmark: %d shards of /bin/true, concurrency %d, %d CPUs, %d round(s)\n", n, j, cpus(), rounds)
	fmt.Printf("(medians, with the range over the rounds: one run varies by 10-15%% on a shared VM)\n\n")

	rows := []*measurement{{name: "bare Go fork/exec loop"}, {name: "bare exec + output dir and marker"}, {name: "GNU parallel --joblog"},
		{name: "shardpool run (embedded, group sync)"}, {name: "shardpool run --sync always"},
		{name: "shardpool coordinator+worker (TCP)"}, {name: "shardpool run, default admission (*)"}}
	var embRSS, coordRSS, workerRSS int64
	var ratioPar, ceilPar, ratioBare, ratioFloor []float64
	for r := range rounds {
		// CPU: this process and every child it waited for (the children's
		// own children included), between two readings.
		mark := cpuUsed()
		took := func(row int, d time.Duration, err error) {
			now := cpuUsed()
			rows[row].add(d, now-mark, err)
			mark = now
		}
		// Every row starts with nothing left for the kernel to write back.
		// A syncfs, which shardpool's durable state makes, flushes every
		// writer's dirty data on the file system: without this, the run's
		// first one wrote out the floor row's 5,000 directories and markers
		// (150-200 ms of a 4.6 s run, the CPUs idle), while the rows that
		// never sync left theirs to whoever came next.
		settled := func() {
			syscall.Sync()
			mark = cpuUsed()
		}
		settled()
		took(rowBare, bareExec(n, j, ""), nil)
		settled()
		took(rowFloor, bareExec(n, j, filepath.Join(dir, fmt.Sprintf("floor%d", r))), nil)
		settled()
		par, err := gnuParallel(dir, n, j)
		took(rowParallel, par, err)
		name := fmt.Sprintf("emb%d", r)
		settled()
		emb, rss, err := timed(exec.Command(bin, "run", "--quiet", "--data", filepath.Join(dir, name), "--slots", fmt.Sprint(j), writeSpec(dir, name)))
		if err != nil {
			return fmt.Errorf("shardpool run: %w", err)
		}
		took(rowRun, emb, nil)
		embRSS = max(embRSS, rss)
		name = fmt.Sprintf("always%d", r)
		settled()
		always, _, err := timed(exec.Command(bin, "run", "--quiet", "--sync", "always", "--data", filepath.Join(dir, name), "--slots", fmt.Sprint(j), writeSpec(dir, name)))
		took(rowAlways, always, err)
		settled()
		dist, crss, wrss, err := distributed(bin, dir, writeSpec(dir, fmt.Sprintf("dist%d", r)), fmt.Sprintf("dist%d", r), j)
		took(rowDist, dist, err)
		coordRSS, workerRSS = max(coordRSS, crss), max(workerRSS, wrss)
		// The default path: --slots auto with the class's memory declared,
		// so every fetch is a measured decision (and, as root, every shard
		// gets its own memory and cpu cgroup).
		name = fmt.Sprintf("auto%d", r)
		settled()
		auto, _, err := timed(exec.Command(bin, "run", "--quiet", "--data", filepath.Join(dir, name), writeSpec(dir, name, "[class.cpu]\ncpus = 1\nmemory = \"16MiB\"\n")))
		took(rowAuto, auto, err)
		// Ratios pair measurements of the same round.
		if par > 0 && rows[rowParallel].err == nil {
			ratioPar = append(ratioPar, par.Seconds()/emb.Seconds())
			ceilPar = append(ceilPar, par.Seconds()/rows[rowBare].wall[r].Seconds())
		}
		ratioBare = append(ratioBare, rows[rowBare].wall[r].Seconds()/emb.Seconds())
		ratioFloor = append(ratioFloor, rows[rowFloor].wall[r].Seconds()/emb.Seconds())
		fmt.Printf("round %d: bare %.0f/s, parallel %.0f/s, shardpool run %.0f/s\n", r+1,
			float64(n)/rows[rowBare].wall[r].Seconds(), float64(n)/par.Seconds(), float64(n)/emb.Seconds())
	}
	fmt.Println()

	fmt.Printf("%-40s %18s %18s %16s\n", "", "wall s", "shards/s", "CPU ms/shard")
	for _, m := range rows {
		if m.err != nil {
			fmt.Printf("%-40s %s\n", m.name, m.err)
			continue
		}
		rates, perShard := make([]float64, len(m.wall)), make([]float64, len(m.cpu))
		walls := make([]float64, len(m.wall))
		for i := range m.wall {
			walls[i] = m.wall[i].Seconds()
			rates[i] = float64(n) / walls[i]
			perShard[i] = float64(m.cpu[i].Microseconds()) / 1000 / float64(n)
		}
		fmt.Printf("%-40s %18s %18s %16s\n", m.name, spread(walls, "%.2f"), spread(rates, "%.0f"), spread(perShard, "%.2f"))
	}
	fmt.Println()
	if len(ratioPar) > 0 {
		fmt.Printf("ratio shardpool run / GNU parallel:   %sx (target >= 5x)\n", spread(ratioPar, "%.2f"))
		// What the first ratio can reach: a runner that adds nothing to a
		// fork and exec per shard. Where this is under 5, the 5x target
		// asks for more than the bare loop does.
		fmt.Printf("ratio bare exec / GNU parallel:       %sx (no target: the most a process per shard reaches here)\n", spread(ceilPar, "%.2f"))
	}
	fmt.Printf("ratio shardpool run / bare exec:      %sx (target >= 0.5x)\n", spread(ratioBare, "%.2f"))
	fmt.Printf("ratio shardpool run / exec + marker:  %sx (no target: the floor of any per-shard commit here)\n", spread(ratioFloor, "%.2f"))
	// Where the gap to bare exec is: work per shard, or CPUs left idle.
	var cpuRatio, busyBare, busyRun []float64
	for r := range rows[rowRun].wall {
		bare, emb := rows[rowBare], rows[rowRun]
		cpuRatio = append(cpuRatio, bare.cpu[r].Seconds()/emb.cpu[r].Seconds())
		busyBare = append(busyBare, bare.cpu[r].Seconds()/bare.wall[r].Seconds())
		busyRun = append(busyRun, emb.cpu[r].Seconds()/emb.wall[r].Seconds())
	}
	fmt.Printf("CPU per shard, bare exec / shardpool run: %sx (no target: the rate ratio above is this times how busy each keeps the CPUs)\n", spread(cpuRatio, "%.2f"))
	fmt.Printf("CPUs kept busy (CPU time / wall): bare exec %s, shardpool run %s, of %d\n", spread(busyBare, "%.2f"), spread(busyRun, "%.2f"), cpus())
	fmt.Printf("(*) --slots auto with cpus = 1 and memory = \"16MiB\" declared: slots from this host's budget (at most %d, its CPUs); no target\n", cpus())
	fmt.Printf("peak RSS shardpool run (one process): %.1f MiB\n", float64(embRSS)/(1<<20))
	if rows[rowDist].err == nil {
		fmt.Printf("peak RSS coordinator: %.1f MiB, worker: %.1f MiB\n", float64(coordRSS)/(1<<20), float64(workerRSS)/(1<<20))
	}
	return nil
}

// spread prints the median of v and, with more than one value, its range.
func spread(v []float64, format string) string {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	if len(s) == 1 {
		return fmt.Sprintf(format, med)
	}
	return fmt.Sprintf(format+" ("+format+"-"+format+")", med, s[0], s[len(s)-1])
}

// cpuUsed is the CPU time of this process and of the children it waited for.
func cpuUsed() time.Duration {
	var self, kids syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &self)
	syscall.Getrusage(syscall.RUSAGE_CHILDREN, &kids)
	t := func(r syscall.Rusage) time.Duration { return time.Duration(r.Utime.Nano() + r.Stime.Nano()) }
	return t(self) + t(kids)
}

func cpus() int {
	out, err := exec.Command("nproc").Output()
	if err != nil {
		return 0
	}
	var c int
	fmt.Sscan(string(out), &c)
	return c
}

func writeManifest(dir string, n int) {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "{\"id\":\"s%05d\"}\n", i)
	}
	os.WriteFile(filepath.Join(dir, "manifest.jsonl"), []byte(b.String()), 0o644)
}

// writeSpec writes the job's spec for one measurement, with its own output
// directory.
func writeSpec(dir, name string, extra ...string) string {
	spec := filepath.Join(dir, name+".toml")
	os.WriteFile(spec, []byte("name = \"bench\"\nmanifest = \"manifest.jsonl\"\noutput = \"out-"+name+"\"\ncommand = [\"/bin/true\"]\nretries = 0\ncode_rev = \"bench\"\n"+strings.Join(extra, "")), 0o644)
	return spec
}

// bareExec runs /bin/true n times, j at a time. With out set, each run is
// followed by the least any per-shard commit costs: a directory, a marker
// file in it and a rename to the shard's name, without fsync, queue or
// record. On a file system where creating an inode is expensive (ext4
// without a journal checks every candidate inode for a recent deletion)
// this row shows how much of the gap to bare exec is the file system's.
func bareExec(n, j int, out string) time.Duration {
	if out != "" {
		os.MkdirAll(out, 0o755)
	}
	start := time.Now()
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range j {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				exec.Command("/bin/true").Run()
				if out != "" {
					tmp := filepath.Join(out, fmt.Sprintf(".tmp-s%05d", i))
					os.Mkdir(tmp, 0o755)
					os.WriteFile(filepath.Join(tmp, "COMPLETE"), []byte("{}\n"), 0o644)
					os.Rename(tmp, filepath.Join(out, fmt.Sprintf("s%05d", i)))
				}
			}
		}()
	}
	for i := range n {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	return time.Since(start)
}

func gnuParallel(dir string, n, j int) (time.Duration, error) {
	if _, err := exec.LookPath("parallel"); err != nil {
		return 0, fmt.Errorf("not installed (apt-get install parallel)")
	}
	cmd := exec.Command("parallel", "--will-cite", "-j", fmt.Sprint(j), "--joblog", filepath.Join(dir, "joblog"), "/bin/true")
	var in strings.Builder
	for i := range n {
		fmt.Fprintln(&in, i)
	}
	cmd.Stdin = strings.NewReader(in.String())
	d, _, err := timed(cmd)
	return d, err
}

// timed runs cmd and returns its wall time and peak RSS.
func timed(cmd *exec.Cmd) (time.Duration, int64, error) {
	start := time.Now()
	out, err := cmd.CombinedOutput()
	d := time.Since(start)
	if err != nil {
		return d, 0, fmt.Errorf("%v: %s", err, out)
	}
	return d, maxRSS(cmd), nil
}

func maxRSS(cmd *exec.Cmd) int64 {
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		return ru.Maxrss * 1024
	}
	return 0
}

// distributed runs a coordinator and a worker as separate processes over TCP.
func distributed(bin, dir, spec, name string, j int) (time.Duration, int64, int64, error) {
	addr, httpAddr := "127.0.0.1:24222", "127.0.0.1:24223"
	url := "nats://" + addr
	coord := exec.Command(bin, "coordinator", "--data", filepath.Join(dir, name), "--listen", addr, "--http", httpAddr)
	if err := coord.Start(); err != nil {
		return 0, 0, 0, err
	}
	defer coord.Process.Kill()
	time.Sleep(1500 * time.Millisecond)
	start := time.Now()
	token := filepath.Join(dir, name, "jetstream", coordinator.TokenName)
	if out, err := exec.Command(bin, "submit", "--server", url, "--token-file", token, spec).CombinedOutput(); err != nil {
		return 0, 0, 0, fmt.Errorf("submit: %v %s", err, out)
	}
	wk := exec.Command(bin, "worker", "--server", url, "--token-file", token, "--slots", fmt.Sprintf("cpu=%d", j), "--name", "bench",
		"--data", filepath.Join(dir, name+"-wdata"), "--scratch", filepath.Join(dir, name+"-wscratch"))
	if err := wk.Start(); err != nil {
		return 0, 0, 0, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// Poll GET /status (the same document as status --json): starting a
	// status process ten times a second would take CPU from the run.
	tok, err := coordinator.ReadToken(token)
	if err != nil {
		return 0, 0, 0, err
	}
	for ctx.Err() == nil {
		req, _ := http.NewRequest("GET", "http://"+httpAddr+"/status", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			var st struct {
				Runs []struct{ State string } `json:"runs"`
			}
			derr := json.NewDecoder(resp.Body).Decode(&st)
			resp.Body.Close()
			if derr == nil && len(st.Runs) == 1 && (st.Runs[0].State == "COMPLETE" || st.Runs[0].State == "BLOCKED") {
				break
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	d := time.Since(start)
	wk.Process.Signal(syscall.SIGTERM)
	wk.Wait()
	coord.Process.Signal(syscall.SIGTERM)
	coord.Wait()
	return d, maxRSS(coord), maxRSS(wk), ctx.Err()
}
