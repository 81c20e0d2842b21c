package coordinator_test

import (
	"bytes"
	"context"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/testenv"
)

// parseMetrics parses an exposition with Prometheus's own text parser
// (strict metric names): what a Prometheus server would accept.
func parseMetrics(t *testing.T, text string) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("Prometheus's parser refuses the exposition: %v\n%s", err, text)
	}
	return fams
}

// value is the one sample of family name whose labels include want
// (name, value pairs); ok false when there is none. It fails t when more
// than one matches.
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, want ...string) (float64, bool) {
	t.Helper()
	f, ok := fams[name]
	if !ok {
		return 0, false
	}
	var found []float64
	for _, m := range f.Metric {
		labels := map[string]string{}
		for _, l := range m.Label {
			labels[l.GetName()] = l.GetValue()
		}
		match := true
		for i := 0; i+1 < len(want); i += 2 {
			if labels[want[i]] != want[i+1] {
				match = false
			}
		}
		if !match {
			continue
		}
		switch {
		case m.Gauge != nil:
			found = append(found, m.Gauge.GetValue())
		case m.Counter != nil:
			found = append(found, m.Counter.GetValue())
		}
	}
	if len(found) > 1 {
		t.Fatalf("%s%v: %d samples, want one", name, want, len(found))
	}
	if len(found) == 0 {
		return 0, false
	}
	return found[0], true
}

func mustValue(t *testing.T, fams map[string]*dto.MetricFamily, name string, want ...string) float64 {
	t.Helper()
	v, ok := value(t, fams, name, want...)
	if !ok {
		t.Fatalf("no sample %s%v", name, want)
	}
	return v
}

// TestMetricsAgreeWithStatus: GET /metrics of a coordinator with a worker
// and a run that ended BLOCKED (one of four shards fails) parses with
// Prometheus's own parser, and its figures are the status document's: the
// run's state and shard counts, per class too, the worker and its slots,
// the empty queue and the store.
func TestMetricsAgreeWithStatus(t *testing.T) {
	env := testenv.New(t, testenv.Options{Slots: map[string]int{"cpu": 2}})
	spec := testenv.WriteJob(t, testenv.Job{Name: "met", Shards: 4, Retries: 0,
		Command: []string{"sh", "-c", `[ "$1" = s0001 ] && exit 3; cp "$2" "$3/"`, "sh", "{id}", "{input}", "{out}"}})
	env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("met", 60*time.Second, stream.RunBlocked)
	rec, err := env.Run("met")
	if err != nil {
		t.Fatal(err)
	}

	// The run's state follows the shard records; the queue settles a moment
	// later, once the worker's last ack or term is in, and the worker's
	// report may come later still.
	var fams map[string]*dto.MetricFamily
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + env.Coord.HTTPAddr() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain; version=0.0.4") {
			t.Fatalf("GET /metrics: %d, Content-Type %q, want 200 and the text format 0.0.4\n%s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
		fams = parseMetrics(t, string(body))
		inFlight, _ := value(t, fams, "shardpool_queue_in_flight", "class", "cpu")
		_, up := fams["shardpool_worker_up"]
		return inFlight == 0 && up, "queue not settled or no worker report yet:\n" + string(body)
	})

	for _, s := range []string{stream.RunPrepared, stream.RunQueued, stream.RunRunning, stream.RunComplete, stream.RunBlocked} {
		want := 0.0
		if s == stream.RunBlocked {
			want = 1
		}
		if got := mustValue(t, fams, "shardpool_run_state", "run", "met", "state", s); got != want {
			t.Errorf("shardpool_run_state{state=%q}: %v, want %v", s, got, want)
		}
	}
	for state, want := range map[string]int{"pending": rec.Counts.Pending, "running": rec.Counts.Running, "validated": rec.Counts.Validated, "failed": rec.Counts.Failed} {
		if got := mustValue(t, fams, "shardpool_run_shards", "run", "met", "state", state); got != float64(want) {
			t.Errorf("shardpool_run_shards{state=%q}: %v, want %d as the run record says", state, got, want)
		}
		if got := mustValue(t, fams, "shardpool_run_class_shards", "run", "met", "class", "cpu", "state", state); got != float64(want) {
			t.Errorf("shardpool_run_class_shards{class=cpu,state=%q}: %v, want %d", state, got, want)
		}
	}
	if rec.Counts.Validated != 3 || rec.Counts.Failed != 1 {
		t.Fatalf("run record counts %+v, want 3 validated and 1 failed", rec.Counts)
	}
	if got := mustValue(t, fams, "shardpool_run_submitted_timestamp_seconds", "run", "met"); math.Abs(got-float64(rec.Submitted.UnixNano())/1e9) > 0.001 {
		t.Errorf("submitted timestamp %v, want %v", got, rec.Submitted)
	}

	st, err := coordinator.ReadStatus(context.Background(), env.JS, "")
	if err != nil || len(st.Workers) != 1 {
		t.Fatalf("status: %d workers (%v), want 1", len(st.Workers), err)
	}
	wk := st.Workers[0]
	if got := mustValue(t, fams, "shardpool_worker_up", "worker", wk.Name, "host", wk.Host); got != 1 {
		t.Errorf("shardpool_worker_up{worker=%q}: %v, want 1", wk.Name, got)
	}
	if got := mustValue(t, fams, "shardpool_worker_slots", "worker", wk.Name, "class", "cpu"); got != 2 {
		t.Errorf("shardpool_worker_slots{class=cpu}: %v, want 2", got)
	}
	if _, ok := value(t, fams, "shardpool_worker_last_report_timestamp_seconds", "worker", wk.Name); !ok {
		t.Error("no last report timestamp for the worker")
	}
	if got, ok := value(t, fams, "shardpool_worker_budget_memory_bytes", "worker", wk.Name, "kind", "effective"); ok && got <= 0 {
		t.Errorf("the worker's memory budget: %v, want more than none or no sample", got)
	}
	if got := mustValue(t, fams, "shardpool_queue_pending", "class", "cpu"); got != 0 {
		t.Errorf("shardpool_queue_pending{class=cpu}: %v, want 0 once the run ended", got)
	}
	if got := mustValue(t, fams, "shardpool_store_used_bytes"); got <= 0 {
		t.Errorf("shardpool_store_used_bytes: %v, want the bytes the store holds", got)
	}
	if got := mustValue(t, fams, "shardpool_store_full"); got != 0 {
		t.Errorf("shardpool_store_full: %v, want 0", got)
	}
}

