// Command probe is the host-probe benchmark behind `make bench`: it starts
// about -procs sleeping processes, times full snapshots (with the per-user
// scan, as `shardpool preflight` takes them), and measures the CPU a
// worker's periodic compact report costs at its 5-second period. It prints
// numbers; it asserts nothing.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"syscall"
	"time"

	"github.com/shardpool/shardpool/worker/probe"
)

func main() {
	procs := flag.Int("procs", 1000, "background processes to start")
	n := flag.Int("n", 20, "snapshots to time")
	flag.Parse()
	var cmds []*exec.Cmd
	for range *procs {
		c := exec.Command("sleep", "120")
		if err := c.Start(); err != nil {
			fmt.Fprintln(os.Stderr, "start:", err)
			break
		}
		cmds = append(cmds, c)
	}
	defer func() {
		for _, c := range cmds {
			c.Process.Kill()
			c.Wait()
		}
	}()
	ents, _ := os.ReadDir("/proc")
	running := 0
	for _, e := range ents {
		if e.Name()[0] >= '0' && e.Name()[0] <= '9' {
			running++
		}
	}
	ctx := context.Background()
	full, _ := probe.New(probe.Config{Users: true})
	paths := map[string]string{"tmp": os.TempDir(), "work": "."}
	var ds []time.Duration
	for range *n {
		s, err := full.Snapshot(ctx, paths)
		if err != nil {
			fmt.Fprintln(os.Stderr, "snapshot:", err)
			os.Exit(1)
		}
		ds = append(ds, time.Duration(s.Seconds*float64(time.Second)))
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	fmt.Printf("host probe benchmark: %d processes running (%d started here)\n", running, len(cmds))
	fmt.Printf("full snapshot (preflight, per-user scan with its 25 ms CPU window): p50 %.1f ms, p95 %.1f ms, max %.1f ms over %d\n",
		ms(ds[len(ds)/2]), ms(ds[len(ds)*95/100]), ms(ds[len(ds)-1]), len(ds))

	compact, _ := probe.New(probe.Config{})
	before := cpuTime()
	start := time.Now()
	k := 50
	for range k {
		compact.Snapshot(ctx, nil)
	}
	used := cpuTime() - before
	per := used / time.Duration(k)
	fmt.Printf("worker report (compact snapshot): %.2f ms CPU each, wall %.2f ms; at one per 5 s that is %.3f%% of a core (target < 1%%)\n",
		ms(per), ms(time.Since(start)/time.Duration(k)), 100*per.Seconds()/5)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
