//go:build devprof

// Profiling for developers, built only with -tags devprof (see "Where a
// short shard's time goes" in docs/decisions.md): environment variables
// name the files.
//
//	SP_CPUPROF=f    CPU profile of the whole run (go tool pprof)
//	SP_TRACE=f      execution trace (go tool trace)
//	SP_MEMPROF=f    allocations, sampled every 4 KiB, written at exit
//	SP_HEAPAT=f     live heap after SP_HEAPAFTER (a duration) from start
//	SP_RUSAGE=1     CPU of this process and of its reaped children, at exit
package main

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"syscall"
	"time"
)

func init() {
	var stops []func()
	fail := func(what string, err error) {
		fmt.Fprintf(os.Stderr, "devprof: %s: %v\n", what, err)
	}
	// A profile written to a file from start until exit.
	toFile := func(env string, start func(io.Writer) error, stop func()) {
		p := os.Getenv(env)
		if p == "" {
			return
		}
		f, err := os.Create(p)
		if err == nil {
			if err = start(f); err != nil {
				f.Close()
			}
		}
		if err != nil {
			fail(p, err)
			return
		}
		stops = append(stops, func() { stop(); f.Close() })
	}
	toFile("SP_CPUPROF", pprof.StartCPUProfile, pprof.StopCPUProfile)
	toFile("SP_TRACE", trace.Start, trace.Stop)
	if p := os.Getenv("SP_MEMPROF"); p != "" {
		runtime.MemProfileRate = 4096
		stops = append(stops, func() { writeProfile(p, "allocs") })
	}
	if p := os.Getenv("SP_HEAPAT"); p != "" {
		d, err := time.ParseDuration(os.Getenv("SP_HEAPAFTER"))
		if err != nil {
			fail("SP_HEAPAFTER", err)
		}
		go func() {
			time.Sleep(d)
			runtime.GC()
			writeProfile(p, "heap")
		}()
	}
	if os.Getenv("SP_RUSAGE") != "" {
		stops = append(stops, func() {
			var self, children syscall.Rusage
			syscall.Getrusage(syscall.RUSAGE_SELF, &self)
			syscall.Getrusage(syscall.RUSAGE_CHILDREN, &children)
			sec := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
			fmt.Fprintf(os.Stderr, "RUSAGE self %.2f (u %.2f s %.2f) children %.2f\n",
				sec(self.Utime)+sec(self.Stime), sec(self.Utime), sec(self.Stime), sec(children.Utime)+sec(children.Stime))
		})
	}
	profStop = func() {
		for _, stop := range stops {
			stop()
		}
	}
}

func writeProfile(path, name string) {
	f, err := os.Create(path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "devprof: %v\n", err)
		return
	}
	defer f.Close()
	if err := pprof.Lookup(name).WriteTo(f, 0); err != nil {
		fmt.Fprintf(os.Stderr, "devprof: %s: %v\n", path, err)
	}
}
