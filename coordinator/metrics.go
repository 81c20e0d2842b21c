package coordinator

import (
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardpool/shardpool/stream"
)

// GET /metrics serves what /status says as the Prometheus text exposition
// format (version 0.0.4), for a Prometheus server or any scraper that
// reads it: run states and shard counts, every worker's slots, running
// shards, budget and last report, the work queue per class and the
// store's use. Nothing is counted in memory: every scrape reads the KV
// buckets, the consumers and the store, as `shardpool status` does, so a
// restarted coordinator serves the same figures.
//
// A measurement that is unknown (a worker's probe could not read its
// memory limit) has no sample: an absent series, never a zero, which
// would read as "none free" or "idle". An unlimited one is +Inf.

// runStates are the values of shardpool_run_state's state label.
var runStates = []string{stream.RunPrepared, stream.RunQueued, stream.RunRunning, stream.RunComplete, stream.RunBlocked}

// QueueStats is the work queue of one class: its durable consumer on
// SHARDS.
type QueueStats struct {
	Class       string
	Pending     uint64 // queued, not delivered to any worker
	InFlight    int    // delivered, not yet acknowledged (running or concluding)
	Redelivered int    // delivered more than once, not yet acknowledged
	Cap         int    // the fleet cap (MaxAckPending); <= 0: none
}

// StoreStats is the coordinator's JetStream store: bytes used and the
// limit (0 when unknown), and whether it refuses writes.
type StoreStats struct {
	Used, Limit int64
	Full        bool
}

func (c *Coordinator) serveMetrics(w http.ResponseWriter, r *http.Request) {
	if !c.authorized(w, r) {
		return
	}
	st, queues, err := readStatus(r.Context(), c.js, "")
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	room := c.lookAtStore()
	store := &StoreStats{Used: room.used, Limit: room.limit, Full: c.StoreFull() != ""}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	WriteMetrics(w, st, queues, store)
}

// ReadQueues reads the consumer of every class; a consumer that cannot be
// read is left out.
func ReadQueues(ctx context.Context, js jetstream.JetStream) []QueueStats {
	s, err := js.Stream(ctx, stream.StreamShards)
	if err != nil {
		return nil
	}
	var out []QueueStats
	l := s.ListConsumers(ctx)
	for info := range l.Info() {
		out = append(out, QueueStats{Class: info.Name, Pending: info.NumPending, InFlight: info.NumAckPending,
			Redelivered: info.NumRedelivered, Cap: info.Config.MaxAckPending})
	}
	slices.SortFunc(out, func(a, b QueueStats) int { return strings.Compare(a.Class, b.Class) })
	return out
}

