package worker_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/testenv"
	"github.com/shardpool/shardpool/worker/probe"
)

// TestOtherUsersCPUIsNotAdmittedInto: another user (uid 65534) keeps
// every CPU of this host busy. An auto-mode worker of one-CPU shards
// then runs one shard at a time, not one per CPU, and says why in
// admission.log; once the other user stops, it runs one per CPU again.
// Before, the CPU budget was the host's CPUs whatever else ran on them.
func TestOtherUsersCPUIsNotAdmittedInto(t *testing.T) {
	testenv.RequireRoot(t)
	meter, err := probe.NewCPUMeter(probe.CPUMeterConfig{Every: 300 * time.Millisecond, Window: 1500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	pr, err := probe.New(probe.Config{GPUs: noGPUs{}, PolicyPath: "/nonexistent", CPUUse: meter})
	if err != nil {
		t.Fatal(err)
	}
	cpus := int64(testenv.FreeCPUs(t))
	stop := testenv.BurnCPUs(t, int(cpus))
	testenv.Eventually(t, 15*time.Second, func() (bool, string) {
		o := meter.Others()
		return o.IsKnown() && o.N >= cpus*1000-500, fmt.Sprintf("others' use: %d millicores (%s%s), want at least %d: "+
			"uid 65534's %d busy loops did not get the CPUs; is this user keeping them busy too (`go test` without -p 1 runs packages side by side)?",
			o.N, o.Source, o.Unknown, cpus*1000-500, cpus)
	})

	env := testenv.New(t, testenv.Options{Auto: true, Slots: map[string]int{}, Probe: pr})
	const class = "[class.cpu]\ncpus = 1\nmemory = \"16MiB\"\n"
	busy := namedConcurrencyJob(t, "busy", 4, "0.5", class)
	env.Submit(busy, coordinator.SubmitOptions{})
	env.WaitState("busy", 60*time.Second, stream.RunComplete)
	log, _ := os.ReadFile(filepath.Join(env.Data, "admission.log"))
	if got := maxConcurrent(t, busy, 4); got != 1 {
		t.Fatalf("while another user keeps the %d CPUs busy: %d shards at once, want 1\n%s", cpus, got, log)
	}
	for _, want := range []string{probe.ScopeOthers, "online less", "one shard still runs"} {
		if !strings.Contains(string(log), want) {
			t.Errorf("admission.log does not say %q:\n%s", want, log)
		}
	}

	stop()
	testenv.Eventually(t, 15*time.Second, func() (bool, string) {
		o := meter.Others()
		return o.IsKnown() && o.N < 500, "others' use: " + o.Source
	})
	free := namedConcurrencyJob(t, "free", 2*int(cpus), "1", class)
	env.Submit(free, coordinator.SubmitOptions{})
	env.WaitState("free", 60*time.Second, stream.RunComplete)
	if got := maxConcurrent(t, free, 2*int(cpus)); got < 2 {
		log, _ := os.ReadFile(filepath.Join(env.Data, "admission.log"))
		t.Fatalf("after the other user stopped: at most %d shard(s) at once, want up to %d\n%s", got, cpus, log)
	}
}

// TestThisUsersOtherWorkIsOthersCPU: CPU that this user's processes use
// outside shardpool (a job started in another terminal, a notebook) is
// not free for shards: it counts as others' use, as root too, where every
// process of uid 0 (daemons, containers) used to count as shardpool's.
// What this process's descendants use (its shards) does not count.
func TestThisUsersOtherWorkIsOthersCPU(t *testing.T) {
	meter, err := probe.NewCPUMeter(probe.CPUMeterConfig{Every: 300 * time.Millisecond, Window: 1500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	cpus := int64(testenv.FreeCPUs(t))
	var loops []*exec.Cmd
	for range cpus {
		c := exec.Command("sh", "-c", "while :; do :; done")
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		loops = append(loops, c)
		t.Cleanup(func() { c.Process.Kill(); c.Wait() })
	}
	time.Sleep(2 * time.Second) // a window full of them
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		o := meter.Others()
		return o.IsKnown() && o.N < 500, fmt.Sprintf("others' use: %d millicores (%s%s), want under 500: this process's %d busy loops counted as others'", o.N, o.Source, o.Unknown, cpus)
	})
	for _, c := range loops {
		c.Process.Kill()
		c.Wait()
	}

	testenv.BurnCPUsDetached(t, int(cpus))
	testenv.Eventually(t, 15*time.Second, func() (bool, string) {
		o := meter.Others()
		return o.IsKnown() && o.N >= cpus*1000-500, fmt.Sprintf("others' use: %d millicores (%s%s), want at least %d: this user's %d busy loops outside this process's tree were not counted",
			o.N, o.Source, o.Unknown, cpus*1000-500, cpus)
	})
}

// namedConcurrencyJob is concurrencyJob with a run name of its own.
func namedConcurrencyJob(t *testing.T, name string, shards int, sleep, extra string) string {
	t.Helper()
	dir := t.TempDir()
	return testenv.WriteJob(t, testenv.Job{Name: name, Shards: shards, Retries: 0, Extra: extra,
		Command: []string{"sh", "-c", `mkdir "$1/$2" && sleep "$4" && ls "$1" | wc -l > "$3/n" && rmdir "$1/$2"`, "sh", dir, "{id}", "{out}", sleep}})
}