// TestMetricsLeaveUnknownOut: the exposition of a status document with
// awkward names parses and reads back as written (label values with
// quotes, backslashes and a line feed are escaped); a budget the worker
// could not measure has no sample rather than a zero, an unlimited one is
// +Inf, and a worker proven gone is down.
func TestMetricsLeaveUnknownOut(t *testing.T) {
	odd := "w\"1\\x\ny"
	st := &coordinator.Status{
		Coordinator: &stream.CoordinatorInfo{Host: "h", Version: "v1.2.0"},
		Runs:        []coordinator.RunStatus{{Name: "r", State: stream.RunRunning, Counts: stream.Counts{Total: 5, Pending: 2, Running: 1, Validated: 2}}},
		Workers: []stream.WorkerReport{
			{Name: odd, Host: "h", Slots: map[string]int{"cpu": 4}, Running: map[string]int{"cpu": 3}, Awaiting: []string{"r.a", "r.b"}, Done: 7, Failed: 1, FailedInARow: 6, Reported: time.Unix(1700000000, 0), Version: "v1.1.0", ClockAhead: stream.Seconds(-90 * time.Second),
				Headroom: map[string]stream.Resource{
					"cpu_millicores": {Value: 1500}, "cpu_hard": {Value: 2000},
					"memory": {Unknown: "no cgroup"}, "memory_hard": {Unlimited: true},
					"scratch": {Value: 3 << 30}, "scratch_hard": {Unknown: "statfs: permission denied"},
				}},
			{Name: "gone", Host: "h", Reported: time.Unix(1700000000, 0), Gone: "pid 1 is not running"},
		},
	}
	var b bytes.Buffer
	if err := coordinator.WriteMetrics(&b, st, []coordinator.QueueStats{{Class: "cpu", Pending: 2, InFlight: 1, Cap: 0}}, nil); err != nil {
		t.Fatal(err)
	}
	fams := parseMetrics(t, b.String())
	if got := mustValue(t, fams, "shardpool_worker_budget_cpus", "worker", odd, "kind", "effective"); got != 1.5 {
		t.Errorf("effective CPUs of %q: %v, want 1.5 (labels read back as written)", odd, got)
	}
	if got := mustValue(t, fams, "shardpool_worker_budget_cpus", "worker", odd, "kind", "hard"); got != 2 {
		t.Errorf("hard CPUs: %v, want 2", got)
	}
	if v, ok := value(t, fams, "shardpool_worker_budget_memory_bytes", "worker", odd, "kind", "effective"); ok {
		t.Errorf("an unknown memory budget has the sample %v, want none", v)
	}
	if got := mustValue(t, fams, "shardpool_worker_budget_memory_bytes", "worker", odd, "kind", "hard"); !math.IsInf(got, 1) {
		t.Errorf("an unlimited memory capacity: %v, want +Inf", got)
	}
	if got := mustValue(t, fams, "shardpool_worker_scratch_bytes", "worker", odd, "kind", "free"); got != 3<<30 {
		t.Errorf("free scratch: %v, want 3 GiB", got)
	}
	if v, ok := value(t, fams, "shardpool_worker_scratch_bytes", "worker", odd, "kind", "size"); ok {
		t.Errorf("an unknown scratch size has the sample %v, want none", v)
	}
	if got := mustValue(t, fams, "shardpool_worker_shards_done_total", "worker", odd); got != 7 || fams["shardpool_worker_shards_done_total"].GetType() != dto.MetricType_COUNTER {
		t.Errorf("done: %v (%v), want the counter at 7", got, fams["shardpool_worker_shards_done_total"].GetType())
	}
	if got := mustValue(t, fams, "shardpool_worker_failed_in_a_row", "worker", odd); got != 6 {
		t.Errorf("attempts failed in a row: %v, want 6", got)
	}
	if got := mustValue(t, fams, "shardpool_worker_failed_in_a_row", "worker", "gone"); got != 0 {
		t.Errorf("attempts failed in a row of a worker that failed none: %v, want 0", got)
	}
	if got := mustValue(t, fams, "shardpool_build_info", "version", "v1.2.0"); got != 1 {
		t.Errorf("the coordinator's build: %v, want 1 labelled v1.2.0", got)
	}
	if got := mustValue(t, fams, "shardpool_worker_build_info", "worker", odd, "version", "v1.1.0"); got != 1 {
		t.Errorf("the worker's build: %v, want 1 labelled v1.1.0", got)
	}
	if v, ok := value(t, fams, "shardpool_worker_build_info", "worker", "gone"); ok {
		t.Errorf("a worker that reports no build has the sample %v, want none", v)
	}
	if got := mustValue(t, fams, "shardpool_worker_awaiting", "worker", odd); got != 2 {
		t.Errorf("slots holding a shard another attempt runs: %v, want 2", got)
	}
	if got := mustValue(t, fams, "shardpool_worker_awaiting", "worker", "gone"); got != 0 {
		t.Errorf("slots of a worker that holds none for others: %v, want 0", got)
	}
	if got := mustValue(t, fams, "shardpool_worker_clock_ahead_seconds", "worker", odd); got != -90 {
		t.Errorf("a clock 90 s behind the coordinator's: %v, want -90", got)
	}
	if got := mustValue(t, fams, "shardpool_worker_clock_ahead_seconds", "worker", "gone"); got != 0 {
		t.Errorf("a clock not off: %v, want 0", got)
	}
	if got := mustValue(t, fams, "shardpool_worker_auto", "worker", odd); got != 0 {
		t.Errorf("a worker of fixed slots: auto %v, want 0", got)
	}
	if got := mustValue(t, fams, "shardpool_worker_up", "worker", "gone"); got != 0 {
		t.Errorf("a worker proven gone: up %v, want 0", got)
	}
	if got := mustValue(t, fams, "shardpool_worker_last_report_timestamp_seconds", "worker", "gone"); got != 1700000000 {
		t.Errorf("last report: %v, want 1700000000", got)
	}
	if _, ok := fams["shardpool_queue_in_flight_cap"]; ok {
		t.Error("a class without a fleet cap has a cap sample")
	}
	if _, ok := fams["shardpool_store_used_bytes"]; ok {
		t.Error("an unknown store has a sample")
	}
	if got := mustValue(t, fams, "shardpool_run_shards", "run", "r", "state", "running"); got != 1 {
		t.Errorf("running shards: %v, want 1", got)
	}
}
