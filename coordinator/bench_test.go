package coordinator_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/testenv"
)

// BenchmarkKVCreate measures one KV Create of a fresh key (what a lease or
// a first shard record costs) through the coordinator's in-process
// connection, from 4 goroutines as 4 slots would: wall time per operation
// and the process's CPU per operation, client and server together. It
// bounds what a short shard can cost: each makes several such writes.
func BenchmarkKVCreate(b *testing.B) {
	for _, mode := range []string{stream.SyncGroup, stream.SyncAlways} {
		b.Run(mode, func(b *testing.B) {
			env := testenv.New(b, testenv.Options{NoWorkers: true, Sync: mode})
			ctx := context.Background()
			kv := env.Buckets().Leases
			var next atomic.Int64
			var wg sync.WaitGroup
			cpu0 := cpuTime()
			b.ResetTimer()
			for range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						i := next.Add(1)
						if i > int64(b.N) {
							return
						}
						if _, err := kv.Create(ctx, fmt.Sprintf("bench.k%d", i), []byte(`{"v":1}`)); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
