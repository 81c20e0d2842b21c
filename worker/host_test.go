package worker_test

import (
	"os"
	"strings"
	"testing"

	"github.com/shardpool/shardpool/worker"
)

// TestDefaultNameInASlurmJob: two Slurm jobs on one node (a second
// `shardpool sbatch` for more workers) must not start workers of one
// name, or the second stops at once; outside Slurm the name is the host's.
func TestDefaultNameInASlurmJob(t *testing.T) {
	h, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	host := strings.NewReplacer(".", "-").Replace(h)
	for _, c := range []struct{ job, step, want string }{
		{"", "", host},
		{"4242", "", host + "-job4242"},
		{"4242", "0", host + "-job4242"},
		{"4242", "3", host + "-job4242-3"},
		{"4242", "batch", host + "-job4242-batch"},
	} {
		t.Setenv("SLURM_JOB_ID", c.job)
		t.Setenv("SLURM_STEP_ID", c.step)
		if got := worker.DefaultName(); got != c.want {
			t.Errorf("SLURM_JOB_ID=%q SLURM_STEP_ID=%q: default name %q, want %q", c.job, c.step, got, c.want)
		}
	}
}
