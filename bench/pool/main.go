// Command pool is the worker-pool benchmark behind `make bench`: N shards
// of /bin/true through `shardpool run` (all state durable: the default
// group sync, and --sync always for comparison), against GNU parallel
// --joblog and a bare Go fork/exec loop at the same concurrency, in the
// same run. It prints shards/s, both ratios and the peak RSS of the
// shardpool processes. It is a benchmark, not a test: it asserts nothing
// and never fails on a slow machine.
//
// Nothing is deleted until the end: on ext4 without a journal, inodes
// freed in the last minutes slow every later allocation in their group,
// so cleaning up between the measurements would tax the next one.
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
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	bin := flag.String("bin", "bin/shardpool", "shardpool binary")
	n := flag.Int("n", 5000, "shards")
	j := flag.Int("j", 4, "concurrency for all three")
	flag.Parse()
	if err := run(*bin, *n, *j); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(bin string, n, j int) error {
	bin, _ = filepath.Abs(bin)
	dir, err := os.MkdirTemp("", "shardpool-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	writeManifest(dir, n)
	fmt.Printf("shardpool pool benchmark: %d shards of /bin/true, concurrency %d, %d CPUs\n\n", n, j, cpus())

	// CPU per shard: this process and every child it waited for (the
	// children's own children included), between two readings.
	var cpu []time.Duration
	mark := cpuUsed()
	took := func() {
		now := cpuUsed()
		cpu, mark = append(cpu, now-mark), now
	}
	bare := bareExec(n, j)
	took()
	par, parErr := gnuParallel(dir, n, j)
	took()
	emb, embRSS, err := timed(exec.Command(bin, "run", "--quiet", "--data", filepath.Join(dir, "emb"), "--slots", fmt.Sprint(j), writeSpec(dir, "emb")))
	if err != nil {
		return fmt.Errorf("shardpool run: %w", err)
	}
	took()
	always, _, alwaysErr := timed(exec.Command(bin, "run", "--quiet", "--sync", "always", "--data", filepath.Join(dir, "always"), "--slots", fmt.Sprint(j), writeSpec(dir, "always")))
	took()
	dist, coordRSS, workerRSS, distErr := distributed(bin, dir, writeSpec(dir, "dist"), n, j)
	took()
	perShard := func(i int) float64 { return float64(cpu[i].Microseconds()) / 1000 / float64(n) }

	rate := func(d time.Duration) float64 { return float64(n) / d.Seconds() }
	fmt.Printf("%-40s %10s %12s %14s\n", "", "wall", "shards/s", "CPU ms/shard")
	row := func(name string, d time.Duration, i int, err error) {
		if err != nil {
			fmt.Printf("%-40s %s\n", name, err)
			return
		}
		fmt.Printf("%-40s %9.2fs %12.0f %14.2f\n", name, d.Seconds(), rate(d), perShard(i))
	}
	row("bare Go fork/exec loop", bare, 0, nil)
	row("GNU parallel --joblog", par, 1, parErr)
	row("shardpool run (embedded, group sync)", emb, 2, nil)
	row("shardpool run --sync always", always, 3, alwaysErr)
	row("shardpool coordinator+worker (TCP)", dist, 4, distErr)
	fmt.Println()
	if parErr == nil {
		fmt.Printf("ratio shardpool run / GNU parallel:   %.2fx (target >= 5x)\n", rate(emb)/rate(par))
	}
	fmt.Printf("ratio shardpool run / bare exec:      %.2fx (target >= 0.5x)\n", rate(emb)/rate(bare))
	fmt.Printf("peak RSS shardpool run (one process): %.1f MiB\n", float64(embRSS)/(1<<20))
	if distErr == nil {
		fmt.Printf("peak RSS coordinator: %.1f MiB, worker: %.1f MiB\n", float64(coordRSS)/(1<<20), float64(workerRSS)/(1<<20))
	}
	return nil
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
func writeSpec(dir, name string) string {
	spec := filepath.Join(dir, name+".toml")
	os.WriteFile(spec, []byte("name = \"bench\"\nmanifest = \"manifest.jsonl\"\noutput = \"out-"+name+"\"\ncommand = [\"/bin/true\"]\nretries = 0\ncode_rev = \"bench\"\n"), 0o644)
	return spec
}

func bareExec(n, j int) time.Duration {
	start := time.Now()
	jobs := make(chan struct{})
	var wg sync.WaitGroup
	for range j {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range jobs {
				exec.Command("/bin/true").Run()
			}
		}()
	}
	for range n {
		jobs <- struct{}{}
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
func distributed(bin, dir, spec string, n, j int) (time.Duration, int64, int64, error) {
	addr, httpAddr := "127.0.0.1:24222", "127.0.0.1:24223"
	url := "nats://" + addr
	coord := exec.Command(bin, "coordinator", "--data", filepath.Join(dir, "dist"), "--listen", addr, "--http", httpAddr)
	if err := coord.Start(); err != nil {
		return 0, 0, 0, err
	}
	defer coord.Process.Kill()
	time.Sleep(1500 * time.Millisecond)
	start := time.Now()
	if out, err := exec.Command(bin, "submit", "--server", url, spec).CombinedOutput(); err != nil {
		return 0, 0, 0, fmt.Errorf("submit: %v %s", err, out)
	}
	wk := exec.Command(bin, "worker", "--server", url, "--slots", fmt.Sprintf("cpu=%d", j), "--name", "bench",
		"--data", filepath.Join(dir, "wdata"), "--scratch", filepath.Join(dir, "wscratch"))
	if err := wk.Start(); err != nil {
		return 0, 0, 0, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// Poll GET /status (the same document as status --json): starting a
	// status process ten times a second would take CPU from the run.
	for ctx.Err() == nil {
		if resp, err := http.Get("http://" + httpAddr + "/status"); err == nil {
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
