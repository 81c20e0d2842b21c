package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/shardpool/shardpool/worker/probe"
)

// drainMargin is what a drain needs after the grace period: SIGKILL what
// remains, record each interrupted attempt and hand it back.
const drainMargin = 2 * time.Second

// graceUnderSlurm keeps a worker's grace within Slurm's KillWait. When
// Slurm ends a job (scancel, preemption, time limit) it SIGTERMs every
// process of the job and SIGKILLs them KillWait later, the worker with its
// children; a worker killed in the middle of its drain records nothing,
// and its shards' attempts are charged once their leases expire.
func graceUnderSlurm(ctx context.Context, grace time.Duration, stderr io.Writer) time.Duration {
	if os.Getenv("SLURM_JOB_ID") == "" {
		return grace
	}
	kw, err := probe.SlurmKillWait(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "slurm: KillWait unknown (%v): --grace %s stays; Slurm's SIGKILL cuts short a drain longer than KillWait\n", err, grace)
		return grace
	}
	limit := max(kw-drainMargin, kw/2)
	if grace <= limit {
		return grace
	}
	fmt.Fprintf(stderr, "slurm: --grace %s shortened to %s: when Slurm ends the job it SIGKILLs every process KillWait (%s) after its SIGTERM, and the drain must hand the interrupted shards back before then\n",
		grace, limit, kw)
	return limit
}
