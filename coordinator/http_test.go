package coordinator_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/testenv"
)

// TestHTTPStatusAsksForTheToken: GET /status serves the status document
// (the one `status --json` prints) to a client with the coordinator's
// token as a bearer token, and 401 with the way to the token to one
// without: a run's status names its paths, inputs and the last line each
// failed shard printed. /metrics asks for it too; /healthz stays open.
func TestHTTPStatusAsksForTheToken(t *testing.T) {
	c, _ := runCoordinator(t, coordinator.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", HTTP: "127.0.0.1:0", Auth: true})
	ctx := context.Background()
	path := testenv.WriteJob(t, testenv.Job{Name: "web", Shards: 2, Command: []string{"true"}})
	spec, man := testenv.LoadJob(t, path)
	if _, err := coordinator.Submit(ctx, c.JetStream(), spec, man, coordinator.SubmitOptions{}); err != nil {
		t.Fatal(err)
	}
	tok, err := coordinator.ReadToken(c.TokenFile())
	if err != nil {
		t.Fatal(err)
	}
	get := func(path, token string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://"+c.HTTPAddr()+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		cl := http.Client{Timeout: 10 * time.Second}
		resp, err := cl.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, token := range []string{"", "0123456789abcdef"} {
		if code, body := get("/status", token); code != http.StatusUnauthorized || !strings.Contains(body, c.TokenFile()) || strings.Contains(body, `"runs"`) {
			t.Fatalf("GET /status with token %q: %d %s, want 401 naming %s and no status", token, code, body, c.TokenFile())
		}
	}
	code, body := get("/status", tok)
	var st coordinator.Status
	if code != http.StatusOK || json.Unmarshal([]byte(body), &st) != nil || len(st.Runs) != 1 || st.Runs[0].Name != "web" || st.Runs[0].Counts.Total != 2 {
		t.Fatalf("GET /status with the token: %d %s, want the run web with 2 shards", code, body)
	}
	if code, body := get("/status/web", tok); code != http.StatusOK || !strings.Contains(body, `"name": "web"`) && !strings.Contains(body, `"name":"web"`) {
		t.Fatalf("GET /status/web: %d %s", code, body)
	}
	if code, _ := get("/status/nosuch", tok); code != http.StatusNotFound {
		t.Fatalf("GET /status/nosuch: %d, want 404", code)
	}
	// /metrics names runs, workers and hosts: the same rule as /status.
	if code, body := get("/metrics", ""); code != http.StatusUnauthorized || strings.Contains(body, "shardpool_run_state") {
		t.Fatalf("GET /metrics without the token: %d %s, want 401 and no metrics", code, body)
	}
	if code, body := get("/metrics", tok); code != http.StatusOK || !strings.Contains(body, `shardpool_run_state{run="web",state="QUEUED"} 1`) {
		t.Fatalf("GET /metrics with the token: %d %s, want the run web QUEUED", code, body)
	}
	if code, body := get("/healthz", ""); code != http.StatusOK || body != "ok\n" {
		t.Fatalf("GET /healthz without the token: %d %q, want ok", code, body)
	}
}