// WriteMetrics writes st, the queues and the store (nil: not known) in
// the Prometheus text exposition format.
func WriteMetrics(w io.Writer, st *Status, queues []QueueStats, store *StoreStats) error {
	var m metricsWriter
	one := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}

	m.family("shardpool_run_state", "gauge", "1 for the run's state (PREPARED, QUEUED, RUNNING, COMPLETE, BLOCKED), 0 for the others.")
	for _, r := range st.Runs {
		for _, s := range runStates {
			m.sample(one(r.State == s), "run", r.Name, "state", s)
		}
	}
	m.family("shardpool_run_shards", "gauge", "Shards of the run in each state (pending, running, validated, failed).")
	for _, r := range st.Runs {
		countSamples(&m, r.Counts, "run", r.Name)
	}
	m.family("shardpool_run_class_shards", "gauge", "Shards of the run's class in each state.")
	for _, r := range st.Runs {
		for _, class := range slices.Sorted(maps.Keys(r.ClassCounts)) {
			countSamples(&m, r.ClassCounts[class], "run", r.Name, "class", class)
		}
	}
	m.family("shardpool_run_submitted_timestamp_seconds", "gauge", "When the run's current generation was submitted (unix seconds).")
	for _, r := range st.Runs {
		if !r.Submitted.IsZero() {
			m.sample(unixSeconds(r.Submitted.UnixNano()), "run", r.Name)
		}
	}
	m.family("shardpool_run_updated_timestamp_seconds", "gauge", "When the run's state was last updated (unix seconds).")
	for _, r := range st.Runs {
		if !r.Updated.IsZero() {
			m.sample(unixSeconds(r.Updated.UnixNano()), "run", r.Name)
		}
	}
	m.family("shardpool_runs_unreadable", "gauge", "Run records that could not be read or decoded (shardpool status names them).")
	m.sample(float64(len(st.Unreadable)))

	m.family("shardpool_worker_up", "gauge", "1 for a worker whose report is current, 0 for one proven gone (its report outlives it until the bucket's TTL).")
	for _, wk := range st.Workers {
		m.sample(one(wk.Gone == ""), "worker", wk.Name, "host", wk.Host)
	}
	m.family("shardpool_worker_connected", "gauge", "1 for a worker with a connection to the coordinator, 0 for one without (killed on another host, or cut off from it); absent where that cannot be told.")
	for _, wk := range st.Workers {
		if yes, known := connected(wk, st.Coordinator); known {
			m.sample(one(yes), "worker", wk.Name, "host", wk.Host)
		}
	}
	m.family("shardpool_worker_last_report_timestamp_seconds", "gauge", "When the worker last reported, by its own clock (unix seconds); workers report every few seconds.")
	for _, wk := range st.Workers {
		m.sample(unixSeconds(wk.Reported.UnixNano()), "worker", wk.Name, "host", wk.Host)
	}
	m.family("shardpool_worker_clock_ahead_seconds", "gauge", "How far the worker's clock is ahead of the coordinator's (negative: behind), where 5 s or more either way; 0 below.")
	for _, wk := range st.Workers {
		m.sample(time.Duration(wk.ClockAhead).Seconds(), "worker", wk.Name, "host", wk.Host)
	}
	m.family("shardpool_worker_auto", "gauge", "1 for a worker that admits by measured headroom (its slots, if any, are caps), 0 for fixed slots.")
	for _, wk := range st.Workers {
		m.sample(one(wk.Auto), "worker", wk.Name, "host", wk.Host)
	}
	m.family("shardpool_worker_slots", "gauge", "Slots of the class the worker is configured with (for a worker that admits by measurement, its caps).")
	for _, wk := range st.Workers {
		for _, class := range slices.Sorted(maps.Keys(wk.Slots)) {
			m.sample(float64(wk.Slots[class]), "worker", wk.Name, "host", wk.Host, "class", class)
		}
	}
	m.family("shardpool_worker_running", "gauge", "Shards of the class whose command runs on the worker.")
	for _, wk := range st.Workers {
		for _, class := range slices.Sorted(maps.Keys(wk.Running)) {
			m.sample(float64(wk.Running[class]), "worker", wk.Name, "host", wk.Host, "class", class)
		}
	}
	m.family("shardpool_worker_awaiting", "gauge", "Of the worker's running slots, those holding a shard that another attempt runs (its message came again), until that attempt ends.")
	for _, wk := range st.Workers {
		m.sample(float64(len(wk.Awaiting)), "worker", wk.Name, "host", wk.Host)
	}
	m.family("shardpool_worker_shards_done_total", "counter", "Shards the worker process validated since it started.")
	for _, wk := range st.Workers {
		m.sample(float64(wk.Done), "worker", wk.Name, "host", wk.Host)
	}
	m.family("shardpool_worker_shards_failed_total", "counter", "Shards the worker process failed since it started: after their last retry, or at once for a reason no retry changes.")
	for _, wk := range st.Workers {
		m.sample(float64(wk.Failed), "worker", wk.Name, "host", wk.Host)
	}
	m.family("shardpool_build_info", "gauge", "1, labelled with the build of shardpool the coordinator runs.")
	if c := st.Coordinator; c != nil && c.Version != "" {
		m.sample(1, "version", c.Version)
	}
	m.family("shardpool_worker_build_info", "gauge", "1, labelled with the build of shardpool the worker runs; absent for workers too old to report one.")
	for _, wk := range st.Workers {
		if wk.Version != "" {
			m.sample(1, "worker", wk.Name, "host", wk.Host, "version", wk.Version)
		}
	}
	m.family("shardpool_worker_failed_in_a_row", "gauge", "Attempts that failed on the worker since it last validated a shard: one that grows while other workers validate points at its host.")
	for _, wk := range st.Workers {
		m.sample(float64(wk.FailedInARow), "worker", wk.Name, "host", wk.Host)
	}
	for _, b := range []struct {
		name, help, key string
		scale           float64
	}{
		{"shardpool_worker_budget_cpus", "CPUs", "cpu", 1000},
		{"shardpool_worker_budget_memory_bytes", "Memory", "memory", 1},
		{"shardpool_worker_budget_gpus", "GPUs", "gpus", 1},
		{"shardpool_worker_budget_vram_bytes", "GPU memory", "vram", 1},
	} {
		m.family(b.name, "gauge", b.help+" the worker's host gives it: kind=\"effective\" after every limit (cgroups, allocation, policy, headroom, others' use), kind=\"hard\" its capacity. No sample where unknown.")
		for _, wk := range st.Workers {
			for _, kind := range []string{"effective", "hard"} {
				key := b.key
				if key == "cpu" && kind == "effective" {
					key = "cpu_millicores"
				}
				if kind == "hard" {
					key += "_hard"
				}
				if v, ok := resourceValue(wk.Headroom, key, b.scale); ok {
					m.sample(v, "worker", wk.Name, "host", wk.Host, "kind", kind)
				}
			}
		}
	}
	m.family("shardpool_worker_scratch_bytes", "gauge", "The worker's scratch file system: kind=\"free\" the room an unprivileged writer has left, kind=\"size\" its size. No sample where unknown.")
	for _, wk := range st.Workers {
		for _, k := range [][2]string{{"free", "scratch"}, {"size", "scratch_hard"}} {
			if v, ok := resourceValue(wk.Headroom, k[1], 1); ok {
				m.sample(v, "worker", wk.Name, "host", wk.Host, "kind", k[0])
			}
		}
	}

	m.family("shardpool_queue_pending", "gauge", "Shards of the class queued and not yet delivered to any worker.")
	for _, q := range queues {
		m.sample(float64(q.Pending), "class", q.Class)
	}
	m.family("shardpool_queue_in_flight", "gauge", "Shards of the class delivered and not yet acknowledged: running, or concluding (commit and records).")
	for _, q := range queues {
		m.sample(float64(q.InFlight), "class", q.Class)
	}
	m.family("shardpool_queue_redelivered", "gauge", "Shards of the class in flight that were delivered more than once.")
	for _, q := range queues {
		m.sample(float64(q.Redelivered), "class", q.Class)
	}
	m.family("shardpool_queue_in_flight_cap", "gauge", "The fleet cap of the class: the most shards in flight across every worker. No sample where there is none.")
	for _, q := range queues {
		if q.Cap > 0 {
			m.sample(float64(q.Cap), "class", q.Class)
		}
	}

	if store != nil {
		m.family("shardpool_store_used_bytes", "gauge", "Bytes the coordinator's JetStream store holds.")
		m.sample(float64(store.Used))
		m.family("shardpool_store_limit_bytes", "gauge", "The store's limit; the coordinator raises it when its file system has room.")
		if store.Limit > 0 {
			m.sample(float64(store.Limit))
		}
		m.family("shardpool_store_full", "gauge", "1 while the store refuses writes: no shard can be leased or recorded.")
		m.sample(one(store.Full))
	}
	return m.flush(w)
}

