package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardpool/shardpool/testenv"
	"github.com/shardpool/shardpool/worker"
	"github.com/shardpool/shardpool/worker/probe"
)

type oneGPU struct{ dev probe.GPU }

func (g oneGPU) Devices(context.Context) ([]probe.GPU, error) { return []probe.GPU{g.dev}, nil }

// TestPreflightListsAProfileApartFromTheWorkers: a profile of a GPU class
// holds its samples' devices in the host ledger. preflight's list of this
// user's workers, whose holds share the budget it shows, leaves it out
// and says what it holds: "workers: none ..." and then the profile.
func TestPreflightListsAProfileApartFromTheWorkers(t *testing.T) {
	ledger := testenv.LedgerDir(t)
	started := filepath.Join(t.TempDir(), "started")
	spec, man := testenv.LoadJob(t, testenv.WriteJob(t, testenv.Job{Shards: 1,
		Command: []string{"sh", "-c", `[ -e "$1" ] || { touch "$1"; sleep 2; }`, "sh", started},
		Extra:   "[class.cpu]\ncpus = 1\ngpus = 1\nvram = \"1GiB\"\n"}))
	root, _ := filepath.Abs("../../worker/probe/testdata/v2")
	dev := probe.GPU{Index: 0, UUID: "GPU-1111", Name: "fake", MemTotal: 80 << 30, MemFree: 80 << 30, Usable: true}
	pr, err := probe.New(probe.Config{Root: root, GPUs: oneGPU{dev}, PolicyPath: "/nonexistent"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := worker.Profile(context.Background(), worker.ProfileConfig{Spec: spec, Manifest: man, Scratch: t.TempDir(), LogDir: t.TempDir(), Probe: pr, HostLedger: ledger})
		done <- err
	}()
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		_, err := os.Stat(started)
		return err == nil, "the profile's first sample has not started"
	})
	var out bytes.Buffer
	printHostWorkers(&out, ledger)
	for _, want := range []string{"workers: none of this user's running on this host", "shardpool profile (pid ", "holds GPUs GPU-1111 for its samples"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("preflight's workers while a profile's sample holds a GPU:\n%s\nwant %q in it", out.String(), want)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