func countSamples(m *metricsWriter, c stream.Counts, labels ...string) {
	for _, s := range []struct {
		state string
		n     int
	}{{"pending", c.Pending}, {"running", c.Running}, {"validated", c.Validated}, {"failed", c.Failed}} {
		m.sample(float64(s.n), append(slices.Clip(labels), "state", s.state)...)
	}
}

// resourceValue is a worker report's resource in the metric's unit: ok
// false when the report lacks it or it is unknown, +Inf when unlimited.
func resourceValue(h map[string]stream.Resource, key string, scale float64) (float64, bool) {
	r, ok := h[key]
	switch {
	case !ok || r.Unknown != "":
		return 0, false
	case r.Unlimited:
		return math.Inf(1), true
	}
	return float64(r.Value) / scale, true
}

func unixSeconds(ns int64) float64 { return float64(ns) / 1e9 }

// metricsWriter collects families and writes each with its HELP and TYPE
// lines and its samples together, as the format requires. A family with
// no sample is left out.
type metricsWriter struct {
	b       strings.Builder
	name    string
	head    string
	samples int
}

func (m *metricsWriter) family(name, typ, help string) {
	m.name, m.samples = name, 0
	m.head = fmt.Sprintf("# HELP %s %s\n# TYPE %s %s\n", name, escapeHelp(help), name, typ)
}

// sample adds one sample of the current family; labels are name, value
// pairs.
func (m *metricsWriter) sample(v float64, labels ...string) {
	if m.samples == 0 {
		m.b.WriteString(m.head)
	}
	m.samples++
	m.b.WriteString(m.name)
	if len(labels) > 0 {
		m.b.WriteByte('{')
		for i := 0; i+1 < len(labels); i += 2 {
			if i > 0 {
				m.b.WriteByte(',')
			}
			m.b.WriteString(labels[i])
			m.b.WriteString(`="`)
			m.b.WriteString(escapeLabel(labels[i+1]))
			m.b.WriteByte('"')
		}
		m.b.WriteByte('}')
	}
	m.b.WriteByte(' ')
	m.b.WriteString(formatValue(v))
	m.b.WriteByte('\n')
}

func (m *metricsWriter) flush(w io.Writer) error {
	_, err := io.WriteString(w, m.b.String())
	return err
}

func formatValue(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// escapeLabel escapes a label value: backslash, double quote and line
// feed.
var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

func escapeLabel(s string) string { return labelEscaper.Replace(s) }

// escapeHelp escapes a HELP text: backslash and line feed.
var helpEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`)

func escapeHelp(s string) string { return helpEscaper.Replace(s) }
